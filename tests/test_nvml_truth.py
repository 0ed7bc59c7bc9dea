"""NVML as the driver answers on Hopper-class GPUs: instantaneous vs 1 s averaged power, the job's GPU only,
and MIG instances (issue 27 items 1-3)."""
from __future__ import annotations

import csv
import sys

import numpy as np
import pytest

from mtbench.sampling import SensorUnavailable, open_sensors
from mtbench.sampling.attribution import Interval, attribute
from mtbench.sampling.sampler import Samples, StepMark
from mtbench.sampling.windows import step_rows, summarize
from tests.fake_nvml import FakeGpu, fake_pynvml

HALF_S = 0.04  # the square wave: 300 W for 40 ms, 100 W for 40 ms


def square_wave(t: float) -> float:
    return 300.0 if (t // HALF_S) % 2 == 0 else 100.0


class _Clock:
    now = 0.0

    def __call__(self):
        return self.now


def _sampled(monkeypatch, seconds=3.0, options=None, gpus=None, **fake):
    """A sensor over a virtual clock that the fake reads too: deterministic, 5 ms with up to 0.5 ms late."""
    clock = _Clock()
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(gpus or [FakeGpu(power_w=square_wave)], clock=clock,
                                                          **fake))
    sensors, status = open_sensors(["nvml"], {"nvml": options or {}})
    rng = np.random.default_rng(0)
    times = np.arange(0.0, seconds, 0.005) + rng.uniform(0, 0.0005, int(np.ceil(seconds / 0.005)))
    rows = []
    for t in times:
        clock.now = float(t)
        rows.append([v for s in sensors for v in s.read()])
    return Samples([f for s in sensors for f in s.fields()], times, rows), status


def _wave_steps(first=1.2, n=40):
    """Steps that follow the wave: a heavy one (300 W, 12 J) then a light one (100 W, 4 J)."""
    return [StepMark(i, first + HALF_S * i, first + HALF_S * (i + 1), False) for i in range(n)]


def test_square_wave_per_step_energy_from_instant_power(monkeypatch):
    samples, _ = _sampled(monkeypatch)
    names = [f.name for f in samples.fields]
    assert "gpu0_power_mw" in names and "gpu0_power_avg_mw" in names
    # the averaged reading is a flat ~200 W: integrating it would give 8 J to every step
    avg = samples.columns["gpu0_power_avg_mw"][samples.time_s > 1.2]
    assert np.nanmax(avg) - np.nanmin(avg) < 10000  # mW
    marks = _wave_steps()
    header, rows = step_rows(marks, samples, 5)
    col = header.index("energy_j_gpu0")
    for m, row in zip(marks, rows):
        truth = square_wave(m.start_s + 1e-6) * HALF_S
        assert row[col] == pytest.approx(truth, rel=0.05), (m.index, row[col], truth)
    s = summarize(samples, marks, 5)["energy_j"]
    assert s["power_update_period_s"]["gpu0"] == pytest.approx(0.01, rel=0.2)  # learned from the samples
    assert s["total"] == pytest.approx(200 * HALF_S * 40, rel=0.02)
    # per operation: 10 ms inside each step, power while it ran
    ops = [Interval("op", m.start_s + 0.015, m.start_s + 0.025) for m in marks]
    oh, orows, _ = attribute(ops, [(m.start_s, m.end_s) for m in marks], samples, 5)
    op = dict(zip(oh, [r for r in orows if r[0] == "op"][0]))
    assert op["energy_j"] == pytest.approx(20 * (300 + 100) * 0.010, rel=0.05)


