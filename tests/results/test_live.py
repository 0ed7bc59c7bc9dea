"""The live line's watts: the sampler's latest total power (decoding each sample once), what the job sends, what
the line draws, and a job (either sampler mode) whose Progress messages carry the power of a fake TX2's input rail."""
from __future__ import annotations

import csv
import io
import math
import time
from typing import Any, List, Optional, Sequence

import pytest
from rich.console import Console

from mtbench.results import live
from mtbench.results.live import LiveLine, Progress, ProgressSender
from mtbench.sampling.process import ProcessSampler
from mtbench.sampling.sampler import LIVE_POWER_MAX_AGE_S, Sampler
from mtbench.sampling.sensor import COUNTER, ENERGY, GAUGE, POWER, Field, Sensor
from tests.conftest import compose_cfg
from tests.fake_sysfs import make_tx2
from tests.results.test_progress import FAKE, Clock


class Rails(Sensor):
    """Three rails in mW as a board's monitor gives them: two that count toward the total (a board's input and a
    discrete GPU's), one that lies inside the input rail (not added). read_raw() returns the text of the files
    (bytes, as the Jetson sensor does); decode() parses it. `values` is what the next read sees; None: no answer."""

    name = "rails"

    def __init__(self) -> None:
        self.values: List[Optional[float]] = [9000.0, 3000.0, 2500.0]

    def fields(self) -> List[Field]:
        return [Field("vdd_in_power_mw", GAUGE, POWER, "VDD_IN", 1e-3, total=True),
                Field("gpu0_power_mw", GAUGE, POWER, "gpu0", 1e-3, total=True),
                Field("vdd_sys_gpu_power_mw", GAUGE, POWER, "VDD_SYS_GPU", 1e-3)]

    def read_raw(self) -> Any:
        return [None if v is None else f"{v:.0f}\n".encode() for v in self.values]

    def decode(self, raw: Any) -> Sequence[Optional[float]]:
        return [None if b is None else float(b) for b in raw]


class WrappingCounter(Sensor):
    """An energy counter in uJ that wraps at `wrap_uj`, as RAPL's does; decode() unwraps it from the previous raw
    value, state that a second decode of one sample would spoil. Counts each raw value's decodes."""

    name = "counter"

    def __init__(self, wrap_uj: int = 1000) -> None:
        self.wrap_uj, self.raw_uj, self.previous, self.unwrapped, self.reads = wrap_uj, 0, None, 0, 0
        self.decoded: dict = {}  # read number -> decodes

    def fields(self) -> List[Field]:
        return [Field("pkg_energy_uj", COUNTER, ENERGY, "package-0", 1e-6)]

    def read_raw(self) -> Any:
        self.raw_uj = (self.raw_uj + 400) % self.wrap_uj  # 400 uJ a sample
        self.reads += 1
        return (self.reads, self.raw_uj)

    def decode(self, raw: Any) -> Sequence[Optional[float]]:
        read, value = raw
        self.decoded[read] = self.decoded.get(read, 0) + 1
        if self.previous is not None:
            self.unwrapped += (value - self.previous) % self.wrap_uj
        self.previous = value
        return [float(self.unwrapped)]


def take(sampler: Sampler, clock: Clock, n: int = 1, dt: float = 0.005) -> None:
    """n samples, as the sampler's loop takes them, one every dt seconds on the fake clock (no thread: exact)."""
    for _ in range(n):
        clock.now += dt
        sampler._sample()


def test_latest_power_sums_the_total_rails_of_the_newest_sample():
    clock, rails = Clock(), Rails()
    sampler = Sampler([rails], interval_ms=5, clock=clock)
    assert sampler.latest_power_w() is None  # nothing sampled yet: not 0
    take(sampler, clock, 3)
    # VDD_IN 9 W + gpu0 3 W; VDD_SYS_GPU lies inside VDD_IN and is not added (windows.py's total has the same rails)
    assert sampler.latest_power_w() == pytest.approx(12.0)
    rails.values = [10000.0, 4000.0, 2500.0]
    take(sampler, clock)
    assert sampler.latest_power_w() == pytest.approx(14.0)
    rails.values = [10000.0, None, 2500.0]  # gpu0 gives nothing this read: its newest value stands for a while ...
    take(sampler, clock)
    assert sampler.latest_power_w() == pytest.approx(14.0)
    take(sampler, clock, 1, dt=LIVE_POWER_MAX_AGE_S + 0.01)  # ... but not once it is older than the limit
    assert sampler.latest_power_w() is None
    samples = sampler.samples()
    assert len(samples) == 6 and math.isnan(samples.columns["gpu0_power_mw"][-1])


