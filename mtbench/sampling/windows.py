"""Figures over step windows: CPU and GPU utilization, power and energy per rail, system memory peak.

Used by the training runner and by `mtbench-sample` alike; imports no torch. Energy of a rail over a window
comes from its hardware energy counter where the counter resolves the window (NVML's updates only every
~100 ms: its update period is learned from the samples, and a window shorter than RESOLVE_PERIODS updates
takes the power integral instead), else from integrating its power (trapezoids, the edges interpolated).
Each gauge's gap rule follows that field's own update period (a jtop rail refreshed at 2 Hz is not a gap).
A figure that is null says why: no sensor gives it, or the sensor is there but its samples do not cover
the window.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from mtbench.sampling import aggregate, thermal
from mtbench.sampling.procfs import USER_HZ
from mtbench.sampling.sampler import Samples, StepMark, total_rails
from mtbench.sampling.sensor import ENERGY, GPU_UTIL, POWER, POWER_AVG, Field

# gaps longer than this many sampling intervals (and at least 50 ms) make a gauge's window unknown
MAX_GAP_INTERVALS = 10
# ... or longer than this many of the field's own update periods (a source slower than the sampler)
MAX_GAP_UPDATES = 3
# a coarse counter (it changes less often than every COARSE_SAMPLES samples) is used over a window only when
# the window spans at least this many of its updates; shorter windows take the power integral
COARSE_SAMPLES = 2.0
RESOLVE_PERIODS = 10
SYS_MEM = "sys_mem"  # gauge, bytes: MemTotal - MemAvailable


def max_gap_s(interval_ms: float) -> float:
    return max(0.05, MAX_GAP_INTERVALS * interval_ms / 1000.0)


def field_gap_s(samples: Samples, field: Field, interval_ms: float) -> float:
    """The gap rule for one gauge: the sampler's, widened to MAX_GAP_UPDATES of the field's own update period."""
    period = aggregate.update_period_s(samples.time_s, samples.columns[field.name])
    return max(max_gap_s(interval_ms), MAX_GAP_UPDATES * period if period else 0.0)


Window = Tuple[float, float]  # (start_s, end_s) on the monotonic clock


def _counter_sum(samples: Samples, name: str, spans: Sequence[Window]) -> Optional[float]:
    """A counter's growth summed over several windows (the steps, without the gaps between them)."""
    deltas = [aggregate.counter_delta(samples.time_s, samples.columns[name], a, b) for a, b in spans]
    return None if not deltas or any(d is None for d in deltas) else float(sum(deltas))


def cpu_utilization(samples: Samples, spans: Sequence[Window]) -> Optional[Dict[str, Any]]:
    """Per-core and mean busy % over the windows from /proc/stat tick deltas (exact up to a tick an edge)."""
    busy_fields = samples.group("cpu_busy")
    total_by_core = {f.key: f for f in samples.group("cpu_total")}
    if not busy_fields:
        return None
    per_core: List[Optional[float]] = []
    busy_sum = total_sum = 0.0
    for f in busy_fields:
        busy = _counter_sum(samples, f.name, spans)
        total = _counter_sum(samples, total_by_core[f.key].name, spans)
        if busy is None or total is None or total <= 0:
            per_core.append(None)
            continue
        per_core.append(min(100.0, 100.0 * busy / total))  # interpolation can overshoot by float noise
        busy_sum += busy
        total_sum += total
    mean = min(100.0, 100.0 * busy_sum / total_sum) if total_sum > 0 else None
    return None if mean is None and not any(c is not None for c in per_core) else {"mean": mean, "per_core": per_core}


