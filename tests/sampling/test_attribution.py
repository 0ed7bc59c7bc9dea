"""Per-operation attribution: exact on synthetic timelines, and on a real profiled model."""
from __future__ import annotations

import csv
import gzip
import json

import numpy as np
import pytest

from mtbench.sampling.attribution import UNCOVERED, Interval, attribute, cumulative
from mtbench.sampling.sampler import Samples
from mtbench.sampling.sensor import COUNTER, GAUGE, Field
from tests.fake_sysfs import make_tx2
from tests.sampling.test_telemetry import TX2_POWER


def timeline(power_w, t_end=1.0, dt=0.005):
    """Samples of one total rail at `power_w(t)` W and a CPU that is always busy on core 0."""
    t = np.arange(0.0, t_end + dt / 2, dt)
    fields = [Field("VDD_IN_power_mw", GAUGE, "power", "VDD_IN", 1e-3, total=True),
              Field("cpu0_busy_ticks", COUNTER, "cpu_busy", "0"), Field("cpu0_total_ticks", COUNTER, "cpu_total", "0")]
    rows = [[power_w(x) * 1000, x * 100, x * 100] for x in t]
    return Samples(fields, t, rows)


def table(header, rows):
    return {r[0]: dict(zip(header, r)) for r in rows}


def test_known_intervals_times_known_power():
    samples = timeline(lambda t: 10.0)
    ops = [Interval("matmul", 0.1, 0.3), Interval("relu", 0.3, 0.4), Interval("matmul", 0.5, 0.6)]
    header, rows, check = attribute(ops, [(0.1, 0.6)], samples, 5)
    by = table(header, rows)
    assert by["matmul"]["calls"] == 2 and by["matmul"]["total_s"] == pytest.approx(0.3)
    assert by["matmul"]["energy_j"] == pytest.approx(3.0)  # 10 W x 0.3 s
    assert by["relu"]["energy_j"] == pytest.approx(1.0)
    assert by[UNCOVERED]["energy_j"] == pytest.approx(1.0)  # 0.4-0.5 runs no op
    assert by["matmul"]["power_w_VDD_IN"] == pytest.approx(10.0)
    assert by["matmul"]["share_of_step_time"] == pytest.approx(0.6)
    assert by["matmul"]["cpu_util_pct"] == pytest.approx(100.0)
    assert check["rows_energy_j"] == pytest.approx(check["steps_energy_j"]) == pytest.approx(5.0)
    assert check["coverage"] == pytest.approx(0.8)


def test_overlaps_are_not_counted_twice():
    samples = timeline(lambda t: 10.0)
    # two threads: a runs 0.0-0.4, b runs 0.2-0.6; during 0.2-0.4 both share the power
    ops = [Interval("a", 0.0, 0.4), Interval("b", 0.2, 0.6)]
    header, rows, check = attribute(ops, [(0.0, 0.6)], samples, 5)
    by = table(header, rows)
    assert by["a"]["energy_j"] == pytest.approx(2.0 + 1.0)
    assert by["b"]["energy_j"] == pytest.approx(1.0 + 2.0)
    assert check["rows_energy_j"] == pytest.approx(6.0)  # = 10 W x 0.6 s, not 8
    # the power while each ran is still the rail's power, unsplit
    assert by["a"]["power_w_VDD_IN"] == pytest.approx(10.0)


def test_per_operation_energy_of_a_known_waveform():
    """Power 10 + 6 sin(2 pi t / 0.2 s) W, sampled every 5 ms (jittered): each op's energy is the waveform's
    integral over its time (split evenly where two ops overlap), known in closed form."""
    base, amp, period = 10.0, 6.0, 0.2
    rng = np.random.default_rng(1)
    t = np.arange(0.0, 1.0, 0.005) + rng.uniform(0, 0.0005, 200)
    fields = [Field("VDD_IN_power_mw", GAUGE, "power", "VDD_IN", 1e-3, total=True)]
    samples = Samples(fields, t, [[(base + amp * np.sin(2 * np.pi * x / period)) * 1000] for x in t])

    def energy(a, b):
        return base * (b - a) - amp * period / (2 * np.pi) * (np.cos(2 * np.pi * b / period) -
                                                             np.cos(2 * np.pi * a / period))

    ops = [Interval("conv", 0.10, 0.145), Interval("relu", 0.145, 0.152), Interval("conv", 0.30, 0.36),
           Interval("matmul", 0.40, 0.50), Interval("copy", 0.45, 0.55),  # copy overlaps matmul 0.45-0.50
           Interval("relu", 0.61, 0.618)]
    header, rows, check = attribute(ops, [(0.1, 0.7)], samples, 5)
    by = table(header, rows)
    truth = {"conv": energy(0.10, 0.145) + energy(0.30, 0.36), "relu": energy(0.145, 0.152) + energy(0.61, 0.618),
             "matmul": energy(0.40, 0.45) + energy(0.45, 0.50) / 2, "copy": energy(0.50, 0.55) + energy(0.45, 0.50) / 2}
    for name, joules in truth.items():
        assert by[name]["energy_j"] == pytest.approx(joules, rel=0.01), name
    assert check["steps_energy_j"] == pytest.approx(energy(0.1, 0.7), rel=0.005)
    assert by[UNCOVERED]["energy_j"] == pytest.approx(energy(0.1, 0.7) - sum(truth.values()), rel=0.02)


