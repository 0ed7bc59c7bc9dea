"""Runs to a target (until.*): accuracy (or loss) against training time and against training energy, per batch size.

One figure per model: each job's evals.csv, one line per batch size, the target as a dashed line and the check
that met it as a star. The x axes count the training steps' windows only, as time_to_target_s and
energy_to_target_j do (docs/measurement.md "Runs to a target").
"""
from __future__ import annotations

import csv
import io
import math
import os
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402

from mtbench.regular_files import read_regular  # noqa: E402
from mtbench.report.jobs import NOT_MEASURED  # noqa: E402
from mtbench.report.panels import save_png  # noqa: E402

CURVE_FILE = "evals.csv"  # as mtbench/job/until.py writes it (the report layer reads result files, not the job's code)
YLABEL = {"accuracy": "held-out top-1 accuracy", "loss": "training loss (mean since the last check)"}


MAX_CURVE_BYTES = 16 * 2**20  # a row per check: kilobytes


def _curve(job: Dict[str, Any]) -> List[Dict[str, Optional[float]]]:
    """The job's checks as numbers (a cell that is empty or no finite number: None); [] where it wrote no evals.csv,
    or where the name holds no regular file (a link, a FIFO) or too large a one."""
    path = Path(job.get("_root") or ".") / str(job.get("_rel", job.get("_dir"))) / CURVE_FILE
    if not os.path.lexists(path):
        return []
    try:
        text = read_regular(str(path), MAX_CURVE_BYTES).decode("utf-8", "replace")
    except OSError:  # RefusedFile too
        return []
    return [{str(k): _number(v) for k, v in r.items()} for r in csv.DictReader(io.StringIO(text))]


def _number(text: Any) -> Optional[float]:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _target(job: Dict[str, Any]) -> Optional[Tuple[str, float]]:
    until = job.get("until")
    if not isinstance(until, dict) or until.get("metric") not in YLABEL:
        return None
    value = until.get("value")
    return (str(until["metric"]), float(value)) if isinstance(value, (int, float)) else None


def fig_accuracy(groups: Dict[str, List[Dict[str, Any]]], out: Path) -> List[str]:
    """accuracy_<series>.png (loss_<series>.png for until.loss) per series (model and settings) with runs to a target;
    [] when none."""
    names = []
    for model, js in groups.items():
        runs = [(j, _target(j), _curve(j)) for j in js if _target(j) is not None]
        runs = [(j, t, [r for r in c if r.get("train_time_s") is not None]) for j, t, c in runs]
        runs = [(j, t, c) for j, t, c in runs if c]
        if not runs:
            continue
        metric = runs[0][1][0]  # type: ignore[index]
        runs = [r for r in runs if r[1][0] == metric]  # type: ignore[index]
        fig, (by_time, by_energy) = plt.subplots(1, 2, figsize=(12, 4.5))
        energy_drawn = False
        batches = [j.get("batch_size") for j, _, _ in runs]
        for k, (job, (_, value), rows) in enumerate(runs):  # type: ignore[misc]
            style = {"color": f"C{k % 10}", "marker": "o", "markersize": 3}
            label = f"b{job.get('batch_size')}" + _reached(job)
            if batches.count(job.get("batch_size")) > 1:  # two runs of one batch size (another knob): their folders
                label += f" [{job.get('_dir')}]"
            ys = [r.get(metric) for r in rows]
            by_time.plot([r["train_time_s"] for r in rows], ys, label=label, **style)
            points = [(r["train_energy_j"], y) for r, y in zip(rows, ys) if r.get("train_energy_j") is not None]
            if points:
                by_energy.plot(*zip(*points), label=label, **style)
                energy_drawn = True
            met = [r for r in rows if r.get("met") == 1]
            if met:
                by_time.plot(met[0]["train_time_s"], met[0][metric], "*", color=style["color"], markersize=12)
                if met[0].get("train_energy_j") is not None:
                    by_energy.plot(met[0]["train_energy_j"], met[0][metric], "*", color=style["color"], markersize=12)
        targets = sorted({t[1] for _, t, _ in runs})  # type: ignore[index]
        for ax, xlabel in ((by_time, "training time (s): the steps' windows, checks excluded"),
                           (by_energy, "training energy (J): the steps' windows, checks excluded")):
            if ax is by_energy and not energy_drawn:
                ax.text(0.5, 0.5, f"energy to target:\n{NOT_MEASURED}", ha="center", va="center",
                        transform=ax.transAxes, fontsize=11, color="0.4")
                ax.set_xticks([])
                ax.set_yticks([])
                continue
            for t in targets:
                ax.axhline(t, color="0.3", linestyle="--", linewidth=1)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(YLABEL[metric])
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"{model}: {metric} against training time and energy, per batch size (target: dashed; "
                     f"met: star)")
        name = f"{metric}_{re.sub(r'[^A-Za-z0-9_.-]+', '_', model)}.png"
        fig.tight_layout()
        save_png(fig, out / name)
        plt.close(fig)
        names.append(name)
    return names


def _reached(job: Dict[str, Any]) -> str:
    """The legend's figures to target: ' (12.3 s, 456 J)', ' (not met)'."""
    if not job.get("target_reached"):
        return " (not met)"
    parts = [f"{job['time_to_target_s']:.3g} s" if isinstance(job.get("time_to_target_s"), (int, float)) else None,
             f"{job['energy_to_target_j']:.3g} J" if isinstance(job.get("energy_to_target_j"), (int, float)) else None]
    return " (" + ", ".join(p for p in parts if p) + ")" if any(parts) else ""
