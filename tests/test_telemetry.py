"""Power, energy and GPU load against fake hardware whose truth is known."""
from __future__ import annotations

import csv
import math
import sys
import threading
import time
import types

import numpy as np
import pytest

from mtbench.sampling import Sampler, SensorUnavailable, open_sensors
from mtbench.sampling.jetson import JetsonSensor
from mtbench.sampling.rapl import RaplSensor
from mtbench.sampling.sampler import StepMark
from mtbench.sampling.windows import summarize
from tests.conftest import mtbench_cli
from tests.fake_sysfs import make_orin, make_rapl, make_tx2, write_value

TX2_POWER = {"VDD_IN": 9000, "VDD_SYS_GPU": 3500, "VDD_SYS_CPU": 1500, "VDD_SYS_SOC": 900, "VDD_SYS_DDR": 700,
             "VDD_4V0_WIFI": 100}
ORIN = {"VDD_IN": (5000, 1400), "VDD_CPU_GPU_CV": (5000, 600), "VDD_SOC": (5000, 300)}  # mV, mA
JOB = ["model=squeezenet", "batch=2", "warmup=1", "steps=4"]


def _check_constant_rails(summary, watts):
    assert set(summary["power_w"]) == set(watts)
    busy = summary["step_time_s"]["mean"] * summary["measured_steps"]
    for rail, w in watts.items():
        assert summary["power_w"][rail] == pytest.approx(w, rel=0.01)
        # a rail of constant power P over the measured steps: E = P x time within 1 %
        assert summary["energy_j"]["by_rail"][rail] == pytest.approx(w * busy, rel=0.01)


def test_tx2_rails_constant_power(run, tmp_path):
    make_tx2(tmp_path / "tx2", TX2_POWER, gpu_load_permille=640)
    s = run(JOB + ["sampler=jetson", f"sampler.sysfs_root={tmp_path / 'tx2'}"])
    assert s["success"], s["failure"]
    _check_constant_rails(s, {k: v / 1000 for k, v in TX2_POWER.items()})
    energy = s["energy_j"]
    # VDD_IN is the module's input: the total is its energy alone, the sub-rails are not added on top
    assert energy["total_rails"] == ["VDD_IN"]
    assert energy["total"] == pytest.approx(energy["by_rail"]["VDD_IN"])
    assert energy["per_step_mean"] == pytest.approx(energy["total"] / 4)
    assert s["gpu_util_pct"]["mean"] == pytest.approx(64.0)
    assert "power_w" not in s["unavailable"]
    with open(tmp_path / "job" / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[-1]["energy_j_VDD_IN"]) == pytest.approx(9.0 * float(rows[-1]["duration_s"]), rel=0.01)
    assert float(rows[-1]["gpu_util_pct"]) == pytest.approx(64.0)


def test_orin_rails_constant_power(run, tmp_path):
    make_orin(tmp_path / "orin", ORIN, gpu_load_permille=250)
    s = run(JOB + ["sampler=jetson", f"sampler.sysfs_root={tmp_path / 'orin'}"])
    assert s["success"], s["failure"]
    # power = V x I; the "NC" channel and the sum-of-shunts channel are skipped
    _check_constant_rails(s, {k: mv * ma / 1e6 for k, (mv, ma) in ORIN.items()})
    assert s["gpu_util_pct"]["mean"] == pytest.approx(25.0)
    assert s["energy_j"]["total_rails"] == ["VDD_IN"]


def _run_sampler_with(sensor, duration_s, writer=None):
    """Sample for duration_s while `writer(stop_event)` runs in a thread; returns (samples, start, end)."""
    stop = threading.Event()
    thread = threading.Thread(target=writer, args=(stop,), daemon=True) if writer else None
    sampler = Sampler([sensor], interval_ms=5)
    if thread:
        thread.start()
    time.sleep(0.05)
    sampler.start()
    time.sleep(0.05)
    start = time.monotonic()
    time.sleep(duration_s)
    end = time.monotonic()
    time.sleep(0.05)
    samples = sampler.stop()
    stop.set()
    if thread:
        thread.join()
    return samples, start, end


