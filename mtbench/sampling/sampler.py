"""A background thread that reads every sensor at a fixed period on the monotonic clock.

Framework-agnostic on purpose (no torch): it is used by the training runner and around any command
(`mtbench-sample`). Callers mark step windows with `mark_step`; aggregation happens after `stop`. Between
steps a caller in the sampler's process may ask `latest_power_w()` (the job's live line; in `sampler.mode=process`
the sampling process's command thread asks for it): it decodes the samples taken since the last call of the
sensors that give the total power only, work that `samples()` would otherwise do at the end, and nothing more.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, List, Optional, Sequence, Tuple

import numpy as np

from mtbench.sampling.sensor import ENERGY, POWER, Field, Sensor

# a total rail whose newest value is older than this is not "now" (jtop refreshes its rails at 2 Hz, and
# the samples in between hold None; a source that stopped answering holds None for good)
LIVE_POWER_MAX_AGE_S = 1.0


@dataclass(frozen=True)
class StepMark:
    index: int  # step number, warm-up steps included, from 0
    start_s: float  # monotonic seconds
    end_s: float  # monotonic seconds
    warmup: bool  # True for warm-up steps, which no aggregate counts


class Samples:
    """The samples of one run as columns: `time_s` (monotonic) and one float array per field (NaN = None)."""

    def __init__(self, fields: List[Field], times: Sequence[float], rows: Sequence[Sequence[Optional[float]]]):
        self.fields = fields
        self.time_s = np.asarray(times, dtype=float)
        matrix = np.array(
            [[np.nan if v is None else v for v in row] for row in rows], dtype=float
        ).reshape(len(rows), len(fields))
        self.columns = {f.name: matrix[:, i] for i, f in enumerate(fields)}

    def __len__(self) -> int:
        return len(self.time_s)

    def group(self, group: str) -> List[Field]:
        return [f for f in self.fields if f.group == group]


class Sampler:
    """Reads `sensors` every `interval_ms` on a daemon thread between `start()` and `stop()`."""

    def __init__(
        self,
        sensors: Sequence[Sensor],
        interval_ms: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval_ms > 0:
            raise ValueError(f"interval_ms={interval_ms!r}; allowed: a number > 0")
        self.sensors = list(sensors)
        self.interval_ms = float(interval_ms)
        self.clock = clock
        self.marks: List[StepMark] = []
        self.dropped = 0  # periods skipped because a read overran its slot
        self.cpu_time_s: Optional[float] = None  # the sampler thread's own CPU time
        self._times: List[float] = []
        self._raws: List[List[Any]] = []  # per sample, each sensor's read_raw() (None: it failed)
        self._rows: List[List[Optional[float]]] = []  # the raws decoded so far, in order
        self._stop = threading.Event()  # set by stop(): wakes the loop at once, whatever its period
        self._first = threading.Event()  # set once the loop's first sample is taken
        self._thread: Optional[threading.Thread] = None
        self._fields = [f for s in self.sensors for f in s.fields()]
        self._widths = [len(s.fields()) for s in self.sensors]
        # one decoder at a time (the caller of samples() or latest_power_w(): the loop thread only appends), so
        # each sensor decodes each sample once, in order
        self._decoding = threading.Lock()
        # per sensor, its values decoded ahead of the rows (latest_power_w decodes only the power sensors)
        self._ahead: List[Deque[List[Optional[float]]]] = [deque() for _ in self.sensors]
        self._total_power = total_power_columns(self._fields)
        # per total-power column: (its sensor, its place among that sensor's values, scale to W) ...
        places = [(i, place) for i, width in enumerate(self._widths) for place in range(width)]  # per column
        self._power_at = [(*places[column], scale) for column, scale in self._total_power or []]
        self._power_sensors = sorted({i for i, _, _ in self._power_at})
        # ... and its newest value as (sample time s, W) once decoded
        self._newest_w: List[Optional[Tuple[float, float]]] = [None] * len(self._power_at)

    def start(self) -> "Sampler":
        """Begin sampling; returns once the first sample has been taken, so that the first step has one before it
        (a thread just started may otherwise wait for the GIL past the first steps)."""
        self._thread = threading.Thread(target=self._run, name="mtbench-sampler", daemon=True)
        self._thread.start()
        while not self._first.wait(0.05) and self._thread.is_alive():
            pass
        return self

    def stop(self) -> Samples:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        return self.samples()

    def __enter__(self) -> "Sampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def mark_step(self, index: int, start_s: float, end_s: float, warmup: bool = False) -> None:
        self.marks.append(StepMark(index, start_s, end_s, warmup))

    def samples(self) -> Samples:
        """Everything sampled so far, decoded (decoding is in order and once per sample: sensors keep
        state across samples, such as a counter's wraparound)."""
        self._decode_new()
        return Samples(self._fields, self._times[: len(self._rows)], self._rows)

    @property
    def gives_power(self) -> bool:
        """Whether latest_power_w() can give watts: every total rail has a POWER gauge."""
        return self._total_power is not None

    def latest_power_w(self) -> Optional[float]:
        """The total power now in W: the sum of each total rail's newest value (rails chosen as windows.Rails
        chooses its total: those whose field counts toward the total and is the job's, each from its POWER
        gauge). None without such a rail, where one has only an energy counter, or where a rail's newest value
        is older than LIVE_POWER_MAX_AGE_S (a source that stopped answering, a sampler that stopped). Decodes
        the samples taken since the last call of the sensors that give those rails (work `samples()` then need
        not do; the other sensors wait for it): call it between steps."""
        if self._total_power is None:
            return None
        with self._decoding:
            upto = len(self._times)
            for i in self._power_sensors:
                self._decode_sensor(i, upto)
        newest = [v for v in self._newest_w if v is not None]
        if len(newest) < len(self._newest_w):
            return None
        now = self.clock()
        if any(now - t > LIVE_POWER_MAX_AGE_S for t, _ in newest):
            return None
        return float(sum(w for _, w in newest))

    def _decode_new(self) -> None:
        """Decode the samples not decoded yet into rows, in order, each once."""
        with self._decoding:
            upto = len(self._times)  # the raws up to it are complete: _sample appends a raw row before its time
            for i in range(len(self.sensors)):
                self._decode_sensor(i, upto)
            for _ in range(len(self._rows), upto):
                row: List[Optional[float]] = []
                for ahead in self._ahead:
                    row.extend(ahead.popleft())
                self._rows.append(row)

    def _decode_sensor(self, i: int, upto: int) -> None:
        """Decode sensor i's raws of the samples before `upto` that it has not decoded (under _decoding)."""
        sensor, width, ahead = self.sensors[i], self._widths[i], self._ahead[i]
        power = [(k, place, scale) for k, (s, place, scale) in enumerate(self._power_at) if s == i]
        for n in range(len(self._rows) + len(ahead), upto):
            raw = self._raws[n][i]
            try:
                decoded = sensor.decode(raw) if raw is not None else None
            except Exception:
                decoded = None
            values: List[Optional[float]] = list(decoded) if decoded is not None else [None] * width
            for k, place, scale in power:
                value = values[place]
                if value is not None and value == value:  # value == value: not NaN
                    self._newest_w[k] = (self._times[n], value * scale)
            ahead.append(values)

    def _sample(self) -> None:
        t0 = self.clock()
        raws: List[Any] = []
        for sensor in self.sensors:
            try:
                raws.append(sensor.read_raw())
            except Exception:  # a source that fails mid-run leaves a gap, never kills the run
                raws.append(None)
        # stamped at the middle of its reads: a read that blocks (an INA3221 in triggered mode converts on each
        # read, about 1 ms a rail) skews no reading by more than half the reads' time
        t = (t0 + self.clock()) / 2
        # the raw row first: samples() reads up to len(_times), so a sample is never seen half-made
        self._raws.append(raws)
        self._times.append(t)

    def _run(self) -> None:
        period = self.interval_ms / 1000.0
        next_t = self.clock()
        cpu0 = time.thread_time()
        while not self._stop.is_set():
            self._sample()
            self._first.set()
            next_t += period
            now = self.clock()
            if now >= next_t:  # this read overran its slot: skip the missed periods, keep the grid
                missed = int((now - next_t) / period) + 1
                self.dropped += missed
                next_t += missed * period
            self._stop.wait(max(0.0, next_t - self.clock()))  # a sleep that stop() cuts short
        self._sample()  # a last sample so that the final step window is closed on both sides
        self.cpu_time_s = time.thread_time() - cpu0

    def stats(self) -> dict:
        """Interval asked and achieved, sample count, drops and own CPU cost, for summary.json."""
        gaps_ms = np.diff(np.asarray(self._times)) * 1000.0
        achieved = (
            {"median": float(np.median(gaps_ms)), "p99": float(np.percentile(gaps_ms, 99))}
            if len(gaps_ms)
            else {"median": None, "p99": None}
        )
        span = self._times[-1] - self._times[0] if len(self._times) > 1 else None
        return {
            "interval_ms": self.interval_ms,
            "achieved_interval_ms": achieved,
            "samples": len(self._times),
            "dropped": self.dropped,
            "cpu_time_s": self.cpu_time_s,
            "cpu_pct_of_one_core": (
                100.0 * self.cpu_time_s / span if span and self.cpu_time_s is not None else None
            ),
        }


def total_rails(fields: Sequence[Field]) -> List[str]:
    """The rails (keys of the POWER and ENERGY fields) whose sum is the job's total power and energy: a rail's
    flags are its energy counter's where it has one, else its power gauge's; it counts where `total` and `job`."""
    power = {f.key: f for f in fields if f.group == POWER}
    energy = {f.key: f for f in fields if f.group == ENERGY}
    flags = {r: energy.get(r) or power[r] for r in dict.fromkeys(list(power) + list(energy))}
    return [r for r, f in flags.items() if f.total and f.job]


def total_power_columns(fields: Sequence[Field]) -> Optional[List[Tuple[int, float]]]:
    """(column, scale to W) of the POWER gauge of each of `total_rails`; None without a total rail or where one
    has no POWER gauge (its watts would come from counter differences, which windows.py takes only over windows
    the counter resolves: not two samples of NVML's ~100 ms energy counter)."""
    power = {f.key: (i, f.scale) for i, f in enumerate(fields) if f.group == POWER}
    total = total_rails(fields)
    if not total or any(r not in power for r in total):
        return None
    return [power[r] for r in total]
