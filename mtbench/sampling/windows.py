"""Figures over step windows: CPU and GPU utilization, power and energy per rail, system memory peak.

Used by the training runner and by `mtbench-sample` alike; imports no torch. Every power, energy and utilisation
source has a time resolution (sampling/resolution.py: declared by the device or its documentation, else learned),
and a figure over a window is given only where the window spans RESOLVE_PERIODS of its source's updates: a step
or an operation below that is null with a short code, the job's totals over the whole measured time are given
where that time spans them. Energy of a rail over a window comes from its hardware energy counter where the
counter resolves the window (NVML's updates only every ~100 ms), else from integrating its power (trapezoids,
the edges interpolated) where the power reading resolves it (the rails' rules: sampling/rails.py).
Each gauge's gap rule follows that field's own update period (a jtop rail refreshed at 2 Hz is not a gap).
A figure that is null says why: no sensor gives it, or the sensor is there but its samples do not cover
the window.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from mtbench.sampling import aggregate, resolution, thermal
from mtbench.sampling.procfs import USER_HZ
from mtbench.sampling.rails import Rails, Window, _sum, field_gap_s, sample_interval_s, why_null
from mtbench.sampling.resolution import BELOW_RESOLUTION, NO_TOTAL_RAIL, NOT_COVERED
from mtbench.sampling.sampler import Samples, StepMark
from mtbench.sampling.sensor import ENERGY, GPU_UTIL, POWER

SYS_MEM = "sys_mem"  # gauge, bytes: MemTotal - MemAvailable
PROC_ANON = "proc_anon"  # gauge, bytes: the training process's RssAnon


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
    return gauge_peak(samples, SYS_MEM, spans)


def training_memory_peak_bytes(samples: Samples, spans: Sequence[Window]) -> Optional[int]:
    """Training memory: the highest anonymous resident size (RssAnon) of the training process sampled inside the
    windows. It leaves out the file-backed pages (the libraries' code) that VmHWM counts, whose number follows
    the page cache, not the training (docs/memory.md)."""
    return gauge_peak(samples, PROC_ANON, spans)


def gauge_peak(samples: Samples, group: str, spans: Sequence[Window]) -> Optional[int]:
    """The highest value of the group's first gauge sampled inside the windows."""
    fields = samples.group(group)
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



Resolutions = Dict[str, resolution.Resolution]  # by field name


def util_resolution(samples: Samples, interval_ms: float) -> Resolutions:
    """The resolution of each GPU utilisation field, by field name (learning one reads all its samples: a caller
    that judges many windows computes this once and passes it on)."""
    sample_s = sample_interval_s(samples, interval_ms)
    return {f.name: resolution.of_field(samples.time_s, samples.columns[f.name], f, sample_s)
            for f in samples.group(GPU_UTIL)}


def util_below(samples: Samples, spans: Sequence[Window], interval_ms: float,
               resolutions: Optional[Resolutions] = None) -> Optional[str]:
    """The sentence where the job's GPU utilisation sources do not resolve windows this long, else None."""
    seconds = sum(b - a for a, b in spans)
    resolutions = util_resolution(samples, interval_ms) if resolutions is None else resolutions
    slow = [resolutions[f.name] for f in samples.group(GPU_UTIL) if f.job and not resolutions[f.name].resolves(seconds)]
    return "; ".join(resolution.below(r, seconds) for r in slow) or None


def _read_back_s(times: np.ndarray, values: np.ndarray, res: resolution.Resolution,
                 interval_ms: float) -> Optional[float]:
    """How far back a window-mean reading reaches: its learned update period, at most the declared one."""
    learned = resolution.learned_period_s(times, values, interval_ms / 1000.0)
    known = [p for p in (learned, res.period_s) if p]
    return min(known) if known else None


def gpu_utilization(samples: Samples, spans: Sequence[Window], interval_ms: float,
                    resolutions: Optional[Resolutions] = None) -> Optional[Dict[str, Any]]:
    """Busy % per GPU over the windows (null for a GPU whose source does not resolve them); the mean covers only
    the GPUs the job runs on."""
    fields = samples.group(GPU_UTIL)
    seconds = sum(b - a for a, b in spans)
    if not fields or seconds <= 0:
        return None
    per_gpu = {}
    resolutions = util_resolution(samples, interval_ms) if resolutions is None else resolutions
    for f in fields:
        if not resolutions[f.name].resolves(seconds):
            per_gpu[f.key] = None
            continue
        gap = field_gap_s(samples, f, interval_ms)
        times, values = samples.time_s, samples.columns[f.name]
        if f.window_mean:
            # each value is the busy share of the period before it was renewed (NVML: 1/6 s to 1 s by product):
            # read back by that period, learned from the changes where they are frequent, at most the declared
            period = _read_back_s(times, values, resolutions[f.name], interval_ms)
            areas = [aggregate.window_mean_integral(times, values, a, b, gap, period) for a, b in spans]
        else:
            areas = [aggregate.integral(times, values, a, b, gap) for a, b in spans]
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
                 "mem_system_peak_bytes": [SYS_MEM], "mem_training_bytes": [PROC_ANON]}


