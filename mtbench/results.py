"""The result files of one job (summary.json, steps.csv, samples.csv), written atomically.

summary.json follows the contract in DESIGN.md (schema "mtbench.summary/1"); extra keys are allowed, the
required ones never change meaning without a schema bump.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np

from mtbench.sampling import Samples, StepMark
from mtbench.sampling import aggregate
from mtbench.sampling.procfs import USER_HZ

SCHEMA = "mtbench.summary/1"
REQUIRED_KEYS = (
    "schema", "model", "batch_size", "device", "data", "success", "failure", "warmup_steps",
    "measured_steps", "step_time_s", "throughput_samples_per_s", "cpu_util_pct", "gpu_util_pct",
    "power_w", "energy_j", "mem_peak_bytes", "mem_peak_source", "sampler", "env",
)


def atomic_write(path: Path, text: str) -> None:
    """Write via a temp file in the same folder and rename, so a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _csv_text(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        writer.writerow(["" if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in row])
    return buf.getvalue()


def _clean(value: Any) -> Any:
    """JSON-safe: numpy scalars to Python, NaN/inf to null."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return None if not math.isfinite(float(value)) else float(value)
    return value


def write_summary(out_dir: Path, summary: Dict[str, Any]) -> Path:
    path = Path(out_dir) / "summary.json"
    atomic_write(path, json.dumps(_clean(summary), indent=2) + "\n")
    return path


def write_steps(out_dir: Path, header: Sequence[str], rows: List[Sequence[Any]]) -> None:
    atomic_write(Path(out_dir) / "steps.csv", _csv_text(header, rows))


def write_samples(out_dir: Path, samples: Samples) -> None:
    names = [f.name for f in samples.fields]
    cols = [samples.columns[n] for n in names]
    rows = ([f"{t:.6f}"] + [_fmt(c[i]) for c in cols] for i, t in enumerate(samples.time_s))
    atomic_write(Path(out_dir) / "samples.csv", _csv_text(["time_s"] + names, rows))


def _fmt(v: float) -> Optional[str]:
    if math.isnan(v):
        return None
    return str(int(v)) if float(v).is_integer() else f"{v:.6g}"


def stats(values: Sequence[float]) -> Optional[Dict[str, float]]:
    """{median, mean, min, max, p90} or None for no values."""
    if not len(values):
        return None
    arr = np.asarray(values, dtype=float)
    return {
        "median": float(np.median(arr)),
        "mean": float(arr.mean()),
        "min": float(arr.min()),
        "max": float(arr.max()),
        "p90": float(np.percentile(arr, 90)),
    }


def cpu_utilization(samples: Samples, start: float, end: float) -> Optional[Dict[str, Any]]:
    """Per-core and mean busy % over [start, end] from /proc/stat tick deltas (exact up to one tick an edge)."""
    busy_fields = samples.group("cpu_busy")
    total_by_core = {f.key: f for f in samples.group("cpu_total")}
    if not busy_fields:
        return None
    per_core: List[Optional[float]] = []
    busy_sum = total_sum = 0.0
    for f in busy_fields:
        busy = aggregate.counter_delta(samples.time_s, samples.columns[f.name], start, end)
        total = aggregate.counter_delta(samples.time_s, samples.columns[total_by_core[f.key].name], start, end)
        if busy is None or total is None or total <= 0:
            per_core.append(None)
            continue
        per_core.append(min(100.0, 100.0 * busy / total))  # interpolation can overshoot by float noise
        busy_sum += busy
        total_sum += total
    mean = min(100.0, 100.0 * busy_sum / total_sum) if total_sum > 0 else None
    return {"mean": mean, "per_core": per_core}


def process_cpu_pct(samples: Samples, start: float, end: float) -> Optional[float]:
    """CPU time of the measured process over [start, end], in % of one core (can exceed 100)."""
    fields = samples.group("proc_cpu")
    if not fields or end <= start:
        return None
    ticks = aggregate.counter_delta(samples.time_s, samples.columns[fields[0].name], start, end)
    return None if ticks is None else 100.0 * ticks / USER_HZ / (end - start)


def step_rows(marks: Sequence[StepMark], samples: Samples) -> tuple:
    """steps.csv: one row per step with its duration and the CPU figures of its window."""
    header = ["index", "start_s", "end_s", "duration_s", "warmup", "cpu_util_pct", "process_cpu_pct"]
    rows = []
    for m in marks:
        cpu = cpu_utilization(samples, m.start_s, m.end_s)
        rows.append([
            m.index, f"{m.start_s:.6f}", f"{m.end_s:.6f}", f"{m.end_s - m.start_s:.6f}", int(m.warmup),
            None if cpu is None or cpu["mean"] is None else round(cpu["mean"], 2),
            _round(process_cpu_pct(samples, m.start_s, m.end_s)),
        ])
    return header, rows


def _round(v: Optional[float], digits: int = 2) -> Optional[float]:
    return None if v is None else round(v, digits)
