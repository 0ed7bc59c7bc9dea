"""A run's power and energy rails: each rail's energy over windows, from its counter or its power reading, as the
sources' resolution allows (sampling/resolution.py), and why a figure is null."""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from mtbench.sampling import aggregate, resolution
from mtbench.sampling.resolution import BELOW_RESOLUTION, NO_READING, NOT_COVERED, RESOLVE_PERIODS
from mtbench.sampling.sampler import Samples, total_rails
from mtbench.sampling.sensor import ENERGY, POWER, POWER_AVG, Field

# gaps longer than this many sampling intervals (and at least 50 ms) make a gauge's window unknown
MAX_GAP_INTERVALS = 10
# ... or longer than this many of the field's own update periods (a source slower than the sampler)
MAX_GAP_UPDATES = 3
# a coarse counter (it changes less often than every COARSE_SAMPLES samples) is used over a window only when
# the window spans at least this many of its updates; shorter windows take the power integral
COARSE_SAMPLES = 2.0
# a coarse counter's first (last) change point may come up to this many of its updates after the first step began
# (before the last one ended): the edge is extrapolated at the neighbouring update's rate
EXTEND_PERIODS = 1.5

Window = Tuple[float, float]  # (start_s, end_s) on the monotonic clock


def sample_interval_s(samples: Samples, interval_ms: float) -> float:
    """The run's sampling interval as achieved: the median time between samples (the asked one without two)."""
    gaps = np.diff(samples.time_s)
    return float(np.median(gaps)) if len(gaps) else interval_ms / 1000.0


def max_gap_s(interval_ms: float) -> float:
    return max(0.05, MAX_GAP_INTERVALS * interval_ms / 1000.0)


def field_gap_s(samples: Samples, field: Field, interval_ms: float) -> float:
    """The gap rule for one gauge: the sampler's, widened to MAX_GAP_UPDATES of the field's own update period."""
    period = aggregate.update_period_s(samples.time_s, samples.columns[field.name])
    return max(max_gap_s(interval_ms), MAX_GAP_UPDATES * period if period else 0.0)


