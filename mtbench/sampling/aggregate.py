"""Per-window figures from timestamped samples: counter deltas and time integrals of gauges.

Both interpolate linearly at the window edges, so a window need not fall on sample times. NaN (a sensor
that gave nothing) is skipped; a window the samples do not cover on both sides gives None.
"""
from __future__ import annotations

from typing import Optional

import numpy as np


def _valid(times: np.ndarray, values: np.ndarray):
    ok = ~np.isnan(values)
    return times[ok], values[ok]


def counter_delta(times: np.ndarray, values: np.ndarray, start: float, end: float) -> Optional[float]:
    """How much a cumulative counter grew over [start, end]."""
    t, v = _valid(times, values)
    if len(t) < 2 or start < t[0] or end > t[-1]:
        return None
    lo, hi = np.interp([start, end], t, v)
    return float(hi - lo)


def integral(times: np.ndarray, values: np.ndarray, start: float, end: float) -> Optional[float]:
    """Trapezoidal integral of a gauge over [start, end] (e.g. watts -> joules), edges interpolated."""
    t, v = _valid(times, values)
    if len(t) < 2 or start < t[0] or end > t[-1] or end < start:
        return None
    inside = (t > start) & (t < end)
    ts = np.concatenate(([start], t[inside], [end]))
    vs = np.concatenate(([np.interp(start, t, v)], v[inside], [np.interp(end, t, v)]))
    return float(np.sum((vs[1:] + vs[:-1]) * np.diff(ts)) / 2.0)


def mean(times: np.ndarray, values: np.ndarray, start: float, end: float) -> Optional[float]:
    """Time-weighted mean of a gauge over [start, end]."""
    if end <= start:
        return None
    area = integral(times, values, start, end)
    return None if area is None else area / (end - start)
