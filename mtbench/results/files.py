"""The result files of one job (summary.json, steps.csv, samples.csv), written atomically.

summary.json follows the contract in docs/results.md (schema "mtbench.summary/2"; /1, which lacked the run's record
and `noise`, is still read); extra keys are allowed, the required ones never change meaning without a schema bump.
"""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np

from mtbench.regular_files import write_whole
from mtbench.sampling import Samples

SCHEMA = "mtbench.summary/2"
REQUIRED_KEYS = (
    "schema", "model", "batch_size", "device", "data", "success", "failure", "warmup_steps",
    "measured_steps", "step_time_s", "throughput_samples_per_s", "cpu_util_pct", "gpu_util_pct",
    "power_w", "energy_j", "mem_peak_bytes", "mem_peak_source", "sampler", "env",
)


def atomic_write(path: Path, text: str) -> None:
    """Write `text` via a fresh file in the same folder and a rename (regular_files.write_whole), so that a reader
    never sees half a file and a link planted at `path` is replaced, never written through."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(str(path), text.encode())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """`atomic_write` of bytes (a figure, a compressed trace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(str(path), data)


def csv_text(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        writer.writerow([_cell(v) for v in row])
    return buf.getvalue()


def _cell(v: Any) -> Any:
    if v is None or (isinstance(v, (float, np.floating)) and math.isnan(v)):
        return ""
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.6g}"
    return v


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
    atomic_write(Path(out_dir) / "steps.csv", csv_text(header, rows))


def write_samples(out_dir: Path, samples: Samples) -> None:
    names = [f.name for f in samples.fields]
    cols = [samples.columns[n] for n in names]
    rows = ([f"{t:.6f}"] + [_fmt(c[i]) for c in cols] for i, t in enumerate(samples.time_s))
    atomic_write(Path(out_dir) / "samples.csv", csv_text(["time_s"] + names, rows))


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