def test_without_instant_power_each_step_says_why_it_is_null(monkeypatch, tmp_path):
    samples, _ = _sampled(monkeypatch, gpus=[FakeGpu(power_w=square_wave, instant_supported=False)])
    names = [f.name for f in samples.fields]
    assert "gpu0_power_mw" not in names and "gpu0_power_avg_mw" in names
    marks = _wave_steps()
    header, rows = step_rows(marks, samples, 5)
    for row in rows:
        cells = dict(zip(header, row))
        assert cells["energy_j_gpu0"] is None and cells["energy_j_total"] is None
        reason = cells["energy_j_null_reason"]
        assert "updates every 100 ms" in reason and "gpu0_power_avg_mw" in reason and "1 s" in reason, reason
    s = summarize(samples, marks[:4], 5)
    assert s["energy_j"] is None and "NVML_FI_DEV_POWER_INSTANT" in s["unavailable"]["energy_j"]
    # over the whole job (1.6 s = 16 counter updates) the counter resolves the total
    s = summarize(samples, marks, 5)
    assert s["energy_j"]["source_by_rail"]["gpu0"] == "counter"
    assert s["energy_j"]["total"] == pytest.approx(200 * HALF_S * 40, rel=0.1)
    # per operation: the coarse counter cannot split them, and the check says why
    ops = [Interval("op", m.start_s + 0.015, m.start_s + 0.025) for m in marks]
    oh, orows, check = attribute(ops, [(m.start_s, m.end_s) for m in marks], samples, 5)
    assert dict(zip(oh, orows[0]))["energy_j"] is None
    assert "gpu0_power_avg_mw" in check["energy_unavailable"]["gpu0"]


def test_volta_power_usage_is_instantaneous(monkeypatch):
    """Before Ampere (and on GA100) nvmlDeviceGetPowerUsage is the power now: it is the integrated gauge."""
    samples, _ = _sampled(monkeypatch, seconds=0.5, gpus=[FakeGpu(architecture=5, name="Tesla V100-SXM2-16GB",
                                                                  instant_supported=False)])
    fields = {f.name: f.group for f in samples.fields}
    assert fields["gpu0_power_mw"] == "power" and "gpu0_power_avg_mw" not in fields


def _two():
    return [FakeGpu(uuid="GPU-aaaa1111-0000-0000-0000-000000000000", busy_w=300.0),
            FakeGpu(uuid="GPU-bbbb2222-0000-0000-0000-000000000000", busy_w=100.0)]


def test_only_the_jobs_gpu_is_read_by_default(monkeypatch):
    samples, status = _sampled(monkeypatch, seconds=0.05, gpus=_two(),
                               options={"job_uuids": ["bbbb2222-0000-0000-0000-000000000000"]})
    assert {f.name.split("_")[0] for f in samples.fields} == {"gpu1"}, [f.name for f in samples.fields]
    samples, _ = _sampled(monkeypatch, seconds=0.05, gpus=_two(), options={
        "job_uuids": ["bbbb2222-0000-0000-0000-000000000000"], "other_gpus": True})
    assert {f.name.split("_")[0] for f in samples.fields} == {"gpu0", "gpu1"}


MIG_UUIDS = ["MIG-1111aaaa-0000-0000-0000-000000000000", "MIG-2222bbbb-0000-0000-0000-000000000000"]


def test_mig_instance_is_matched_and_its_power_is_null_with_the_reason(monkeypatch):
    gpus = [FakeGpu(uuid="GPU-aaaa1111-0000-0000-0000-000000000000", mig=MIG_UUIDS), _two()[1]]
    # torch's UUID of a MIG device is the instance's, without NVML's prefix
    samples, status = _sampled(monkeypatch, seconds=2.0, gpus=gpus,
                               options={"job_uuids": ["2222bbbb-0000-0000-0000-000000000000"]})
    names = [f.name for f in samples.fields]
    assert "gpu0_mig1_mem_used_bytes" in names and not any(n.startswith("gpu1") for n in names)
    assert "gpu0_util_pct" not in names  # NVML answers NOT_SUPPORTED for utilization under MIG
    assert all(not f.job for f in samples.fields if f.name.startswith("gpu0_") and "mig" not in f.name)
    s = summarize(samples, [StepMark(0, 1.2, 1.8, False)], 5)
    assert s["energy_j"]["total"] is None and s["energy_j"]["by_rail"]["gpu0"] is not None  # recorded
    assert "no per-instance power" in s["unavailable"]["energy_j.total"]


def test_mig_instance_not_the_jobs_is_not_matched(monkeypatch):
    gpus = [FakeGpu(uuid="GPU-aaaa1111-0000-0000-0000-000000000000", mig=MIG_UUIDS)]
    with pytest.raises(SensorUnavailable, match="no GPU NVML sees"):
        _sampled(monkeypatch, seconds=0.05, gpus=gpus, options={"job_uuids": ["MIG-9999"]})