def test_no_total_rail_or_a_counter_only_total_gives_no_watts():
    clock = Clock()
    counter_only = Sampler([WrappingCounter()], interval_ms=5, clock=clock)
    take(counter_only, clock, 3)
    assert counter_only.latest_power_w() is None  # watts from counter differences: only over resolved windows

    class SubRailOnly(Rails):
        def fields(self) -> List[Field]:
            return [Field(f.name, f.kind, f.group, f.key, f.scale) for f in super().fields()]  # none is total

    no_total = Sampler([SubRailOnly()], interval_ms=5, clock=clock)
    take(no_total, clock, 2)
    assert no_total.latest_power_w() is None


def test_a_rail_with_power_and_energy_counts_by_its_energy_fields_flags():
    """As windows.Rails: NVML gives a GPU's power gauge and its energy counter; the counter's flags decide."""
    class Gpu(Sensor):
        def __init__(self, counted: bool) -> None:
            self.counted = counted

        def fields(self) -> List[Field]:
            return [Field("gpu0_power_mw", GAUGE, POWER, "gpu0", 1e-3, total=True, job=True),
                    Field("gpu0_energy_mj", COUNTER, ENERGY, "gpu0", 1e-3, total=self.counted, job=self.counted)]

        def read_raw(self) -> Any:
            return [150000.0, 1e6]

    clock = Clock()
    counted, other = Sampler([Gpu(True)], clock=clock), Sampler([Gpu(False)], clock=clock)
    take(counted, clock)
    take(other, clock)
    assert counted.latest_power_w() == pytest.approx(150.0) and other.latest_power_w() is None


def test_each_sample_is_decoded_once_across_latest_power_and_samples():
    clock, counter = Clock(), WrappingCounter(wrap_uj=1000)
    sampler = Sampler([Rails(), counter], interval_ms=5, clock=clock)
    take(sampler, clock, 3)
    assert sampler.latest_power_w() == pytest.approx(12.0)
    take(sampler, clock, 2)
    assert len(sampler.samples()) == 5
    take(sampler, clock, 4)
    sampler.latest_power_w()
    sampler.latest_power_w()
    samples = sampler.samples()
    assert counter.decoded == {k: 1 for k in range(1, 10)}  # each read decoded once, in order
    # 400 uJ a sample through three wraps of 1000, unwrapped exactly: one decoder state, fed in order
    assert list(samples.columns["pkg_energy_uj"]) == [400.0 * k for k in range(9)]


def test_latest_power_decodes_only_the_power_sensors_and_samples_keeps_each_row_whole():
    """The live line's read decodes the sensors that give the total rails; samples() later decodes the others,
    each sample once, and every row still holds one sample's values of every sensor."""
    clock, rails, counter = Clock(), Rails(), WrappingCounter(wrap_uj=1000)
    sampler = Sampler([counter, rails], interval_ms=5, clock=clock)
    assert sampler.gives_power
    for k in range(6):
        rails.values = [9000.0 + k, 3000.0, 2500.0]  # VDD_IN tells which sample a row's rails came from
        take(sampler, clock)
        assert sampler.latest_power_w() == pytest.approx(12.0 + k / 1000)
    assert counter.decoded == {}  # the counter waits for samples(): the read costs only the power sensors' decode
    take(sampler, clock, 2)
    samples = sampler.samples()
    assert counter.decoded == {k: 1 for k in range(1, 9)}
    assert list(samples.columns["pkg_energy_uj"]) == [400.0 * k for k in range(8)]
    assert list(samples.columns["vdd_in_power_mw"]) == [9000.0 + k for k in range(6)] + [9005.0] * 2
    sampler.latest_power_w()
    assert len(sampler.samples()) == 8 and not Sampler([counter], clock=clock).gives_power