def cpu_util_by_core_type(samples: Samples, spans: Sequence[Window],
                          cores: Sequence[Dict[str, Any]]) -> Optional[Dict[str, Dict[str, Any]]]:
    """Busy % per core type (a TX2's 2 Denver2 and 4 Cortex-A57 cores, which the paper reports apart) from
    tick deltas summed over the type's cores; `cores` is env's `jetson.cpu_cores` ([{cpu, type}, ...]).
    For summary.json's `cpu_util_pct.by_core_type`: {type: {mean, cpus}}; None without types or samples."""
    types = {str(c["cpu"]): c.get("type") for c in cores if c.get("type")}
    totals = {f.key: f for f in samples.group("cpu_total")}
    sums: Dict[str, List[float]] = {}
    cpus: Dict[str, List[int]] = {}
    for f in samples.group("cpu_busy"):
        kind = types.get(f.key)
        if kind is None or f.key not in totals:
            continue
        busy, total = _counter_sum(samples, f.name, spans), _counter_sum(samples, totals[f.key].name, spans)
        cpus.setdefault(kind, []).append(int(f.key))
        acc = sums.setdefault(kind, [0.0, 0.0])
        if busy is None or total is None or acc[1] < 0:
            acc[1] = -1.0  # one core without figures: the type's mean is unknown
            continue
        acc[0] += busy
        acc[1] += total
    if not cpus:
        return None
    return {kind: {"mean": min(100.0, 100.0 * b / t) if t > 0 else None, "cpus": cpus[kind]}
            for kind, (b, t) in sums.items()}


def process_cpu_pct(samples: Samples, spans: Sequence[Window]) -> Optional[float]:
    """CPU time of the measured process (tree) over the windows, in % of one core (can exceed 100)."""
    fields = samples.group("proc_cpu")
    seconds = sum(b - a for a, b in spans)
    if not fields or seconds <= 0:
        return None
    ticks = _counter_sum(samples, fields[0].name, spans)
    return None if ticks is None else 100.0 * ticks / USER_HZ / seconds


def system_memory_peak_bytes(samples: Samples, spans: Sequence[Window]) -> Optional[int]:
    """The highest MemTotal - MemAvailable sampled inside the windows (the samples just outside a window
    stand in for one too short to hold a sample)."""
    fields = samples.group(SYS_MEM)
    if not fields or not spans:
        return None
    t, v = samples.time_s, samples.columns[fields[0].name]
    ok = ~np.isnan(v)
    inside = np.zeros(len(t), dtype=bool)
    for a, b in spans:
        here = (t >= a) & (t <= b) & ok
        if not here.any():  # bracket the window with its neighbours
            before, after = np.nonzero(ok & (t < a))[0], np.nonzero(ok & (t > b))[0]
            if not len(before) or not len(after):
                return None
            here[before[-1]] = here[after[0]] = True
        inside |= here
    return int(np.max(v[inside]))


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
        gaps = np.diff(samples.time_s)
        self.sample_s = float(np.median(gaps)) if len(gaps) else interval_ms / 1000.0
        # how often each counter really changes (NVML: ~100 ms; RAPL: faster than we sample)
        self.counter_period_s: Dict[str, Optional[float]] = {
            r: aggregate.update_period_s(samples.time_s, samples.columns[f.name], changes=True)
            for r, f in self.energy.items()}
        # how often each power gauge really changes (NVML's instantaneous field: every few ms; jtop: 2 Hz)
        self.power_period_s: Dict[str, Optional[float]] = {
            r: aggregate.update_period_s(samples.time_s, samples.columns[f.name], changes=True)
            for r, f in self.power.items()}

    def coarse(self, rail: str) -> bool:
        """The counter changes less often than every COARSE_SAMPLES samples: it is a staircase at our rate."""
        period = self.counter_period_s.get(rail)
        return period is None or period > COARSE_SAMPLES * self.sample_s

    def resolves(self, rail: str, seconds: float) -> bool:
        """The rail's counter can give the energy of a window this long."""
        period = self.counter_period_s.get(rail)
        if rail not in self.energy or period is None:
            return False
        return not self.coarse(rail) or seconds >= RESOLVE_PERIODS * period

    def energy_j(self, rail: str, start: float, end: float) -> Optional[float]:
        return self.spans_j(rail, [(start, end)])[0]

    def spans_j(self, rail: str, spans: Sequence[Window]) -> Tuple[Optional[float], str]:
        """J over the windows and the source: the counter where it resolves their length, else the power
        integral; a counter-only rail that does not resolve them gives None ("unresolved")."""
        seconds = sum(b - a for a, b in spans)
        if self.resolves(rail, seconds):
            value = _sum([self.counter_j(rail, a, b) for a, b in spans])
            if value is not None or rail not in self.power:
                return value, "counter"
        if rail in self.power:
            return _sum([self.integrated_j(rail, a, b) for a, b in spans]), "power_integral"
        return None, "unresolved"

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
        delta = aggregate.counter_delta(self.samples.time_s, self.samples.columns[f.name], start, end,
                                        coarse=self.coarse(rail))
        return None if delta is None else delta * f.scale

    def integrated_j(self, rail: str, start: float, end: float) -> Optional[float]:
        f = self.power[rail]
        integrate = aggregate.window_mean_integral if f.window_mean else aggregate.integral
        area = integrate(self.samples.time_s, self.samples.columns[f.name], start, end, self.gap[rail])
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


