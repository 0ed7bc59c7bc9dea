"""A figure's point and its error bar: the 95 % interval across repeats where a job was repeated, else p10-p90 of
its own measured steps (steps.csv)."""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional

import numpy as np

from mtbench.regular_files import MIB, read_regular
from mtbench.report.jobs import value_at

STEPS_LIMIT_BYTES = 64 * MIB  # a steps.csv of a million steps is far below it

# the metrics that have a spread, and the key of each in summary.json's `repeats` (the group of N runs)
REPEAT_KEYS = {"step_time": "step_time_s", "throughput": "throughput", "energy_per_sample": "energy_per_sample_j",
               "energy_per_step": "energy_per_sample_j"}
REPEATS_NOTE = "error bars: 95 % confidence interval across repeats (repeat=N), else p10-p90 of the job's steps"


class Point(NamedTuple):
    value: float
    lo: Optional[float]  # the error bar's ends (None: no bar)
    hi: Optional[float]
    source: str  # "repeats" (ci95 of N runs), "steps" (p10-p90 of the measured steps) or "" (no bar)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def repeats_of(job: Dict[str, Any], metric: str) -> Optional[Dict[str, Any]]:
    """summary["repeats"][key] for `metric` where it is well formed ({mean, ci95: [lo, hi]}), else None."""
    group = job.get("repeats")
    if not isinstance(group, dict) or not isinstance(group.get(REPEAT_KEYS.get(metric, "")), dict):
        return None
    entry = group[REPEAT_KEYS[metric]]
    ci = entry.get("ci95")
    if not _number(entry.get("mean")) or not isinstance(ci, (list, tuple)) or len(ci) != 2 \
            or not all(_number(c) for c in ci):
        return None
    return entry


def measured_steps(job: Dict[str, Any]) -> Dict[str, List[float]]:
    """{duration_s: [...], energy_j_total: [...]} of the job's measured (not warm-up) steps in its steps.csv; {}
    where the job has none that can be read. Read once per job."""
    if "_steps" not in job:
        job["_steps"] = _read_steps(Path(job.get("_root") or ".") / str(job.get("_rel") or job.get("_dir") or "."))
    return job["_steps"]


def _read_steps(folder: Path) -> Dict[str, List[float]]:
    try:
        text = read_regular(str(folder / "steps.csv"), STEPS_LIMIT_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return {}  # no steps.csv (an old run, mtbench-sample without marks): no bar, the point stays
    out: Dict[str, List[float]] = {"duration_s": [], "energy_j_total": []}
    try:
        for row in csv.DictReader(io.StringIO(text)):
            if str(row.get("warmup", "0")).strip() not in ("0", "False", "false", ""):
                continue
            for key, values in out.items():
                try:
                    v = float(row.get(key) or "nan")
                except ValueError:
                    continue
                if math.isfinite(v):
                    values.append(v)
    except csv.Error:
        return {}
    return out


def _p10_p90(values: List[float]) -> Optional[tuple]:
    if len(values) < 2:
        return None  # one step has no spread
    return float(np.percentile(values, 10)), float(np.percentile(values, 90))


def summary_value(job: Dict[str, Any], metric: str) -> Optional[float]:
    """The job's own figure for `metric` (one run)."""
    batch = value_at(job, "batch_size")
    if metric == "step_time":
        return value_at(job, "step_time_s", "median")
    if metric == "throughput":
        return value_at(job, "throughput_samples_per_s")
    energy = value_at(job, "energy_j", "per_step_mean")
    if energy is None:
        return None
    if metric == "energy_per_step":
        return energy
    return energy / batch if batch else None


def point(job: Dict[str, Any], metric: str) -> Optional[Point]:
    """The value to draw for `metric` and its error bar: a repeated job's mean across repeats with its ci95 (the
    interval is about that mean), else the job's own figure with p10-p90 of its steps."""
    batch = value_at(job, "batch_size") or 1
    scale = batch if metric == "energy_per_step" else 1  # repeats give energy per sample
    rep = repeats_of(job, metric)
    if rep is not None:
        lo, hi = sorted(rep["ci95"])
        return Point(rep["mean"] * scale, lo * scale, hi * scale, "repeats")
    value = summary_value(job, metric)
    if value is None:
        return None
    steps = measured_steps(job)
    band = None
    if metric in ("step_time", "throughput"):
        band = _p10_p90(steps.get("duration_s") or [])
        if band and metric == "throughput":  # the steps' throughput: the slowest tenth of steps is its p10
            band = (batch / band[1], batch / band[0]) if band[0] > 0 else None
    else:
        band = _p10_p90(steps.get("energy_j_total") or [])
        if band and metric == "energy_per_sample":
            band = (band[0] / batch, band[1] / batch)
    if band is None:
        return Point(value, None, None, "")
    return Point(value, min(band[0], value), max(band[1], value), "steps")