class Rails:
    """The power and energy fields of a run, by rail name, and how each rail's energy over a window is had."""

    def __init__(self, samples: Samples, interval_ms: float) -> None:
        self.samples = samples
        self.power: Dict[str, Field] = {f.key: f for f in samples.group(POWER)}
        self.averaged: Dict[str, Field] = {f.key: f for f in samples.group(POWER_AVG)}  # never integrated
        self.energy: Dict[str, Field] = {f.key: f for f in samples.group(ENERGY)}
        self.names = list(dict.fromkeys(list(self.power) + list(self.energy)))
        self.fields = {r: (self.energy.get(r) or self.power[r]) for r in self.names}
        self.total = total_rails(samples.fields)  # the rule the live line's watts follow too
        self.gap = {r: field_gap_s(samples, f, interval_ms) for r, f in self.power.items()}
        self.sample_s = sample_interval_s(samples, interval_ms)
        # how often each source really updates (NVML's counter and instant power: 100 ms; RAPL: faster than we
        # sample; jtop: 2 Hz), declared or learned
        self.resolution: Dict[str, resolution.Resolution] = {
            f.name: resolution.of_field(samples.time_s, samples.columns[f.name], f, self.sample_s)
            for f in list(self.power.values()) + list(self.energy.values()) + list(self.averaged.values())}
        self.counter_period_s: Dict[str, Optional[float]] = {
            r: self.resolution[f.name].period_s for r, f in self.energy.items()}
        self.power_period_s: Dict[str, Optional[float]] = {
            r: self.resolution[f.name].period_s for r, f in self.power.items()}

    def coarse(self, rail: str) -> bool:
        """The counter changes less often than every COARSE_SAMPLES samples (a staircase at our rate), or never
        changed while sampled (its period unknown)."""
        res = self.resolution[self.energy[rail].name]
        if res.period_s is None:
            return res.how == "unknown"
        return res.period_s > COARSE_SAMPLES * self.sample_s

    def resolves(self, rail: str, seconds: float) -> bool:
        """The rail's counter can give the energy of a window this long."""
        if rail not in self.energy:
            return False
        res = self.resolution[self.energy[rail].name]
        if res.how == "unknown":
            return False
        return not self.coarse(rail) or res.resolves(seconds)

    def power_resolves(self, rail: str, seconds: float) -> bool:
        """The rail's power reading changes often enough to be integrated over a window this long."""
        return rail in self.power and self.resolution[self.power[rail].name].resolves(seconds)

    def energy_j(self, rail: str, start: float, end: float) -> Optional[float]:
        return self.spans_j(rail, [(start, end)])[0]

    def spans_j(self, rail: str, spans: Sequence[Window]) -> Tuple[Optional[float], str]:
        """J over the windows (their total length judged against the sources' resolution) and the source: the
        counter where it resolves them, else the power integral where the power reading does; else None with
        "below_resolution" (a power reading too slow for them) or "unresolved" (a counter-only rail)."""
        seconds = sum(b - a for a, b in spans)
        source = self.source_for(rail, seconds)
        if source == "counter":
            value = _sum([self.counter_j(rail, a, b) for a, b in spans])
            if value is not None or rail not in self.power:
                return value, "counter"
            # the counter's samples do not cover the windows: its power reading may, where it resolves them
            source = "power_integral" if self.power_resolves(rail, seconds) else BELOW_RESOLUTION
        if source == "power_integral":
            return _sum([self.integrated_j(rail, a, b) for a, b in spans]), "power_integral"
        return None, source

    def source_for(self, rail: str, seconds: float) -> str:
        """Where a rail's energy over windows this long comes from: "counter", "power_integral", or none of them
        (BELOW_RESOLUTION: a power reading too slow for them; "unresolved": a counter-only rail)."""
        if self.resolves(rail, seconds):
            return "counter"
        if self.power_resolves(rail, seconds):
            return "power_integral"
        return BELOW_RESOLUTION if rail in self.power else "unresolved"

    def code(self, rail: str, source: str) -> str:
        """The short code of a rail's null energy over a window, from `spans_j`'s source."""
        if source == BELOW_RESOLUTION:
            return BELOW_RESOLUTION
        if source == "unresolved":
            period = self.counter_period_s.get(rail)
            return BELOW_RESOLUTION if period is not None else NO_READING
        return NOT_COVERED

    def why(self, rail: str, source: str, seconds: float, samples: Samples, spans: Sequence[Window]) -> str:
        """The sentence for a rail's null energy over windows this long (summary.json)."""
        if source == BELOW_RESOLUTION:
            return f"{rail}: " + resolution.below(self.resolution[self.power[rail].name], seconds)
        if source == "unresolved":
            return self.why_unresolved(rail, seconds)
        return f"{rail}: " + why_null(samples, [self.fields[rail]], spans)

    def why_unresolved(self, rail: str, seconds: float) -> str:
        """Why a rail with no power gauge gives no energy over a window this long."""
        period = self.counter_period_s.get(rail)
        why = (f"{rail}: its energy counter updates every {period * 1000:.0f} ms and resolves only windows of "
               f"{RESOLVE_PERIODS} updates or more (this one is {seconds * 1000:.1f} ms)" if period else
               f"{rail}: its energy counter did not change often enough to learn its update period")
        avg = self.averaged.get(rail)
        if avg is not None:
            why += (f"; the only power reading is {avg.name}, an average over a window longer than the step "
                    f"({avg.note or 'averaged by the source'}), which would smear neighbouring steps together: "
                    f"no instantaneous power (NVML_FI_DEV_POWER_INSTANT) on this GPU or driver")
        else:
            why += "; the source gives no power reading to integrate"
        return why

    def counter_j(self, rail: str, start: float, end: float) -> Optional[float]:
        f = self.energy[rail]
        period = self.counter_period_s.get(rail) or 0.0
        delta = aggregate.counter_delta(self.samples.time_s, self.samples.columns[f.name], start, end,
                                        coarse=self.coarse(rail), extend_s=EXTEND_PERIODS * period)
        return None if delta is None else delta * f.scale

    def integrated_j(self, rail: str, start: float, end: float) -> Optional[float]:
        f = self.power[rail]
        times, values = self.samples.time_s, self.samples.columns[f.name]
        if f.window_mean:
            area = aggregate.window_mean_integral(times, values, start, end, self.gap[rail],
                                                  self.power_period_s.get(rail))
        else:
            area = aggregate.integral(times, values, start, end, self.gap[rail])
        return None if area is None else area * f.scale

    def total_note(self) -> str:
        """How the total is formed, in words, for summary.json."""
        if not self.total:
            return "no rail counts toward the total: " + "; ".join(
                sorted({self.fields[r].note for r in self.names if self.fields[r].note}) or ["none is a total rail"])
        note = f"sum of {', '.join(self.total)}"
        inside = [r for r in self.names if not self.fields[r].total and self.fields[r].job]
        other = [r for r in self.names if not self.fields[r].job]
        if inside:
            note += f"; {', '.join(inside)} lie inside them and are not added"
        if other:
            note += f"; {', '.join(other)} are devices the job does not run on: recorded, not added"
        notes = sorted({self.fields[r].note for r in self.total if self.fields[r].note})
        return note + (f" ({'; '.join(notes)})" if notes else "")


def _sum(values: Sequence[Optional[float]]) -> Optional[float]:
    return None if not values or any(v is None for v in values) else float(sum(values))

def why_null(samples: Samples, fields: Sequence[Field], spans: Sequence[Window]) -> str:
    """Why these fields give no figure over the windows: no sensor in use has them, or they were sampled
    but their samples do not cover the windows (a step marked before the first sample), or have a gap."""
    groups = sorted({f.group for f in samples.fields})
    if not fields:
        return f"no sensor in use gives it (groups sampled: {', '.join(groups) or 'none'})"
    names = ", ".join(f.name for f in fields[:4]) + (", ..." if len(fields) > 4 else "")
    valid = [samples.time_s[~np.isnan(samples.columns[f.name])] for f in fields]
    valid = [t for t in valid if len(t)]
    if not valid:
        return f"sampled ({names}) but the sensor never gave a value"
    first, last = max(t[0] for t in valid), min(t[-1] for t in valid)
    lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
    if lo < first or hi > last:
        return (f"sampled ({names}), but the samples ({first:.3f} s to {last:.3f} s, monotonic) do not cover the "
                f"measured window ({lo:.3f} s to {hi:.3f} s): it began before the first sample or ended after "
                f"the last")
    return (f"sampled ({names}), but the samples leave a gap inside the measured window longer than the gap rule "
            f"allows (a source that stopped answering)")