def gpu_utilization(samples: Samples, spans: Sequence[Window], interval_ms: float) -> Optional[Dict[str, Any]]:
    """Busy % per GPU over the windows; the mean covers only the GPUs the job runs on."""
    fields = samples.group(GPU_UTIL)
    seconds = sum(b - a for a, b in spans)
    if not fields or seconds <= 0:
        return None
    per_gpu = {}
    for f in fields:
        gap = field_gap_s(samples, f, interval_ms)
        areas = [aggregate.integral(samples.time_s, samples.columns[f.name], a, b, gap) for a, b in spans]
        per_gpu[f.key] = None if any(x is None for x in areas) else sum(areas) / seconds * f.scale
    counted = [f.key for f in fields if f.job]
    known = [per_gpu[k] for k in counted if per_gpu[k] is not None]
    if not any(v is not None for v in per_gpu.values()):
        return None
    out: Dict[str, Any] = {"mean": sum(known) / len(known) if known else None, "per_gpu": per_gpu}
    if len(counted) < len(fields):
        out["counted"] = counted  # the job's GPUs; the others are recorded beside them
    return out


# the sample groups behind each figure, for the reason a figure is null
FIGURE_GROUPS = {"cpu_util_pct": ["cpu_busy", "cpu_total"], "process_cpu_pct": ["proc_cpu"],
                 "gpu_util_pct": [GPU_UTIL], "power_w": [POWER, ENERGY], "energy_j": [POWER, ENERGY],
                 "mem_system_peak_bytes": [SYS_MEM]}


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


def summarize(samples: Samples, marks: Sequence[StepMark], interval_ms: float) -> Dict[str, Any]:
    """The contract's telemetry figures over the measured (non-warm-up) steps, and why any is null."""
    measured = [m for m in marks if not m.warmup]
    out: Dict[str, Any] = {"cpu_util_pct": None, "process_cpu_pct": None, "gpu_util_pct": None,
                           "power_w": None, "energy_j": None, "mem_system_peak_bytes": None}
    if not measured or len(samples) < 2:
        reason = "no measured step" if not measured else f"too few samples ({len(samples)})"
        out["unavailable"] = {k: reason for k in out}
        return out
    # over the steps themselves: any gap between them (a data loader, logging) is not counted
    spans = [(m.start_s, m.end_s) for m in measured]
    out["cpu_util_pct"] = cpu_utilization(samples, spans)
    out["process_cpu_pct"] = process_cpu_pct(samples, spans)
    out["gpu_util_pct"] = gpu_utilization(samples, spans, interval_ms)
    out["mem_system_peak_bytes"] = system_memory_peak_bytes(samples, spans)
    rails = Rails(samples, interval_ms)
    unavailable: Dict[str, str] = {}
    if rails.names:
        by_rail, source = {}, {}
        for r in rails.names:
            by_rail[r], source[r] = rails.spans_j(r, spans)
        busy_s = sum(m.end_s - m.start_s for m in measured)
        total = _sum([by_rail[r] for r in rails.total]) if rails.total else None
        if any(v is not None for v in by_rail.values()):
            out["power_w"] = {r: (None if e is None else e / busy_s) for r, e in by_rail.items()}
            out["energy_j"] = {
                "per_step_mean": None if total is None else total / len(measured),
                "total": total,
                "by_rail": by_rail,
                "total_rails": rails.total,  # the rails whose sum is `total` (sub-rails lie inside them)
                "total_note": rails.total_note(),
                "by_rail_from_power": {r: _sum([rails.integrated_j(r, a, b) for a, b in spans])
                                       for r in rails.energy if r in rails.power},
                "source_by_rail": source,
                "counter_update_period_s": {r: rails.counter_period_s[r] for r in rails.energy},
                "power_update_period_s": dict(rails.power_period_s),
            }
            if total is None:
                missing = [r for r in rails.total if by_rail[r] is None]
                unavailable["energy_j.total"] = "; ".join(
                    rails.why_unresolved(r, busy_s) if source[r] == "unresolved" else
                    f"{r}: " + why_null(samples, [rails.fields[r]], spans) for r in missing) or rails.total_note()
        elif any(r not in rails.power for r in rails.names):
            unavailable["energy_j"] = "; ".join(rails.why_unresolved(r, busy_s)
                                                for r in rails.names if r not in rails.power)
    gpu = out["gpu_util_pct"]
    if gpu is not None and gpu["mean"] is None:
        others = [f for f in samples.group(GPU_UTIL) if not f.job]
        unavailable["gpu_util_pct.mean"] = (
            "; ".join(sorted({f.note for f in others if f.note})) or "none of the sampled GPUs is the job's"
            if len(others) == len(samples.group(GPU_UTIL))
            else why_null(samples, [f for f in samples.group(GPU_UTIL) if f.job], spans))
    for key, groups in FIGURE_GROUPS.items():
        if out[key] is None and key not in unavailable:
            fields = [f for f in samples.fields if f.group in groups]
            unavailable[key] = why_null(samples, fields, spans)
    out["unavailable"] = unavailable
    return out