def test_waveform_energy_within_2_percent(tmp_path):
    files = make_tx2(tmp_path, TX2_POWER)
    base, amp, period = 5000.0, 3000.0, 0.25  # mW, mW, s
    t0 = time.monotonic()
    power = lambda t: base + amp * math.sin(2 * math.pi * (t - t0) / period)  # noqa: E731

    def writer(stop):
        while not stop.is_set():
            write_value(files["VDD_IN"], power(time.monotonic()))
            time.sleep(0.0005)

    sensor = JetsonSensor(str(tmp_path))
    samples, start, end = _run_sampler_with(sensor, 1.0, writer)
    marks = [StepMark(0, start, end, False)]
    energy = summarize(samples, marks, 5)["energy_j"]["by_rail"]["VDD_IN"]
    # analytic integral of base + amp sin(2 pi (t - t0) / T) over [start, end], in J
    cos = lambda t: math.cos(2 * math.pi * (t - t0) / period)  # noqa: E731
    truth = (base * (end - start) - amp * period / (2 * math.pi) * (cos(end) - cos(start))) / 1000
    assert energy == pytest.approx(truth, rel=0.02)
    # and the constant rails beside it are still exact
    assert summarize(samples, marks, 5)["energy_j"]["by_rail"]["VDD_SYS_GPU"] == pytest.approx(3.5 * (end - start), rel=0.01)


def test_a_rail_that_vanishes_leaves_gaps_not_zeros(tmp_path):
    files = make_tx2(tmp_path, TX2_POWER)

    def writer(stop):
        time.sleep(0.3)
        files["VDD_SYS_GPU"].unlink()

    sensor = JetsonSensor(str(tmp_path))
    samples, start, end = _run_sampler_with(sensor, 0.6, writer)
    gpu = samples.columns["VDD_SYS_GPU_power_mw"]
    assert np.isnan(gpu[-5:]).all() and (gpu[:5] == 3500).all()  # nulls after it vanished, never 0
    assert not np.isnan(samples.columns["VDD_IN_power_mw"]).any()
    early = StepMark(0, start, start + 0.1, False)
    late = StepMark(1, end - 0.1, end, False)
    assert summarize(samples, [early], 5)["energy_j"]["by_rail"]["VDD_SYS_GPU"] == pytest.approx(0.35, rel=0.01)
    both = summarize(samples, [early, late], 5)["energy_j"]
    assert both["by_rail"]["VDD_SYS_GPU"] is None  # unknown over the whole run, not understated
    assert both["by_rail"]["VDD_IN"] == pytest.approx(9.0 * 0.2, rel=0.01)


def test_rapl_counter_wraps(tmp_path):
    max_range = 262_143_328_850
    files = make_rapl(tmp_path, {"intel-rapl:0": ("package-0", max_range - 1_000_000, max_range),
                                 "intel-rapl:0:0": ("core", 10, max_range),
                                 "intel-rapl:0:2": ("dram", 10, max_range)})
    sensor = RaplSensor(str(tmp_path))
    first = sensor.read()[0]
    write_value(files["intel-rapl:0"], 2_000_000)  # wrapped: 1 J to the top, 2 J past zero
    second = sensor.read()[0]
    assert second - first == pytest.approx(3_000_001)
    assert [f.total for f in sensor.fields()] == [True, False, True]  # core lies inside the package


def test_rapl_energy_per_window(tmp_path):
    files = make_rapl(tmp_path, {"intel-rapl:0": ("package-0", 0, 10**12)})
    t0 = time.monotonic()

    def writer(stop):  # 20 W: 20e6 uJ per second
        while not stop.is_set():
            write_value(files["intel-rapl:0"], (time.monotonic() - t0) * 20e6)
            time.sleep(0.001)

    samples, start, end = _run_sampler_with(RaplSensor(str(tmp_path)), 0.5, writer)
    s = summarize(samples, [StepMark(0, start, end, False)], 5)
    rail = "rapl_0_package-0"
    assert s["energy_j"]["source_by_rail"][rail] == "counter"
    assert s["power_w"][rail] == pytest.approx(20.0, rel=0.02)


def test_rapl_unreadable_gives_the_reason(tmp_path):
    with pytest.raises(SensorUnavailable, match="no RAPL zones"):
        RaplSensor(str(tmp_path))


class _NVMLError(Exception):
    pass