def test_the_sender_attaches_the_watts_and_asks_for_them_at_most_every_refresh_period():
    sent, clock, asked = [], Clock(), []

    def power_w() -> Optional[float]:
        asked.append(clock.now)
        return 12.5

    sender = ProgressSender(sent.append, total_steps=1 + 100, clock=clock, power_w=power_w)
    sender.phase("warm-up", 1)
    clock.now += 0.01
    sender.step(0.01)
    sender.phase("measure", 100)  # a phase's first send follows the warm-up's last at once: the watts are reused
    for _ in range(100):
        clock.now += 0.01
        sender.step(0.01)
    assert all(p.power_w == 12.5 for p in sent)
    assert all(b - a >= live.REFRESH_S - 1e-9 for a, b in zip(asked, asked[1:])), asked
    assert len(asked) <= 1 + 1.01 / live.REFRESH_S
    silent = []
    ProgressSender(silent.append, total_steps=1).phase("build")
    assert silent[0].power_w is None  # no power source: None, never 0

    def broken() -> Optional[float]:
        raise OSError("gone")

    failing = []
    ProgressSender(failing.append, total_steps=1, power_w=broken).phase("build")
    assert failing[0].power_w is None  # the line loses its watts, the job goes on


def test_the_line_shows_the_watts_only_when_known():
    file, clock = io.StringIO(), Clock()
    console = Console(file=file, force_terminal=True, width=200, color_system=None)
    line = LiveLine("vgg19 batch 16", console=console, clock=clock)
    line.update(Progress("measure", 6, 20, 0.452, 14 * 0.452, clock.now, power_w=12.34))
    assert line.line(clock.now) == ("  vgg19 batch 16 | measure: step 7 of 20 | 0.0 s elapsed, ETA 6.3 s | "
                                    "last step 452.0 ms | 12.3 W")
    line.update(Progress("measure", 7, 20, 0.452, 13 * 0.452, clock.now))
    assert " W" not in line.line(clock.now)
    line.close()
    out = io.StringIO()
    plain = LiveLine("alexnet batch 2", plain=out, clock=clock)
    plain.update(Progress("build", sent_s=clock.now))
    clock.now += 2.0
    plain.update(Progress("measure", 0, 20, sent_s=clock.now, power_w=7.31))
    assert out.getvalue().splitlines() == ["  alexnet batch 2: build (0.0 s elapsed)",
                                           "  alexnet batch 2: measure, 20 steps (2.0 s elapsed, 7.3 W)"]


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_job_sends_the_total_power_of_a_tx2s_rails_between_steps(tmp_path, monkeypatch, mode):
    """In the job's process (thread) or from the sampling process (process, the default), without waiting for it."""
    from mtbench import config
    from mtbench.job.messages import Message
    from mtbench.job.run import run_job

    monkeypatch.setattr(config, "ALLOWED_TARGET_PREFIXES", config.ALLOWED_TARGET_PREFIXES + ("tests.",))
    monkeypatch.setattr(live, "REFRESH_S", 0.0)  # a send (and a power read) after every step: the strictest case
    make_tx2(tmp_path / "tx2", {"VDD_IN": 9000, "VDD_SYS_GPU": 3500, "VDD_SYS_CPU": 1500,
                                        "VDD_SYS_SOC": 900, "VDD_SYS_DDR": 700})
    reads = []  # (start, end) of each power read
    cls = Sampler if mode == "thread" else ProcessSampler
    latest = cls.latest_power_w

    def timed_latest(self):
        start = time.monotonic()
        try:
            return latest(self)
        finally:
            reads.append((start, time.monotonic()))

    monkeypatch.setattr(cls, "latest_power_w", timed_latest)
    sent = []
    cfg = compose_cfg([*FAKE, "+model.workload.seconds=0.02", "warmup=1", "steps=3", "sampler=jetson",
                       f"sampler.sysfs_root={tmp_path / 'tx2'}", f"sampler.mode={mode}"])
    summary = run_job(cfg, tmp_path / "job", notify=lambda kind, p: sent.append(p) if kind == Message.PROGRESS else 0)
    assert summary["success"], summary["failure"]
    assert summary["sampler"].get("mode", "thread") == mode
    stepped = [p for p in sent if p.done]
    assert len(stepped) == 4 and all(p.power_w in (None, pytest.approx(9.0)) for p in sent)  # VDD_IN only
    # the warm-up may end before the sampler thread's first sample, or (process) before the first answer came:
    # a None, never a 0; the measured steps see it
    assert [p.power_w for p in stepped if p.phase == "measure"] == [pytest.approx(9.0)] * 3, sent
    assert sent[0].phase == "build" and sent[0].power_w is None  # before the sampler starts: no samples, no watts
    with open(tmp_path / "job" / "steps.csv") as f:
        windows = [(float(r["start_s"]), float(r["end_s"])) for r in csv.DictReader(f)]
    assert reads and not any(a < t < b for a, b in windows for read in reads for t in read)