def step_rows(marks: Sequence[StepMark], samples: Samples, interval_ms: float,
              cores: Optional[Sequence[Dict[str, Any]]] = None) -> Tuple[List[str], List[list]]:
    """steps.csv: one row per step with its duration, CPU / GPU figures and energy per rail; with `cores` (env's
    `jetson.cpu_cores`, each core's type) also the busy % per core type (`cpu_util_pct_denver2`, ...)."""
    rails = Rails(samples, interval_ms)
    whole = cpu_util_by_core_type(samples, [(m.start_s, m.end_s) for m in marks], cores) if cores and marks else None
    types = sorted(whole) if whole else []
    header = ["index", "start_s", "end_s", "duration_s", "warmup", "cpu_util_pct", "process_cpu_pct",
              "gpu_util_pct"] + [f"cpu_util_pct_{t}" for t in types] + [f"energy_j_{r}" for r in rails.names] + \
        (["energy_j_total", "energy_j_null_reason"] if rails.names else [])
    rows = []
    for m in marks:
        span = [(m.start_s, m.end_s)]
        cpu = cpu_utilization(samples, span)
        gpu = gpu_utilization(samples, span, interval_ms)
        energies = [rails.energy_j(r, m.start_s, m.end_s) for r in rails.names]
        by_type = (cpu_util_by_core_type(samples, span, cores) or {}) if types and cores else {}
        row = [m.index, f"{m.start_s:.6f}", f"{m.end_s:.6f}", f"{m.end_s - m.start_s:.6f}", int(m.warmup),
               _round(cpu and cpu["mean"]), _round(process_cpu_pct(samples, span)),
               _round(gpu and gpu["mean"])] + [_round((by_type.get(t) or {}).get("mean")) for t in types] + \
            [_round(e, 6) for e in energies]
        if rails.names:
            total = _sum([e for r, e in zip(rails.names, energies) if r in rails.total])
            row += [_round(total, 6), "" if total is not None else _step_null_reason(rails, energies, m)]
        rows.append(row)
    thermal_header, thermal_rows = thermal.step_columns(samples, marks)  # none without the thermal sensor
    return header + thermal_header, [row + more for row, more in zip(rows, thermal_rows)]


def _step_null_reason(rails: Rails, energies: Sequence[Optional[float]], mark: StepMark) -> str:
    """Why a step has no total energy, in one cell of steps.csv."""
    if not rails.total:
        return rails.total_note()
    seconds = mark.end_s - mark.start_s
    reasons = [rails.why_unresolved(r, seconds) if r not in rails.power else
               f"{r}: its samples do not cover the step or leave a gap in it"
               for r, e in zip(rails.names, energies) if r in rails.total and e is None]
    return "; ".join(reasons)


def _round(v: Optional[float], digits: int = 2) -> Optional[float]:
    return None if v is None else round(v, digits)