def fake_pynvml(energy_supported=True, everything_unsupported=False):
    """A stand-in for nvidia-ml-py's pynvml: one GPU at 300 W, 75 % busy, energy rising 300 J/s."""
    nv = types.ModuleType("pynvml")
    nv.NVMLError = _NVMLError
    t0 = time.monotonic()

    def unsupported(*_):
        raise _NVMLError("Not Supported")

    nv.nvmlInit = lambda: None
    nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: 1
    nv.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    if everything_unsupported:
        nv.nvmlDeviceGetUtilizationRates = nv.nvmlDeviceGetPowerUsage = unsupported
        nv.nvmlDeviceGetTotalEnergyConsumption = nv.nvmlDeviceGetMemoryInfo = unsupported
        return nv
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=75, memory=30)
    nv.nvmlDeviceGetPowerUsage = lambda h: 300_000  # mW
    nv.nvmlDeviceGetTotalEnergyConsumption = (
        (lambda h: int((time.monotonic() - t0) * 300_000)) if energy_supported else unsupported)  # mJ
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=2**30, total=2**34)
    return nv


def test_nvml_fields_and_energy(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    sensors, status = open_sensors(["nvml"], {})
    names = [f.name for f in sensors[0].fields()]
    assert names == ["gpu0_util_pct", "gpu0_power_mw", "gpu0_energy_mj", "gpu0_mem_used_bytes"]
    samples, start, end = _run_sampler_with(sensors[0], 0.4)
    s = summarize(samples, [StepMark(0, start, end, False)], 5)
    assert s["gpu_util_pct"] == {"mean": 75.0, "per_gpu": {"0": 75.0}}
    energy = s["energy_j"]
    # the energy counter's delta is used, and the power integral is kept beside it
    assert energy["source_by_rail"]["gpu0"] == "counter"
    assert energy["by_rail"]["gpu0"] == pytest.approx(300 * (end - start), rel=0.02)
    assert energy["by_rail_from_power"]["gpu0"] == pytest.approx(300 * (end - start), rel=0.01)


def test_nvml_without_energy_counter_integrates_power(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(energy_supported=False))
    sensors, _ = open_sensors(["nvml"], {})
    assert "gpu0_energy_mj" not in [f.name for f in sensors[0].fields()]
    samples, start, end = _run_sampler_with(sensors[0], 0.3)
    energy = summarize(samples, [StepMark(0, start, end, False)], 5)["energy_j"]
    assert energy["source_by_rail"]["gpu0"] == "power_integral"
    assert energy["by_rail"]["gpu0"] == pytest.approx(300 * (end - start), rel=0.01)


def test_nvml_on_jetson_is_unavailable_with_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(everything_unsupported=True))
    _, status = open_sensors(["auto"], {"procfs": {}, "jetson": {"sysfs_root": "/nonexistent"},
                                        "rapl": {"sysfs_root": "/nonexistent"}})
    by_name = {s["name"]: s for s in status}
    assert by_name["procfs"]["available"]
    assert not by_name["nvml"]["available"] and "NOT_SUPPORTED" in by_name["nvml"]["reason"]
    assert not by_name["jetson"]["available"] and "/nonexistent" in by_name["jetson"]["reason"]


def test_jtop_without_service(monkeypatch):
    jtop_mod = types.ModuleType("jtop")

    class JtopException(Exception):
        pass

    class jtop:  # noqa: N801 - the real class's name
        def __init__(self, interval=0.5):
            pass

        def start(self):
            raise JtopException("The jtop.service is not active. Please run: sudo systemctl restart jtop.service")

    jtop_mod.jtop, jtop_mod.JtopException = jtop, JtopException
    monkeypatch.setitem(sys.modules, "jtop", jtop_mod)
    with pytest.raises(SensorUnavailable, match="jtop.service is not active"):
        open_sensors(["jtop"], {})


def test_missing_sysfs_root_is_one_line_and_exit_2(tmp_path):
    proc = mtbench_cli("model=squeezenet", "batch=2", "device=cpu", "sampler=jetson",
                       f"sampler.sysfs_root={tmp_path / 'nowhere'}", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "jetson" in lines[0] and "nowhere" in lines[0], proc.stderr
