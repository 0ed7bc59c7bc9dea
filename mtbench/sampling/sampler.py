"""A background thread that reads every sensor at a fixed period on the monotonic clock.

Framework-agnostic on purpose (no torch): it is used by the training runner and around any command
(`mtbench-sample`). Callers mark step windows with `mark_step`; aggregation happens after `stop`.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from mtbench.sampling.sensor import Field, Sensor


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
        self._thread: Optional[threading.Thread] = None
        self._fields = [f for s in self.sensors for f in s.fields()]

    def start(self) -> "Sampler":
        self._thread = threading.Thread(target=self._run, name="mtbench-sampler", daemon=True)
        self._thread.start()
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
        widths = [len(s.fields()) for s in self.sensors]
        for raws in self._raws[len(self._rows): len(self._times)]:
            row: List[Optional[float]] = []
            for sensor, raw, width in zip(self.sensors, raws, widths):
                try:
                    values = sensor.decode(raw) if raw is not None else None
                except Exception:
                    values = None
                row.extend(values if values is not None else [None] * width)
            self._rows.append(row)
        return Samples(self._fields, self._times[: len(self._rows)], self._rows)

    def _sample(self) -> None:
        t = self.clock()
        raws: List[Any] = []
        for sensor in self.sensors:
            try:
                raws.append(sensor.read_raw())
            except Exception:  # a source that fails mid-run leaves a gap, never kills the run
                raws.append(None)
        # the raw row first: samples() reads up to len(_times), so a sample is never seen half-made
        self._raws.append(raws)
        self._times.append(t)

    def _run(self) -> None:
        period = self.interval_ms / 1000.0
        next_t = self.clock()
        cpu0 = time.thread_time()
        while not self._stop.is_set():
            self._sample()
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
