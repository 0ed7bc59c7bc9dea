"""Figures over step windows: CPU and GPU utilization, power and energy per rail.

Used by the training runner and by `mtbench-sample` alike; imports no torch. Energy of a rail over a window
comes from its hardware energy counter where it has one (NVML, RAPL), else from integrating its power
(trapezoids, the edges interpolated); where both exist both are kept.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from mtbench.sampling import aggregate
from mtbench.sampling.procfs import USER_HZ
from mtbench.sampling.sampler import Samples, StepMark
from mtbench.sampling.sensor import ENERGY, GPU_UTIL, POWER, Field

# gaps longer than this many sampling intervals (and at least 50 ms) make a gauge's window unknown
MAX_GAP_INTERVALS = 10


def max_gap_s(interval_ms: float) -> float:
    return max(0.05, MAX_GAP_INTERVALS * interval_ms / 1000.0)


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
    return {"mean": mean, "per_core": per_core}


def process_cpu_pct(samples: Samples, spans: Sequence[Window]) -> Optional[float]:
    """CPU time of the measured process (tree) over the windows, in % of one core (can exceed 100)."""
    fields = samples.group("proc_cpu")
    seconds = sum(b - a for a, b in spans)
    if not fields or seconds <= 0:
        return None
    ticks = _counter_sum(samples, fields[0].name, spans)
    return None if ticks is None else 100.0 * ticks / USER_HZ / seconds


class Rails:
    """The power and energy fields of a run, by rail name."""

    def __init__(self, samples: Samples, interval_ms: float) -> None:
        self.samples = samples
        self.gap = max_gap_s(interval_ms)
        self.power: Dict[str, Field] = {f.key: f for f in samples.group(POWER)}
        self.energy: Dict[str, Field] = {f.key: f for f in samples.group(ENERGY)}
        self.names = list(dict.fromkeys(list(self.power) + list(self.energy)))
        self.total = [r for r in self.names if (self.energy.get(r) or self.power[r]).total]

    def energy_j(self, rail: str, start: float, end: float) -> Optional[float]:
        """J over the window: the counter's delta where the rail has one, else the power integral."""
        if rail in self.energy:
            return self.counter_j(rail, start, end)
        return self.integrated_j(rail, start, end)

    def counter_j(self, rail: str, start: float, end: float) -> Optional[float]:
        f = self.energy[rail]
        delta = aggregate.counter_delta(self.samples.time_s, self.samples.columns[f.name], start, end)
        return None if delta is None else delta * f.scale

    def integrated_j(self, rail: str, start: float, end: float) -> Optional[float]:
        f = self.power[rail]
        area = aggregate.integral(self.samples.time_s, self.samples.columns[f.name], start, end, self.gap)
        return None if area is None else area * f.scale


def _sum(values: Sequence[Optional[float]]) -> Optional[float]:
    return None if not values or any(v is None for v in values) else float(sum(values))


def gpu_utilization(samples: Samples, spans: Sequence[Window], interval_ms: float) -> Optional[Dict[str, Any]]:
    fields = samples.group(GPU_UTIL)
    seconds = sum(b - a for a, b in spans)
    if not fields or seconds <= 0:
        return None
    per_gpu = {}
    for f in fields:
        areas = [aggregate.integral(samples.time_s, samples.columns[f.name], a, b, max_gap_s(interval_ms))
                 for a, b in spans]
        per_gpu[f.key] = None if any(x is None for x in areas) else sum(areas) / seconds * f.scale
    known = [v for v in per_gpu.values() if v is not None]
    return {"mean": sum(known) / len(known) if known else None, "per_gpu": per_gpu}


def summarize(samples: Samples, marks: Sequence[StepMark], interval_ms: float) -> Dict[str, Any]:
    """The contract's telemetry figures over the measured (non-warm-up) steps, and why any is null."""
    measured = [m for m in marks if not m.warmup]
    sensors = sorted({f.group for f in samples.fields})
    out: Dict[str, Any] = {"cpu_util_pct": None, "process_cpu_pct": None, "gpu_util_pct": None,
                           "power_w": None, "energy_j": None}
    if not measured or len(samples) < 2:
        reason = "no measured step" if not measured else "too few samples"
        out["unavailable"] = {k: reason for k in out}
        return out
    # over the steps themselves: any gap between them (a data loader, logging) is not counted
    spans = [(m.start_s, m.end_s) for m in measured]
    out["cpu_util_pct"] = cpu_utilization(samples, spans)
    out["process_cpu_pct"] = process_cpu_pct(samples, spans)
    out["gpu_util_pct"] = gpu_utilization(samples, spans, interval_ms)
    rails = Rails(samples, interval_ms)
    if rails.names:
        per_step = {r: [rails.energy_j(r, m.start_s, m.end_s) for m in measured] for r in rails.names}
        by_rail = {r: _sum(v) for r, v in per_step.items()}
        busy_s = sum(m.end_s - m.start_s for m in measured)
        total = _sum([by_rail[r] for r in rails.total])
        out["power_w"] = {r: (None if e is None else e / busy_s) for r, e in by_rail.items()}
        out["energy_j"] = {
            "per_step_mean": None if total is None else total / len(measured),
            "total": total,
            "by_rail": by_rail,
            "total_rails": rails.total,  # the rails whose sum is `total` (sub-rails lie inside them)
            "by_rail_from_power": {r: _sum([rails.integrated_j(r, m.start_s, m.end_s) for m in measured])
                                   for r in rails.energy if r in rails.power},
            "source_by_rail": {r: "counter" if r in rails.energy else "power_integral" for r in rails.names},
        }
    no_sensor = f"no sensor in use gives it (groups sampled: {', '.join(sensors) or 'none'})"
    out["unavailable"] = {k: (no_sensor if v is None else None) for k, v in out.items()}
    out["unavailable"] = {k: v for k, v in out["unavailable"].items() if v}
    return out


def step_rows(marks: Sequence[StepMark], samples: Samples, interval_ms: float) -> Tuple[List[str], List[list]]:
    """steps.csv: one row per step with its duration, CPU / GPU figures and energy per rail."""
    rails = Rails(samples, interval_ms)
    header = ["index", "start_s", "end_s", "duration_s", "warmup", "cpu_util_pct", "process_cpu_pct",
              "gpu_util_pct"] + [f"energy_j_{r}" for r in rails.names] + (["energy_j_total"] if rails.names else [])
    rows = []
    for m in marks:
        span = [(m.start_s, m.end_s)]
        cpu = cpu_utilization(samples, span)
        gpu = gpu_utilization(samples, span, interval_ms)
        energies = [rails.energy_j(r, m.start_s, m.end_s) for r in rails.names]
        row = [m.index, f"{m.start_s:.6f}", f"{m.end_s:.6f}", f"{m.end_s - m.start_s:.6f}", int(m.warmup),
               _round(cpu and cpu["mean"]), _round(process_cpu_pct(samples, span)),
               _round(gpu and gpu["mean"])] + [_round(e, 6) for e in energies]
        if rails.names:
            row.append(_round(_sum([e for r, e in zip(rails.names, energies) if r in rails.total]), 6))
        rows.append(row)
    return header, rows


def _round(v: Optional[float], digits: int = 2) -> Optional[float]:
    return None if v is None else round(v, digits)