def test_varying_power_is_integrated_exactly():
    samples = timeline(lambda t: 4.0 + 8.0 * t)  # linear ramp: trapezoids are exact
    header, rows, _ = attribute([Interval("x", 0.2, 0.7)], [(0.2, 0.7)], samples, 5)
    truth = 4.0 * 0.5 + 4.0 * (0.7 ** 2 - 0.2 ** 2)
    assert table(header, rows)["x"]["energy_j"] == pytest.approx(truth, rel=1e-9)


def test_cumulative_counter_and_gauge():
    t = np.array([0.0, 1.0, 2.0])
    assert cumulative(t, np.array([0.0, 5.0, 7.0]), np.array([0.5, 1.5]), counter=True) == pytest.approx([2.5, 6.0])
    assert cumulative(t, np.array([2.0, 2.0, 4.0]), np.array([1.0, 2.0]), counter=False) == pytest.approx([2.0, 5.0])


def test_without_power_sensor_energy_is_null():
    t = np.arange(0, 1.0, 0.005)
    samples = Samples([Field("cpu0_busy_ticks", COUNTER, "cpu_busy", "0"),
                       Field("cpu0_total_ticks", COUNTER, "cpu_total", "0")], t, [[x * 50, x * 100] for x in t])
    header, rows, check = attribute([Interval("op", 0.1, 0.5)], [(0.1, 0.5)], samples, 5)
    row = table(header, rows)["op"]
    assert row["energy_j"] is None and check["steps_energy_j"] is None
    assert row["cpu_util_pct"] == pytest.approx(50.0)


@pytest.mark.slow
def test_profiled_model_on_a_tx2_tree(run, tmp_path):
    make_tx2(tmp_path / "tx2", TX2_POWER)
    s = run(["model=resnet50", "batch=2", "warmup=1", "steps=2", "profile=true", "sampler=jetson",
             f"sampler.sysfs_root={tmp_path / 'tx2'}"])
    assert s["success"], s["failure"]
    prof = s["profile"]
    assert "error" not in prof, prof
    # top-level host ops cover most of a CPU step (the rest is Python between ops)
    assert prof["ops_coverage_of_step_time"] > 0.8
    # the profiled steps' median over the unprofiled reference steps' (not a bound on it: with two steps on a busy
    # machine either median can be the slower one, 0.498 once)
    profiled, unprofiled = s["step_time_s"]["median"], prof["unprofiled_step_time_s"]["median"]
    assert profiled > 0 and unprofiled > 0 and prof["overhead_ratio"] == pytest.approx(profiled / unprofiled)
    assert abs(prof["clock_drift_us"]) < 1000
    with open(tmp_path / "job" / "ops.csv") as f:
        rows = list(csv.DictReader(f))
    # VDD_IN draws 9 W: each top-level host op (one thread, no overlap) drew 9 W x its time, and the rows
    # together 9 W x the measured steps' time (truths from the fake board, not from the code under test)
    for r in rows[:8]:
        if r["name"] != UNCOVERED:
            assert float(r["energy_j"]) == pytest.approx(9.0 * float(r["total_s"]), rel=0.02), r
    busy_s = s["step_time_s"]["mean"] * s["measured_steps"]
    assert sum(float(r["energy_j"]) for r in rows) == pytest.approx(9.0 * busy_s, rel=0.02)
    assert any(r["name"] == "ConvolutionBackward0" for r in rows)
    with open(tmp_path / "job" / "layers.csv") as f:
        layers = {r["name"] for r in csv.DictReader(f)}
    assert "conv1 (Conv2d)" in layers and "fc (Linear)" in layers
    with gzip.open(tmp_path / "job" / "trace.json.gz", "rt") as f:
        trace = json.load(f)
    counters = {e["name"] for e in trace["traceEvents"] if e.get("ph") == "C"}
    assert {"power_w", "cpu_util_pct", "gpu_util_pct"} <= counters
    ops = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    power = [e for e in trace["traceEvents"] if e.get("name") == "power_w"]
    # counters sit on the ops' timeline: the samples span the profiled ops
    assert power[0]["ts"] <= min(e["ts"] for e in ops) and power[-1]["ts"] >= max(e["ts"] for e in ops)


def test_a_profiled_jobs_peak_is_its_unprofiled_steps_and_the_profiled_one_is_kept_beside(run, monkeypatch):
    """The profiler's buffers are not training memory (a profiled resnet50 b8 peaked 28 % above an unprofiled run,
    which made a calibration on profiled jobs over-predict every model): the job's peak is read over the unprofiled
    reference steps, the profiled steps' peak goes to profile.mem_peak_bytes."""
    from mtbench.device import peak as peak_module

    reads = []

    class CountingPeak(peak_module.PeakMemory):
        def read(self):
            figures = dict(super().read())
            reads.append(len(reads) + 1)
            figures["mem_peak_bytes"] = 1000 * len(reads)  # 1000 after the reference steps, 2000 after the profiled
            return figures

    monkeypatch.setattr(peak_module, "PeakMemory", CountingPeak)
    s = run(["model=squeezenet", "batch=2", "warmup=0", "steps=2", "profile=true", "device=cpu"])
    assert s["success"], s["failure"]
    assert s["mem_peak_bytes"] == 1000 and s["profile"]["mem_peak_bytes"] == 2000
