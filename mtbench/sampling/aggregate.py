"""Per-window figures from timestamped samples: counter deltas and time integrals of gauges.

Both interpolate linearly at the window edges, so a window need not fall on sample times. NaN (a sensor
that gave nothing) is skipped; a window the samples do not cover on both sides gives None, and so does a
gauge whose valid samples inside the window are further apart than `max_gap_s` (a rail that vanished:
bridging it would invent the values in between).
"""
from __future__ import annotations

from typing import Optional

import numpy as np


def _valid(times: np.ndarray, values: np.ndarray):
    ok = ~np.isnan(values)
    return times[ok], values[ok]


def update_period_s(times: np.ndarray, values: np.ndarray, changes: bool = False) -> Optional[float]:
    """How often a source really updates: the median time between its valid samples, or with `changes`
    between the samples where its value changed (a counter that the hardware refreshes every 100 ms reads
    the same value 20 times at 5 ms). None with fewer than two such intervals."""
    t, v = _valid(times, values)
    if changes and len(t):
        t = t[1:][np.diff(v) != 0]  # the first sample is not a change: its value was set at an unknown time
    return float(np.median(np.diff(t))) if len(t) >= 3 else None


def change_points(times: np.ndarray, values: np.ndarray):
    """The samples where a counter's value changed: a coarse counter's value is known to be current there
    (its update happened at most one sampling interval before), not at the repeats in between."""
    t, v = _valid(times, values)
    keep = np.concatenate(([False], np.diff(v) != 0)) if len(t) else np.zeros(0, dtype=bool)
    return t[keep], v[keep]


def counter_delta(times: np.ndarray, values: np.ndarray, start: float, end: float,
                  coarse: bool = False, extend_s: float = 0.0) -> Optional[float]:
    """How much a cumulative counter grew over [start, end] (a gap in between loses nothing). A `coarse`
    counter (updated less often than sampled) is interpolated between its change points, not through the
    flat repeats of a staircase; an edge that lies before its first change point or after its last one, by at most
    `extend_s` and inside the samples, is extrapolated at the rate of the neighbouring update (a job's first step
    that began before the counter's first change while sampled)."""
    t, v = change_points(times, values) if coarse else _valid(times, values)
    if len(t) < 2 or end < start:
        return None
    sampled = _valid(times, values)[0]
    if not (sampled[0] <= start and end <= sampled[-1]):
        return None
    if start < t[0] - extend_s or end > t[-1] + extend_s:
        return None
    return float(_extended(t, v, end) - _extended(t, v, start))


def _extended(t: np.ndarray, v: np.ndarray, x: float) -> float:
    """The piecewise-linear curve through (t, v) at x, its end segments extended beyond t[0] and t[-1]."""
    if x < t[0]:
        return float(v[0] - (v[1] - v[0]) / (t[1] - t[0]) * (t[0] - x))
    if x > t[-1]:
        return float(v[-1] + (v[-1] - v[-2]) / (t[-1] - t[-2]) * (x - t[-1]))
    return float(np.interp(x, t, v))


def integral(times: np.ndarray, values: np.ndarray, start: float, end: float,
             max_gap_s: Optional[float] = None) -> Optional[float]:
    """Trapezoidal integral of a gauge over [start, end] (e.g. watts -> joules), edges interpolated."""
    t, v = _valid(times, values)
    if len(t) < 2 or start < t[0] or end > t[-1] or end < start:
        return None
    inside = (t > start) & (t < end)
    if max_gap_s is not None:
        # the valid samples that bracket the window and those inside it must lie close together
        lo = max(0, int(np.searchsorted(t, start, side="right")) - 1)
        hi = min(len(t) - 1, int(np.searchsorted(t, end, side="left")))
        if hi > lo and np.max(np.diff(t[lo: hi + 1])) > max_gap_s:
            return None
    ts = np.concatenate(([start], t[inside], [end]))
    vs = np.concatenate(([np.interp(start, t, v)], v[inside], [np.interp(end, t, v)]))
    return float(np.sum((vs[1:] + vs[:-1]) * np.diff(ts)) / 2.0)


def window_mean_cumulative(times: np.ndarray, values: np.ndarray, period_s: Optional[float] = None):
    """(breakpoints, cumulative integral at them) of a gauge whose each new value is the mean since its
    previous update. With the source's update period known (declared), each value read covers the period before
    it was read: the staircase moved back by one period, the last value held up to the last sample (a reading
    that stays the same across updates is then never stretched back to an older change). Without it, the value
    first seen at a change point covers the time back to the change point before it (a run that never changes
    covers the span it was seen). None with fewer than two valid samples."""
    t, v = _valid(times, values)
    if len(t) < 2:
        return None
    if period_s:
        bounds = np.concatenate((t - period_s, [t[-1]]))
        return bounds, np.concatenate(([0.0], np.cumsum(v * np.diff(bounds))))
    change = np.concatenate(([True], np.diff(v) != 0))
    c, cv = t[change], v[change]
    # (c[k-1], c[k]] holds cv[k]; after the last change point its value holds up to the last sample
    bounds = np.concatenate((c, [t[-1]])) if t[-1] > c[-1] else c
    held = np.concatenate((cv[1:], [cv[-1]]))[: len(bounds) - 1]
    if len(bounds) < 2:
        return None
    return bounds, np.concatenate(([0.0], np.cumsum(held * np.diff(bounds))))


def window_mean_integral(times: np.ndarray, values: np.ndarray, start: float, end: float,
                         max_gap_s: Optional[float] = None, period_s: Optional[float] = None) -> Optional[float]:
    """The integral over [start, end] of a gauge read as `window_mean_cumulative` does."""
    cum = window_mean_cumulative(times, values, period_s)
    if cum is None or start < cum[0][0] or end > cum[0][-1] or end < start:
        return None
    if max_gap_s is not None and integral(times, values, start, end, max_gap_s) is None:
        return None  # the same gap rule as any gauge
    lo, hi = np.interp([start, end], *cum)
    return float(hi - lo)


def mean(times: np.ndarray, values: np.ndarray, start: float, end: float,
         max_gap_s: Optional[float] = None) -> Optional[float]:
    """Time-weighted mean of a gauge over [start, end]."""
    if end <= start:
        return None
    area = integral(times, values, start, end, max_gap_s)
    return None if area is None else area / (end - start)
