"""Power, energy and GPU load against fake hardware whose truth is known."""
from __future__ import annotations

import csv
import math
import sys
import threading
import time

import numpy as np
import pytest

from mtbench.sampling import Sampler, SensorUnavailable, open_sensors
from mtbench.sampling.attribution import Interval, attribute
from mtbench.sampling.jetson import JetsonSensor
from mtbench.sampling.nvml import NvmlSensor
from mtbench.sampling.rapl import RaplSensor
from mtbench.sampling.sampler import Samples, StepMark
from mtbench.sampling.windows import step_rows, summarize
from tests.conftest import mtbench_cli
from tests.fake_jtop import make_jtop_module
from tests.fake_nvml import FakeGpu, NVMLError_GpuIsLost, NVMLError_NoPermission, fake_pynvml
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


def _virtual_samples(sensors, clock, seconds, interval_s=0.005, jitter_s=0.0005, seed=0):
    """Read `sensors` every interval_s (plus up to jitter_s late, as a busy machine does) on a virtual clock
    that the fakes also read: deterministic, and the fakes behave as they would at those instants."""
    rng = np.random.default_rng(seed)
    times = np.arange(0.0, seconds, interval_s) + rng.uniform(0, jitter_s, int(np.ceil(seconds / interval_s)))
    rows = []
    for t in times:
        clock.now = float(t)
        rows.append([v for s in sensors for v in s.read()])
    return Samples([f for s in sensors for f in s.fields()], times, rows)


class _Clock:
    now = 0.0

    def __call__(self):
        return self.now


def test_nvml_fields_and_energy(monkeypatch):
    clock = _Clock()
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(clock=clock))
    sensors, status = open_sensors(["nvml"], {})
    names = [f.name for f in sensors[0].fields()]
    assert names == ["gpu0_util_pct", "gpu0_power_mw", "gpu0_power_avg_mw", "gpu0_energy_mj", "gpu0_mem_used_bytes"]
    # on a virtual clock: a real sampler thread on a loaded CI machine can leave a gap the gap rule refuses
    samples = _virtual_samples(sensors, clock, 12.0)
    # 0.4 s: shorter than 10 updates of the counter and of the instant power (100 ms each), and than 10 of the
    # utilisation's 1 s trailing mean: each figure is null with the sentence, never a smeared number
    short = summarize(samples, [StepMark(0, 0.05, 0.45, False)], 5)
    assert short["energy_j"] is None and short["gpu_util_pct"] is None
    assert "a figure needs a window of 10 updates or more (1000 ms), this one is 400.0 ms" in \
        short["unavailable"]["energy_j"]
    assert "the busy share of the last sample period" in short["unavailable"]["gpu_util_pct"]
    start, end = 0.05, 11.45
    s = summarize(samples, [StepMark(0, start, end, False)], 5)
    assert s["gpu_util_pct"] == {"mean": pytest.approx(75.0), "per_gpu": {"0": pytest.approx(75.0)}}
    energy = s["energy_j"]
    # the counter moves every 100 ms, as NVML documents it (and the samples agree): 11.4 s is 114 of its updates
    assert energy["counter_update_period_s"]["gpu0"] == 0.1
    assert s["resolution"]["gpu0_energy_mj"]["how"] == "documented"
    assert energy["source_by_rail"]["gpu0"] == "counter"
    assert energy["by_rail"]["gpu0"] == pytest.approx(300 * (end - start), rel=0.02)
    # the one GPU there is counts, and the summary says how the total is formed
    assert energy["total_rails"] == ["gpu0"] and "no job_uuids given" in energy["total_note"]


def test_nvml_coarse_counter_steps_and_operations():
    """Issue 8 item 2: NVML's counter moves every 100 ms; 30 ms steps must not get 0 J or 30 J."""
    clock = _Clock()
    nv = fake_pynvml([FakeGpu(busy_w=300.0, idle_w=60.0, busy_from_s=0.0)], clock=clock)
    sys.modules["pynvml"] = nv
    try:
        sensor = NvmlSensor()
    finally:
        del sys.modules["pynvml"]
    samples = _virtual_samples([sensor], clock, 4.0)
    # 30 ms steps back to back from 1.2 s (the 1 s power average has settled) for 2.4 s: 80 steps
    marks = [StepMark(i, 1.2 + 0.03 * i, 1.2 + 0.03 * (i + 1), False) for i in range(80)]
    header, rows = step_rows(marks, samples, 5)
    # a 30 ms step is below what the counter (100 ms) and the instant power (25 ms of every 100 ms) resolve: null,
    # with the short code in the row
    cells = [dict(zip(header, r)) for r in rows]
    assert all(c["energy_j_gpu0"] is None and c["energy_j_null_reason"] == "below_resolution" for c in cells)
    full = summarize(samples, marks, 5)
    assert "this one is 30.0 ms" in full["unavailable"]["steps.energy_j"]
    s = full["energy_j"]
    # the job total (2.4 s, 24 counter updates) is the counter's
    assert s["source_by_rail"]["gpu0"] == "counter"
    assert s["total"] == pytest.approx(300 * 2.4, rel=0.02)
    assert s["counter_update_period_s"]["gpu0"] == pytest.approx(0.1, rel=0.1)
    # operations of 8 ms and 3 ms (a kernel timeline): each gets its power x time
    ops = []
    for m in marks:
        ops += [Interval("conv", m.start_s + 0.002, m.start_s + 0.010), Interval("relu", m.start_s + 0.012,
                                                                              m.start_s + 0.015)]
    oh, orows, check = attribute(ops, [(m.start_s, m.end_s) for m in marks], samples, 5)
    by = {r[0]: dict(zip(oh, r)) for r in orows}
    # ... and so is an 8 ms or 3 ms operation: null, with the code and the one sentence
    for name in ("conv", "relu"):
        assert by[name]["energy_j"] is None and by[name]["null_reason"] == "below_resolution"
    assert "NVML_FI_DEV_POWER_INSTANT" in check["below_resolution"]["gpu0"] and check["rows_energy_j"] is None


