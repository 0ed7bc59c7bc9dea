"""Measured per-op times for calibration: read a `profile=true` job's ops.csv, or run the profiled steps for a job."""
from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mtbench import interpreter
from mtbench.predict import opcost

PROFILED_DIR = "profiled"  # where calibrate puts the profiled run of a job that has no ops.csv (inside its folder)


def read_ops(path: Path) -> List[Tuple[str, str, float]]:
    """(name, device, total_s) of every row of an ops.csv (the "[no op]" row included)."""
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            try:
                rows.append((r["name"], r.get("device") or "", float(r["total_s"])))
            except (KeyError, TypeError, ValueError):
                continue
    return rows


def ops_file(summary: Dict[str, Any]) -> Optional[Path]:
    """The ops.csv beside the job's summary.json, or in its `profiled/` run; None when neither exists."""
    folder = Path(summary["_path"]).parent
    for path in (folder / "ops.csv", folder / PROFILED_DIR / "ops.csv"):
        if path.is_file():
            return path
    return None


def class_seconds(summary: Dict[str, Any], time_stat: str = "median") -> Optional[Dict[str, float]]:
    """Measured seconds per step of each op class (and opcost.HOST) of the job, with the profiler's overhead
    taken out (each scaled by unprofiled / profiled step time); None where the job has no ops.csv."""
    path = ops_file(summary)
    if path is None:
        return None
    prof = summary
    if path.parent.name == PROFILED_DIR and (path.parent / "summary.json").is_file():
        import json

        prof = json.loads((path.parent / "summary.json").read_text())
    steps = int(prof.get("measured_steps") or 0)
    if steps <= 0:
        return None
    profiled_s = (prof.get("step_time_s") or {}).get(time_stat)
    plain_s = step_seconds(summary, time_stat)
    scale = plain_s / profiled_s if profiled_s and plain_s else 1.0
    return opcost.measured_class_seconds(read_ops(path), steps, scale)


def step_seconds(summary: Dict[str, Any], time_stat: str = "median") -> Optional[float]:
    """The job's step time without the profiler: a profiled job's unprofiled reference steps, else its steps."""
    reference = (summary.get("profile") or {}).get("unprofiled_step_time_s") if summary.get("profiled") else None
    if isinstance(reference, dict) and reference.get(time_stat):
        return float(reference[time_stat])
    value = (summary.get("step_time_s") or {}).get(time_stat)
    return float(value) if value else None


def run_profiled(summary: Dict[str, Any], overrides: Sequence[str] = (), steps: int = 3,
                 warmup: int = 1) -> Optional[Path]:
    """Run the job of `summary` again with profile=true into `<its folder>/profiled/` (a fresh process, as a
    sweep's job); the ops.csv written, or None when the run wrote none."""
    folder = Path(summary["_path"]).parent / PROFILED_DIR
    device = str(summary.get("device", "cpu")).split(":")[0]
    cmd = interpreter.python_m("mtbench", [f"model={summary['model']}", f"batch={int(summary['batch_size'])}",
                                           f"device={device}", "profile=true", f"steps={steps}", f"warmup={warmup}",
                                           f"hydra.run.dir={folder}", *overrides])
    if summary.get("target"):
        cmd.append(f"target={summary['target']}")
    subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ))
    path = folder / "ops.csv"
    return path if path.is_file() else None
