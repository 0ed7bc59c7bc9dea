"""What a job gives every logger: its steps' figures (steps.csv and samples.csv), the summary's headline metrics,
the config as dotted keys and the run's name (read from the job's folder; no logger's package)."""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

# steps.csv's columns that say where a step is rather than what it measured
NOT_METRICS = ("index", "start_s", "end_s", "warmup", "plan", "energy_j_null_reason", "gpu_util_pct_null_reason")
# the summary's headline figures, as each logger's run-level metrics: (name, path in summary.json)
SUMMARY_METRICS = (
    ("step_time_s.median", ("step_time_s", "median")), ("step_time_s.p90", ("step_time_s", "p90")),
    ("throughput_samples_per_s", ("throughput_samples_per_s",)), ("cpu_util_pct.mean", ("cpu_util_pct", "mean")),
    ("process_cpu_pct", ("process_cpu_pct",)), ("gpu_util_pct.mean", ("gpu_util_pct", "mean")),
    ("energy_j.per_step_mean", ("energy_j", "per_step_mean")), ("mem_peak_bytes", ("mem_peak_bytes",)),
    ("mem_system_peak_bytes", ("mem_system_peak_bytes",)), ("noise.step_cv", ("noise", "step_cv")),
)

StepRow = Tuple[int, bool, Dict[str, float]]  # (step index, warm-up?, {metric: value})


def _number(text: str) -> Optional[float]:
    """A cell's number (an integral one as an int), or None for an empty or non-numeric cell."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(value):
        return None
    return int(value) if value.is_integer() and abs(value) < 2 ** 53 else value  # bytes stay exact


def _read_csv(path: Path) -> Tuple[List[str], List[List[str]]]:
    if not path.is_file():
        return [], []
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return (rows[0], rows[1:]) if rows else ([], [])


def step_metrics(out_dir: Path) -> List[StepRow]:
    """Each step of steps.csv with its measured figures: duration, CPU, GPU, energy per rail, losses, data wait,
    power_w (the step's total energy over its duration) and mem_rss_bytes / mem_system_used_bytes (the highest
    sample of the job's RSS and of the machine's memory in use within the step, from samples.csv)."""
    header, rows = _read_csv(out_dir / "steps.csv")
    if not header:
        return []
    col = {h: i for i, h in enumerate(header)}
    memory = _memory_columns(out_dir)
    out: List[StepRow] = []
    for row in rows:
        cells = dict(zip(header, row))
        values = {h: v for h, v in ((h, _number(cells.get(h, ""))) for h in header if h not in NOT_METRICS)
                  if v is not None}
        duration, energy = values.get("duration_s"), values.get("energy_j_total")
        if duration and energy is not None:
            values["power_w"] = energy / duration
        start, end = _number(row[col["start_s"]]), _number(row[col["end_s"]])
        if start is not None and end is not None:
            values.update(_window_max(memory, start, end))
        out.append((int(float(row[col["index"]])), row[col["warmup"]] in ("1", "True", "true"), values))
    return out


MEMORY_FIELDS = {"proc_rss_bytes": "mem_rss_bytes", "sys_mem_used_bytes": "mem_system_used_bytes"}


def _memory_columns(out_dir: Path) -> Dict[str, List[Tuple[float, float]]]:
    header, rows = _read_csv(out_dir / "samples.csv")
    if "time_s" not in header:
        return {}
    t = header.index("time_s")
    found: Dict[str, List[Tuple[float, float]]] = {}
    for field, metric in MEMORY_FIELDS.items():
        if field in header:
            i = header.index(field)
            found[metric] = [(ts, v) for ts, v in ((_number(r[t]), _number(r[i])) for r in rows if len(r) > i)
                             if ts is not None and v is not None]
    return found


def _window_max(memory: Mapping[str, List[Tuple[float, float]]], start: float, end: float) -> Dict[str, float]:
    out = {}
    for metric, series in memory.items():
        inside = [v for ts, v in series if start <= ts <= end]
        if inside:
            out[metric] = max(inside)
    return out


def summary_metrics(summary: Mapping[str, Any]) -> Dict[str, float]:
    """The headline figures of SUMMARY_METRICS the summary has (a null figure is left out, never logged as 0)."""
    out = {}
    for name, path in SUMMARY_METRICS:
        node: Any = summary
        for key in path:
            node = node.get(key) if isinstance(node, Mapping) else None
        if isinstance(node, (int, float)) and not isinstance(node, bool) and math.isfinite(node):
            out[name] = float(node)
    return out


def flat_config(summary: Mapping[str, Any]) -> Dict[str, Any]:
    """The job's config (summary.json's `config`) as {dotted.key: scalar}; a list becomes its text."""
    out: Dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                walk(value, f"{prefix}.{key}" if prefix else str(key))
        else:
            out[prefix] = node if node is None or isinstance(node, (bool, int, float, str)) else str(node)

    walk(summary.get("config") or {}, "")
    return out


def run_name(out_dir: Path) -> str:
    """A job's name in a tracker: its folder's name ('12-00-00-vgg19-b16'; a repeat: '...-b16/repeat-2')."""
    return f"{out_dir.parent.name}/{out_dir.name}" if out_dir.name.startswith("repeat-") else out_dir.name