def _two_gpus():
    return [FakeGpu(uuid="GPU-aaaa1111-0000-0000-0000-000000000000", busy_w=300.0, util_pct=90),
            FakeGpu(uuid="GPU-bbbb2222-0000-0000-0000-000000000000", busy_w=100.0, util_pct=10)]


def _two_gpu_summary(monkeypatch, **options):
    clock = _Clock()
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(_two_gpus(), clock=clock))
    sensors, status = open_sensors(["nvml"], {"nvml": options})
    samples = _virtual_samples(sensors, clock, 12.5)
    # 10 s: the utilisation's 1 s trailing mean resolves it
    return summarize(samples, [StepMark(0, 1.2, 11.2, False)], 5)


def test_nvml_counts_only_the_jobs_gpu(monkeypatch):
    """Issue 8 item 1: a job on the second of two GPUs (torch's uuid has no "GPU-" prefix)."""
    s = _two_gpu_summary(monkeypatch, job_uuids=["BBBB2222-0000-0000-0000-000000000000"], other_gpus=True)
    energy = s["energy_j"]
    assert energy["total_rails"] == ["gpu1"]
    assert energy["total"] == pytest.approx(1000.0, rel=0.02)  # 100 W x 10 s, not 400 W
    assert energy["by_rail"]["gpu0"] == pytest.approx(3000.0, rel=0.02)  # recorded beside it
    assert "gpu0" in energy["total_note"] and "not added" in energy["total_note"]
    assert s["gpu_util_pct"]["mean"] == pytest.approx(10.0)
    assert s["gpu_util_pct"]["per_gpu"] == {"0": pytest.approx(90.0), "1": pytest.approx(10.0)}


def test_nvml_without_job_uuids_counts_every_gpu_and_says_so(monkeypatch):
    s = _two_gpu_summary(monkeypatch)
    assert s["energy_j"]["total"] == pytest.approx(4000.0, rel=0.02)
    assert "every GPU NVML sees counts (2)" in s["energy_j"]["total_note"]
    assert s["gpu_util_pct"]["mean"] == pytest.approx(50.0)


def test_nvml_no_gpu_matches_job_uuids(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(_two_gpus()))
    with pytest.raises(SensorUnavailable, match="no GPU NVML sees has a UUID in job_uuids .cccc3333.*other_gpus"):
        open_sensors(["nvml"], {"nvml": {"job_uuids": ["cccc3333-0000-0000-0000-000000000000"]}})
    s = _two_gpu_summary(monkeypatch, job_uuids=["cccc3333-0000-0000-0000-000000000000"], other_gpus=True)
    assert s["energy_j"]["total"] is None and s["energy_j"]["by_rail"]["gpu0"] is not None
    assert s["gpu_util_pct"]["mean"] is None
    for key in ("energy_j.total", "gpu_util_pct.mean"):
        assert "no GPU NVML sees has a UUID in job_uuids (cccc3333" in s["unavailable"][key], s["unavailable"]


