"""Joining operation (or layer) intervals with the telemetry: time, power, energy and utilization per name.

Framework-agnostic: intervals are (name, start_s, end_s) on the sampler's monotonic clock, whoever
recorded them. Energy is attributed without double counting: the timeline is cut at every interval edge,
and the energy of each piece (the rail's power integrated over it) is split evenly among the intervals
active during it. A rail's coarse energy counter (NVML's, updated every ~100 ms) cannot resolve operations:
its power is integrated instead (a counter-only rail whose counter is coarse gives no per-operation energy,
and the check's `energy_unavailable` says why, e.g. NVML's only power reading is a 1 s average).
The energy of step time that no interval covers goes to one "[no op]" row, so the rows
add up to the steps' energy.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mtbench.sampling import aggregate, resolution, windows
from mtbench.sampling.resolution import BELOW_RESOLUTION
from mtbench.sampling.sampler import Samples
from mtbench.sampling.sensor import GPU_UTIL
from mtbench.sampling.windows import Rails

UNCOVERED = "[no op]"


@dataclass
class Interval:
    name: str
    start_s: float
    end_s: float
    device: str = "cpu"  # which timeline it is on: "cpu" (host ops) or "cuda" (kernels)


def cumulative(times: np.ndarray, values: np.ndarray, query: np.ndarray, counter: bool,
               window_mean: bool = False, period_s: Optional[float] = None) -> Optional[np.ndarray]:
    """F(query): a counter's interpolated value, or a gauge's integral from times[0] (trapezoids, exact for
    the piecewise-linear signal through the samples; for a `window_mean` gauge, its staircase read back by its
    update period `period_s`, or to the previous change). None when the rail has no valid sample."""
    if window_mean and not counter:
        cum = aggregate.window_mean_cumulative(times, values, period_s)
        return None if cum is None else np.interp(query, *cum)
    ok = ~np.isnan(values)
    t, v = times[ok], values[ok]
    if len(t) < 2:
        return None
    if counter:
        return np.interp(query, t, v)
    area = np.concatenate(([0.0], np.cumsum((v[1:] + v[:-1]) * np.diff(t) / 2.0)))
    q = np.clip(query, t[0], t[-1])
    i = np.clip(np.searchsorted(t, q, side="right") - 1, 0, len(t) - 2)
    v_q = v[i] + (v[i + 1] - v[i]) * (q - t[i]) / (t[i + 1] - t[i])
    return area[i] + (v[i] + v_q) * (q - t[i]) / 2.0


def attribute(intervals: Sequence[Interval], steps: Sequence[Tuple[float, float]], samples: Samples,
              interval_ms: float) -> Tuple[List[str], List[list], Dict[str, Optional[float]]]:
    """Rows for ops.csv / layers.csv and a check {steps_energy_j, rows_energy_j, coverage}."""
    rails = Rails(samples, interval_ms)
    step_time = sum(b - a for a, b in steps)
    names = list(OrderedDict.fromkeys(iv.name for iv in intervals))
    index = {n: i for i, n in enumerate(names)}
    starts = np.array([iv.start_s for iv in intervals], dtype=float)
    ends = np.array([iv.end_s for iv in intervals], dtype=float)
    ids = np.array([index[iv.name] for iv in intervals], dtype=int)
    durations = ends - starts
    n = len(names)

    # cut the timeline at every edge (intervals and steps); k = how many intervals cover each piece
    edges = np.unique(np.concatenate([starts, ends, [a for a, _ in steps], [b for _, b in steps]]))
    k = np.zeros(len(edges), dtype=float)
    np.add.at(k, np.searchsorted(edges, starts), 1)
    np.add.at(k, np.searchsorted(edges, ends), -1)
    k = np.cumsum(k)[:-1]  # pieces [edges[j], edges[j+1])
    in_step = np.zeros(len(edges) - 1, dtype=bool)
    for a, b in steps:
        in_step |= (edges[:-1] >= a) & (edges[1:] <= b)
    s_idx, e_idx = np.searchsorted(edges, starts), np.searchsorted(edges, ends)

    def per_name(values: np.ndarray) -> np.ndarray:
        out = np.zeros(n)
        np.add.at(out, ids, values)
        return out

    calls = per_name(np.ones(len(intervals)))
    total_s = per_name(durations)
    columns: "OrderedDict[str, List[Optional[float]]]" = OrderedDict()
    energy_total = np.zeros(n + 1)
    steps_energy = 0.0
    total_known = bool(rails.total)
    unavailable: Dict[str, str] = {}  # rail -> why it gives no per-operation energy
    below: Dict[str, str] = {}  # rail -> why some operations are too short for it
    unresolved_rows: set = set()
    for rail in rails.names:
        # an operation lasts milliseconds: a counter that updates every 100 ms (NVML) cannot split them, so
        # the power integral does; a counter that changes about every sample (RAPL) is used as it is
        counter = rail in rails.energy and not rails.coarse(rail)
        f = rails.energy[rail] if counter else rails.power.get(rail)
        cum = None if f is None else cumulative(samples.time_s, samples.columns[f.name], edges, counter,
                                                 window_mean=f.window_mean,
                                                 period_s=rails.resolution[f.name].period_s)
        if cum is None:
            if f is None:
                unavailable[rail] = rails.why_unresolved(rail, min((b - a for a, b in steps), default=0.0))
            columns[f"power_w_{rail}"] = [None] * (n + 1)
            columns[f"energy_j_{rail}"] = [None] * (n + 1)
            total_known = total_known and rail not in rails.total
            continue
        piece = np.diff(cum) * f.scale  # J in each piece
        shared = np.where(k > 0, piece / np.maximum(k, 1), 0.0)
        prefix = np.concatenate(([0.0], np.cumsum(shared)))
        energy = per_name(prefix[e_idx] - prefix[s_idx])  # split: no joule counted twice
        whole = per_name(cum[e_idx] - cum[s_idx]) * f.scale  # unsplit: the power while the op ran
        uncovered = float(piece[(k == 0) & in_step].sum())
        power = np.where(total_s > 0, whole / np.maximum(total_s, 1e-12), np.nan)
        # an op whose calls last less than its source resolves (a 100 ms NVML reading under 3 ms kernels): null
        res = rails.resolution.get(f.name)
        short = [res is not None and not res.resolves(total_s[i] / max(calls[i], 1)) for i in range(n)]
        if any(short):
            below[rail] = resolution.below(res, float(min(total_s[i] / max(calls[i], 1)
                                                          for i in range(n) if short[i])))
            unresolved_rows.update(i for i in range(n) if short[i])
        columns[f"power_w_{rail}"] = [None if short[i] else power[i] for i in range(n)] + \
            [uncovered_power(piece, k, in_step, edges)]
        columns[f"energy_j_{rail}"] = [None if short[i] else energy[i] for i in range(n)] + [uncovered]
        if rail in rails.total:
            energy_total += np.concatenate([energy, [uncovered]])
            steps_energy += float(piece[in_step].sum())
    # utilization while each name ran (not split: it is a rate, not an amount)
    cpu = _cpu_during(samples, starts, ends, ids, n)
    gpu = _gauge_during(samples, GPU_UTIL, starts, ends, ids, n, total_s)
    utils = list(windows.util_resolution(samples, interval_ms).values())
    for i in range(n):  # a trailing-mean utilisation (NVML: up to 1 s) says nothing of a 3 ms op
        if any(not r.resolves(total_s[i] / max(calls[i], 1)) for r in utils):
            gpu[i] = None
            unresolved_rows.add(i)
    header = ["name", "device", "calls", "total_s", "share_of_step_time"] + list(columns) + \
             ["energy_j", "cpu_util_pct", "gpu_util_pct", "null_reason"]
    devices = {iv.name: iv.device for iv in intervals}
    covered = _union_length(starts, ends, steps)
    rows = []
    for i, name in enumerate(names):
        short = i in unresolved_rows
        rows.append([name, devices[name], int(calls[i]), total_s[i], total_s[i] / step_time if step_time else None]
                    + [c[i] for c in columns.values()]
                    + [energy_total[i] if total_known and not short else None, cpu[i], gpu[i],
                       BELOW_RESOLUTION if short else ""])
    gap = step_time - covered
    rows.append([UNCOVERED, "", 0, gap, gap / step_time if step_time else None] + [c[n] for c in columns.values()]
                + [energy_total[n] if total_known else None, None, None, ""])
    rows.sort(key=lambda r: -(r[3] or 0))
    check = {"steps_energy_j": steps_energy if total_known and rails.total else None,
             # the rows add up to the steps' energy only where every row has its figure
             "rows_energy_j": float(energy_total.sum()) if total_known and rails.total and not unresolved_rows
             else None,
             "below_resolution": below,
             "coverage": covered / step_time if step_time else None, "step_time_s": step_time,
             "energy_unavailable": unavailable}
    return header, rows, check


def uncovered_power(piece: np.ndarray, k: np.ndarray, in_step: np.ndarray, edges: np.ndarray) -> Optional[float]:
    mask = (k == 0) & in_step
    seconds = float(np.diff(edges)[mask].sum())
    return float(piece[mask].sum()) / seconds if seconds > 0 else None


def _union_length(starts: np.ndarray, ends: np.ndarray, steps: Sequence[Tuple[float, float]]) -> float:
    """Seconds of step time covered by at least one interval."""
    total = 0.0
    for a, b in steps:
        s, e = np.clip(starts, a, b), np.clip(ends, a, b)
        order = np.argsort(s)
        cur_s = cur_e = None
        for x, y in zip(s[order], e[order]):
            if cur_e is None or x > cur_e:
                if cur_e is not None:
                    total += cur_e - cur_s
                cur_s, cur_e = x, y
            else:
                cur_e = max(cur_e, y)
        if cur_e is not None:
            total += cur_e - cur_s
    return total


def _cpu_during(samples: Samples, starts, ends, ids, n) -> List[Optional[float]]:
    busy = samples.group("cpu_busy")
    totals = {f.key: f for f in samples.group("cpu_total")}
    if not busy or not len(starts):
        return [None] * n
    b_sum, t_sum = np.zeros(n), np.zeros(n)
    for f in busy:
        for name, acc in ((f.name, b_sum), (totals[f.key].name, t_sum)):
            values = samples.columns[name]
            ok = ~np.isnan(values)
            if ok.sum() < 2:
                return [None] * n
            delta = np.interp(ends, samples.time_s[ok], values[ok]) - np.interp(starts, samples.time_s[ok], values[ok])
            np.add.at(acc, ids, delta)
    return [100.0 * b / t if t > 0 else None for b, t in zip(b_sum, t_sum)]


def _gauge_during(samples: Samples, group: str, starts, ends, ids, n, total_s) -> List[Optional[float]]:
    fields = samples.group(group)
    if not fields or not len(starts):
        return [None] * n
    acc = np.zeros(n)
    for f in fields:
        cs = cumulative(samples.time_s, samples.columns[f.name], np.concatenate([starts, ends]), counter=False)
        if cs is None:
            return [None] * n
        np.add.at(acc, ids, (cs[len(starts):] - cs[: len(starts)]) * f.scale / len(fields))
    return [a / t if t > 0 else None for a, t in zip(acc, total_s)]
