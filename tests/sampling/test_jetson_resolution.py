"""Jetson rails as their drivers refresh them (issue 47): the L4T 32 ina3221x driver's continuous mode (a new
average once per averaging cycle, the cycle read from the device tree) and triggered mode (every read converts
anew and blocks for it), and the hwmon driver's update_interval with a monitor that refreshes every 100 ms."""
from __future__ import annotations

import os

import numpy as np
import pytest

from mtbench.sampling import open_sensors
from mtbench.sampling.jetson import JetsonSensor, ina3221_cycle_us
from mtbench.sampling.sampler import Sampler, StepMark
from mtbench.sampling.sysfs import AttrFile
from mtbench.sampling.windows import step_rows, summarize
from tests.fake_sysfs import Refresher, TriggeredChip, make_orin, make_tx2, mean_of

TX2_POWER = {"VDD_IN": 6000.0, "VDD_SYS_GPU": 1500.0, "VDD_SYS_CPU": 1200.0}


class _Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def _drive(sampler: Sampler, clock: _Clock, seconds: float, before=None, interval_s: float = 0.005):
    """The sampler's loop on a virtual clock: a sample every `interval_s` (up to 0.5 ms late), a slot skipped
    where the reads overran it, as Sampler._run does."""
    rng = np.random.default_rng(0)
    next_t = 0.0
    while next_t < seconds:
        clock.now = max(clock.now, next_t + float(rng.uniform(0, 0.0005)))
        if before is not None:
            before(clock.now)
        sampler._sample()
        next_t += interval_s
        while clock.now >= next_t:
            sampler.dropped += 1
            next_t += interval_s
    return sampler.samples()