@pytest.mark.parametrize("error", [NVMLError_NoPermission, NVMLError_GpuIsLost])
def test_nvml_handle_error_makes_the_sensor_unavailable(monkeypatch, error):
    """Issue 8 item 11: nvmlDeviceGetHandleByIndex raising must not crash sampler=auto."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([FakeGpu(), FakeGpu(handle_error=error)]))
    _, status = open_sensors(["auto"], {"procfs": {}, "jetson": {"sysfs_root": "/nonexistent"},
                                        "rapl": {"sysfs_root": "/nonexistent"}})
    nvml = {s["name"]: s for s in status}["nvml"]
    assert not nvml["available"] and "GPU 1" in nvml["reason"] and error.text in nvml["reason"]
    with pytest.raises(SensorUnavailable, match=error.text):
        open_sensors(["nvml"], {})


def test_nvml_without_energy_counter_integrates_power(monkeypatch):
    clock = _Clock()
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(energy_supported=False, clock=clock))
    sensors, _ = open_sensors(["nvml"], {})
    assert "gpu0_energy_mj" not in [f.name for f in sensors[0].fields()]
    samples, start, end = _virtual_samples(sensors, clock, 3.0), 0.05, 2.95
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
    monkeypatch.setitem(sys.modules, "jtop", make_jtop_module(service_running=False))
    with pytest.raises(SensorUnavailable, match="jtop.service is not active"):
        open_sensors(["jtop"], {})


@pytest.mark.parametrize("version", [4, 3])
def test_jtop_never_blocks_the_sampler(monkeypatch, version):
    """Issue 8 item 3: jtop's ok() blocks until its next refresh (2 Hz); procfs must keep its 5 ms.
    Issue 27 item 11: jetson-stats 3.x rails carry `cur`/`avg`, not `power`."""
    # an earlier test's real jtop client (jetson-stats installed, its service absent) left a thread that loads the
    # board's libraries (imports OpenCV, runs dpkg): it holds the GIL for long stretches, so let it end first
    for thread in threading.enumerate():
        target = getattr(thread, "_target", None)  # Python < 3.10 names it "Thread-N", without its target's name
        if "_load_jetson_libraries" in thread.name or getattr(target, "__name__", "") == "_load_jetson_libraries":
            thread.join(timeout=60)
    module = make_jtop_module(version=version)
    monkeypatch.setitem(sys.modules, "jtop", module)
    sensors, _ = open_sensors(["procfs", "jtop"], {"jtop": {"interval_s": 0.5}})
    sampler = Sampler(sensors, interval_ms=5).start()
    time.sleep(2.2)
    samples = sampler.stop()
    for sensor in sensors:
        sensor.close()
    span = samples.time_s[-1] - samples.time_s[0]
    procfs_valid = int((~np.isnan(samples.columns["cpu0_busy_ticks"])).sum())
    # a blocking ok() would leave one sample per 0.5 s refresh (about 1 % of them) and 0.5 s holes; a loaded machine
    # delays a few of the thread's wake-ups (437 of 442 beside two busy loops), which is not what this checks
    assert procfs_valid >= 0.8 * (span / 0.005 + 1), (procfs_valid, span)
    assert float(np.max(np.diff(samples.time_s))) < 0.25, float(np.max(np.diff(samples.time_s)))
    assert module.jtop.instances[-1].ok_calls == 0
    jtop_times = samples.time_s[~np.isnan(samples.columns["jtop_VDD_IN_power_mw"])]
    assert len(jtop_times) >= 4  # one per refresh
    start, end = float(jtop_times[0]), float(jtop_times[-1])
    marks = [StepMark(0, start, (start + end) / 2, False), StepMark(1, (start + end) / 2, end, False)]
    s = summarize(samples, marks, 5)
    assert s["power_w"]["VDD_IN"] == pytest.approx(7.0)
    assert s["energy_j"]["total"] == pytest.approx(7.0 * (end - start), rel=0.01)
    assert s["gpu_util_pct"]["mean"] == pytest.approx(40.0)
    assert "power_w" not in s["unavailable"] and "energy_j" not in s["unavailable"]


def test_rapl_psys_is_the_total_alone(tmp_path):
    """Issue 8 item 5: psys (the platform) contains the package: it is the total, never added to it."""
    files = make_rapl(tmp_path, {"intel-rapl:0": ("package-0", 0, 10**12), "intel-rapl:0:0": ("core", 0, 10**12),
                                 "intel-rapl:0:1": ("uncore", 0, 10**12), "intel-rapl:0:2": ("dram", 0, 10**12),
                                 "intel-rapl:1": ("psys", 0, 10**12)})
    sensor = RaplSensor(str(tmp_path))
    totals = {f.key: f.total for f in sensor.fields()}
    assert totals == {"rapl_0_package-0": False, "rapl_0_0_core": False, "rapl_0_1_uncore": False,
                      "rapl_0_2_dram": False, "rapl_1_psys": True}
    # 1 s at package 15 W (core 10 W inside it), DRAM 2 W, platform 25 W
    t = np.arange(0.0, 1.001, 0.1)
    rows = [sensor.read()]
    for k in range(1, len(t)):
        for zone, watts in (("intel-rapl:0", 15), ("intel-rapl:0:0", 10), ("intel-rapl:0:1", 1),
                            ("intel-rapl:0:2", 2), ("intel-rapl:1", 25)):
            write_value(files[zone], watts * 0.1e6 * k)
        rows.append(sensor.read())
    s = summarize(Samples(sensor.fields(), t, rows), [StepMark(0, 0.0, 1.0, False)], 100)
    assert s["energy_j"]["total"] == pytest.approx(25.0)
    assert s["energy_j"]["total_rails"] == ["rapl_1_psys"]


@pytest.mark.slow
def test_missing_sysfs_root_is_one_line_and_exit_2(tmp_path):
    proc = mtbench_cli("model=squeezenet", "batch=2", "device=cpu", "sampler=jetson",
                       f"sampler.sysfs_root={tmp_path / 'nowhere'}", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "jetson" in lines[0] and "nowhere" in lines[0], proc.stderr
