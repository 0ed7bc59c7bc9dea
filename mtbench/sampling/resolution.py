"""How finely in time each power, energy and utilisation source resolves, and the rule for a figure over a window.

A source's resolution is its update period: how often the value it gives can change. It is declared by the sensor
where the device says it (the INA3221 hwmon driver's `update_interval`) or where the source's documented behaviour
fixes it (NVML's instantaneous power field on Ampere and newer data-centre GPUs: the mean of 25 ms sampled in every
100 ms, refreshed every 100 ms; its energy counter, refreshed about every 100 ms; its utilisation, a trailing mean
over 1/6 s to 1 s by product). Only where nothing says is it learned from the samples, robustly: the shortest
interval between the samples where the value changed (the 10th percentile of those intervals, so that one
sampler stall does not lengthen it). A value that changes rarely makes that an upper bound, not a slow sensor: a
steady signal (a GPU held at its power cap) is why the declared period wins. A value that changes at about every
sample is faster than sampled (RAPL, a gauge read straight from the chip): the sampling interval, not the source,
limits it, and its figures are given as read (interpolated between samples); so are those of a value that never
changed (no period can be learned). The summary says which.

A figure over a window (a step, an operation) is given only where the window spans RESOLVE_PERIODS of its source's
updates; below that it is null with the short code BELOW_RESOLUTION (steps.csv, ops.csv) and one sentence per
source in summary.json. The job's totals follow the same rule over the whole measured time, which a job of many
short steps meets where its steps do not.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

import numpy as np

from mtbench.sampling.sensor import Field

# a window must span this many updates of its source: then an edge's error (at most about one update of the
# source's change, at each end) stays within a few per cent of the window's figure
RESOLVE_PERIODS = 10
LEARN_PERCENTILE = 10  # of the intervals between changes: the shortest, but not one jitter of the sampler
FASTER_THAN_SAMPLED = 1.5  # a learned period within this many sampling intervals: the source changes every sample

# the short codes of a null per-window figure (steps.csv, ops.csv); summary.json holds the sentence per source
BELOW_RESOLUTION = "below_resolution"
NOT_COVERED = "not_covered"  # the samples do not cover the window, or leave a gap in it
NO_READING = "no_reading"  # the source gives nothing to integrate over a window (a counter that does not resolve it)
NO_TOTAL_RAIL = "no_total_rail"  # no rail counts toward the total


@dataclass(frozen=True)
class Resolution:
    """One source's update period (None: unknown), how it is known, and the sentence summary.json gives."""

    period_s: Optional[float]
    how: str  # "device", "documented", "learned" or "unknown"
    note: str

    def min_window_s(self) -> Optional[float]:
        """The shortest window a figure of this source is given over (None: any)."""
        return None if self.period_s is None else RESOLVE_PERIODS * self.period_s

    def resolves(self, seconds: float) -> bool:
        least = self.min_window_s()
        return least is None or seconds >= least * (1 - 1e-9)

    def as_dict(self) -> Dict[str, Any]:
        return {"period_s": self.period_s, "how": self.how, "min_window_s": self.min_window_s(), "note": self.note}


def learned_period_s(times: np.ndarray, values: np.ndarray, sample_s: float) -> Optional[float]:
    """The shortest interval between the samples where the value changed (see the module's docstring), at least
    `sample_s`; None with fewer than three such intervals."""
    ok = ~np.isnan(values)
    t, v = times[ok], values[ok]
    if len(t) < 2:
        return None
    changes = t[1:][np.diff(v) != 0]  # the first sample is not a change: its value was set at an unknown time
    if len(changes) < 4:
        return None
    return max(float(np.percentile(np.diff(changes), LEARN_PERCENTILE)), sample_s)


def of_field(times: np.ndarray, values: np.ndarray, field: Field, sample_s: float) -> Resolution:
    """The resolution of one sampled field: the sensor's declaration, else learned from its samples."""
    if field.resolution_s == 0:  # declared: every read is a fresh reading (an INA3221 in triggered mode)
        return Resolution(None, field.resolution_how or "device",
                          f"{field.name}: every read is a new reading ({field.resolution_note}): its figures are "
                          "given as read, interpolated between samples")
    if field.resolution_s is not None:
        how = field.resolution_how or "documented"
        return Resolution(float(field.resolution_s), how,
                          f"{field.name}: updates every {field.resolution_s * 1000:g} ms ({how}: "
                          f"{field.resolution_note or 'as the sensor declares'})")
    learned = learned_period_s(times, values, sample_s)
    if learned is not None and learned <= FASTER_THAN_SAMPLED * sample_s:
        return Resolution(None, "learned",
                          f"{field.name}: changes at about every sample ({sample_s * 1000:.1f} ms): faster than "
                          "sampled, its figures are interpolated between samples")
    if learned is None:
        return Resolution(None, "unknown",
                          f"{field.name}: its value changed too seldom while sampled to learn how often it updates; "
                          "its figures are given as read")
    return Resolution(learned, "learned",
                      f"{field.name}: updates about every {learned * 1000:.0f} ms (learned: the shortest interval "
                      f"between its changes, {LEARN_PERCENTILE}th percentile; an upper bound where the signal itself "
                      "changes more slowly than its sensor)")


def below(resolution: Resolution, seconds: float) -> str:
    """The sentence for a window too short for `resolution` (summary.json; steps.csv says BELOW_RESOLUTION)."""
    return (f"{resolution.note}; a figure needs a window of {RESOLVE_PERIODS} updates or more "
            f"({(resolution.min_window_s() or 0) * 1000:.0f} ms), this one is {seconds * 1000:.1f} ms")