def square(high: float, low: float, half_s: float, shift_s: float = 0.0):
    return lambda t: high if ((t - shift_s) // half_s) % 2 == 0 else low


def _steps(first: float, n: int, length: float):
    return [StepMark(i, first + length * i, first + length * (i + 1), False) for i in range(n)]


def test_a_tx2_in_continuous_mode_resolves_its_averaging_cycle_from_the_device_tree(tmp_path):
    """running_mode 1 and ti,continuous-config 0x7c07 (3 channels, 512 samples, 140 us + 140 us): a new average
    every 430.08 ms, said as the device's; without the property the driver's default 0x7727 (422.4 ms)."""
    make_tx2(tmp_path / "dt", TX2_POWER, running_mode=1, continuous_config=0x7C07)
    make_tx2(tmp_path / "default", TX2_POWER, running_mode=1)
    for root, config, period in (("dt", "0x7c07", 0.43008), ("default", "0x7727", 0.4224)):
        sensor = JetsonSensor(str(tmp_path / root))
        try:
            rails = [f for f in sensor.fields() if f.group == "power"]
            assert len(rails) == 6
            for f in rails:
                assert f.resolution_s == pytest.approx(period) and f.resolution_how == "device" and f.window_mean
                assert f"continuous mode (running_mode 1), config {config}" in f.resolution_note
        finally:
            sensor.close()
    assert ina3221_cycle_us(0x7003) == 840  # the triggered default: one conversion of 3 channels


def test_orin_rails_refreshed_every_100_ms_give_steps_above_resolution_within_6_percent(tmp_path):
    """The hwmon driver says update_interval 100 ms and the monitor renews each rail with its mean over the last
    100 ms: 1.6 s steps (16 updates) of a 1.6 s square wave, its edges 30 ms off the refreshes, are each within
    6 %; 0.5 s steps are null (below_resolution); the job's total is within 3 %."""
    volts = 5000.0
    files = make_orin(tmp_path, {"VDD_IN": (volts, 1000.0)})
    (files["VDD_IN"].parent / "update_interval").write_text("100\n")
    power_mw = square(10000.0, 4000.0, 1.6, shift_s=0.03)
    refresher = Refresher({files["VDD_IN"]: lambda t: power_mw(t) * 1000.0 / volts}, 0.1)  # mA = mW / V
    refresher.advance(0.0)
    clock = _Clock()
    sensors, _ = open_sensors(["jetson"], {"jetson": {"sysfs_root": str(tmp_path)}})
    samples = _drive(Sampler(sensors, 5.0, clock=clock), clock, 11.0, before=refresher.advance)
    marks = _steps(1.63, 5, 1.6)
    truth = [mean_of(power_mw, m.start_s, m.end_s, 2000) / 1000.0 * (m.end_s - m.start_s) for m in marks]
    header, rows = step_rows(marks, samples, 5)
    col = header.index("energy_j_total")
    for m, row, joules in zip(marks, rows, truth):
        assert row[col] == pytest.approx(joules, rel=0.06), (m.index, row[col], joules)
    s = summarize(samples, marks, 5)
    assert s["energy_j"]["total"] == pytest.approx(sum(truth), rel=0.03)
    assert s["resolution"]["VDD_IN_power_mw"]["period_s"] == 0.1
    assert s["resolution"]["VDD_IN_power_mw"]["how"] == "device"

    halves = _steps(1.63, 16, 0.5)
    header, rows = step_rows(halves, samples, 5)
    cells = [dict(zip(header, r)) for r in rows]
    assert all(c["energy_j_total"] is None and c["energy_j_null_reason"] == "below_resolution" for c in cells)
    s = summarize(samples, halves, 5)
    assert "update_interval, 100 ms" in s["unavailable"]["steps.energy_j"]
    assert s["energy_j"]["total"] == pytest.approx(sum(truth), rel=0.03)


def test_a_tx2_in_triggered_mode_blocks_each_read_and_its_steps_are_as_read(tmp_path, monkeypatch):
    """running_mode 0: every read of a rail converts anew (0.84 ms under the default 0x7003) and returns that
    moment's power, so the six rails' reads overrun a 5 ms slot and the sampler skips every other one. The
    readings are the instant's: no resolution limit is said (as read), each sample is stamped at the middle of
    its reads, and 0.5 s steps of a square wave are within 6 %."""
    files = make_tx2(tmp_path, TX2_POWER, running_mode=0)
    clock = _Clock()
    vdd_in = square(9000.0, 3000.0, 0.5)
    signals = {os.path.realpath(p): (vdd_in if label == "VDD_IN" else (lambda t, v=TX2_POWER.get(label, 0): v))
               for label, p in files.items()}
    chip = TriggeredChip(signals, clock, ina3221_cycle_us(0x7003) / 1e6)
    real_read = AttrFile.read_bytes

    def read_bytes(self):
        chip.read(os.path.realpath(self.path))  # the read blocks for the conversion
        return real_read(self)

    monkeypatch.setattr(AttrFile, "read_bytes", read_bytes)
    sensors, _ = open_sensors(["jetson"], {"jetson": {"sysfs_root": str(tmp_path)}})
    fields = [f for s in sensors for f in s.fields() if f.group == "power"]
    assert fields and all(f.resolution_s == 0.0 and "triggered mode (running_mode 0)" in f.resolution_note
                          for f in fields)
    sampler = Sampler(sensors, 5.0, clock=clock)
    samples = _drive(sampler, clock, 6.2)
    assert len(chip.reads) >= 6 * len(samples.time_s) - 6
    assert sampler.dropped >= len(samples.time_s) - 2  # each sample's six reads (5.04 ms) overran its slot
    marks = _steps(0.5, 10, 0.5)
    truth = [vdd_in(m.start_s + 1e-6) / 1000.0 * 0.5 for m in marks]
    header, rows = step_rows(marks, samples, 5)
    col = header.index("energy_j_total")
    for m, row, joules in zip(marks, rows, truth):
        assert row[col] == pytest.approx(joules, rel=0.06), (m.index, row[col], joules)
    res = summarize(samples, marks, 5)["resolution"]["VDD_IN_power_mw"]
    assert res["period_s"] is None and res["how"] == "device" and "every read is a new reading" in res["note"]