def summarize(samples: Samples, marks: Sequence[StepMark], interval_ms: float) -> Dict[str, Any]:
    """The contract's telemetry figures over the measured (non-warm-up) steps, and why any is null."""
    measured = [m for m in marks if not m.warmup]
    out: Dict[str, Any] = {"cpu_util_pct": None, "process_cpu_pct": None, "gpu_util_pct": None,
                           "power_w": None, "energy_j": None, "mem_system_peak_bytes": None,
                           "mem_training_bytes": None}
    if not measured or len(samples) < 2:
        reason = "no measured step" if not measured else f"too few samples ({len(samples)})"
        out["unavailable"] = {k: reason for k in out}
        return out
    # over the steps themselves: any gap between them (a data loader, logging) is not counted
    spans = [(m.start_s, m.end_s) for m in measured]
    out["cpu_util_pct"] = cpu_utilization(samples, spans)
    out["process_cpu_pct"] = process_cpu_pct(samples, spans)
    utils = util_resolution(samples, interval_ms)
    shortest = min(m.end_s - m.start_s for m in measured)  # the shortest step: the per-step figures' test
    out["gpu_util_pct"] = gpu_utilization(samples, spans, interval_ms, utils)
    out["mem_system_peak_bytes"] = system_memory_peak_bytes(samples, spans)
    out["mem_training_bytes"] = training_memory_peak_bytes(samples, spans)
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
                    rails.why(r, source[r], busy_s, samples, spans) for r in missing) or rails.total_note()
        else:
            unavailable["energy_j"] = "; ".join(rails.why(r, source[r], busy_s, samples, spans)
                                                for r in rails.names)
        # a step's energy where the steps are shorter than the sources resolve: one sentence per source here,
        # the short code in each row of steps.csv
        step_source = {r: rails.source_for(r, shortest) for r in rails.total or rails.names}
        steps_below = sorted(r for r, source in step_source.items() if source in (BELOW_RESOLUTION, "unresolved")
                             and (rails.counter_period_s.get(r) or rails.power_period_s.get(r)))
        if steps_below:
            unavailable["steps.energy_j"] = "; ".join(
                rails.why(r, step_source[r], shortest, samples, spans) for r in steps_below)
    util_slow = util_below(samples, spans, interval_ms, utils)
    if util_slow is not None:
        unavailable["gpu_util_pct"] = util_slow
    if utils:
        step_slow = util_below(samples, [(0.0, shortest)], interval_ms, utils)
        if step_slow is not None:
            unavailable["steps.gpu_util_pct"] = step_slow
    gpu = out["gpu_util_pct"]
    if gpu is not None and gpu["mean"] is None and "gpu_util_pct" not in unavailable:
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
    out["resolution"] = {**{name: r.as_dict() for name, r in rails.resolution.items()},
                         **{name: r.as_dict() for name, r in utils.items()}}
    return out


def step_rows(marks: Sequence[StepMark], samples: Samples, interval_ms: float,
              cores: Optional[Sequence[Dict[str, Any]]] = None) -> Tuple[List[str], List[list]]:
    """steps.csv: one row per step with its duration, CPU / GPU figures and energy per rail; with `cores` (env's
    `jetson.cpu_cores`, each core's type) also the busy % per core type (`cpu_util_pct_denver2`, ...)."""
    rails = Rails(samples, interval_ms)
    whole = cpu_util_by_core_type(samples, [(m.start_s, m.end_s) for m in marks], cores) if cores and marks else None
    types = sorted(whole) if whole else []
    utils = samples.group(GPU_UTIL)
    util_res = util_resolution(samples, interval_ms)  # once: learning a resolution reads every sample
    header = ["index", "start_s", "end_s", "duration_s", "warmup", "cpu_util_pct", "process_cpu_pct",
              "gpu_util_pct"] + (["gpu_util_pct_null_reason"] if utils else []) + \
        [f"cpu_util_pct_{t}" for t in types] + [f"energy_j_{r}" for r in rails.names] + \
        (["energy_j_total", "energy_j_null_reason"] if rails.names else [])
    rows = []
    for m in marks:
        span = [(m.start_s, m.end_s)]
        cpu = cpu_utilization(samples, span)
        gpu = gpu_utilization(samples, span, interval_ms, util_res)
        gpu_mean = gpu and gpu["mean"]
        found = [rails.spans_j(r, span) for r in rails.names]
        energies = [e for e, _ in found]
        by_type = (cpu_util_by_core_type(samples, span, cores) or {}) if types and cores else {}
        row = [m.index, f"{m.start_s:.6f}", f"{m.end_s:.6f}", f"{m.end_s - m.start_s:.6f}", int(m.warmup),
               _round(cpu and cpu["mean"]), _round(process_cpu_pct(samples, span)), _round(gpu_mean)]
        if utils:  # the short code; summary.json's unavailable["steps.gpu_util_pct"] holds the sentence
            row.append("" if gpu_mean is not None else
                       BELOW_RESOLUTION if util_below(samples, span, interval_ms, util_res) else NOT_COVERED)
        row += [_round((by_type.get(t) or {}).get("mean")) for t in types] + [_round(e, 6) for e in energies]
        if rails.names:
            total = _sum([e for r, e in zip(rails.names, energies) if r in rails.total])
            row += [_round(total, 6), "" if total is not None else _step_null_code(rails, found)]
        rows.append(row)
    thermal_header, thermal_rows = thermal.step_columns(samples, marks)  # none without the thermal sensor
    return header + thermal_header, [row + more for row, more in zip(rows, thermal_rows)]


def _step_null_code(rails: Rails, found: Sequence[Tuple[Optional[float], str]]) -> str:
    """The short code of a step without total energy, in one cell of steps.csv (summary.json's unavailable
    ["steps.energy_j"] holds the sentence per source)."""
    if not rails.total:
        return NO_TOTAL_RAIL
    codes = [rails.code(r, source) for r, (e, source) in zip(rails.names, found) if r in rails.total and e is None]
    return codes[0] if codes else NOT_COVERED


def _round(v: Optional[float], digits: int = 2) -> Optional[float]:
    return None if v is None else round(v, digits)
