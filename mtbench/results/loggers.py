"""The `logger` config group: a finished job's figures to a CSV file, TensorBoard, MLflow or Weights & Biases.

A logger runs after the job's files are written and reads them back (summary.json, steps.csv, samples.csv): it
adds a view of the results, never a result of its own, so a logger that fails is one warning and the job stands.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from mtbench.results.files import atomic_write, csv_text
from mtbench.results.logger_rows import StepRow, step_metrics

LOGGERS = ("none", "csv", "tensorboard", "mlflow", "wandb")
METRICS_CSV = "metrics.csv"


def warn(line: str) -> None:
    print(f"mtbench: warning: {line}", file=sys.stderr, flush=True)


def settings_of(cfg: Any) -> Dict[str, Any]:
    """The composed `logger` node as a dict ({"name": "none"} where the config has none: a hand-made one)."""
    from omegaconf import OmegaConf

    node = cfg.get("logger") if hasattr(cfg, "get") else None
    if node is None:
        return {"name": "none"}
    return dict(OmegaConf.to_container(node, resolve=True)) if OmegaConf.is_config(node) else dict(node)


def log_job(cfg: Any, out_dir: Path, summary: Mapping[str, Any]) -> Optional[str]:
    """Hand the job's results in `out_dir` to the logger the config names; returns the warning said, if any.

    Never raises (but KeyboardInterrupt): whatever goes wrong is one warning line on stderr, and the job's own
    files are complete before this runs."""
    name = "?"
    try:
        settings = settings_of(cfg)
        name = str(settings.get("name", "none"))
        if name == "none":
            return None
        if name not in LOGGERS:
            raise ValueError(f"logger.name={name!r} is not known; allowed: {', '.join(LOGGERS)}")
        _writer(name)(settings, Path(out_dir), summary, step_metrics(Path(out_dir)))
    except Exception as exc:  # noqa: BLE001 - a logger never fails a job
        text = str(exc).strip().splitlines()
        line = (f"logger={name} could not log this job ({type(exc).__name__}: "
                f"{text[0] if text else ''}); its results are in {out_dir}")
        warn(line)
        return line
    return None


def _writer(name: str):
    if name == "csv":
        return write_metrics_csv
    from mtbench.results import logger_backends

    return {"tensorboard": logger_backends.tensorboard, "mlflow": logger_backends.mlflow,
            "wandb": logger_backends.wandb}[name]


def write_metrics_csv(settings: Mapping[str, Any], out_dir: Path, summary: Mapping[str, Any],
                      steps: List[StepRow]) -> None:
    """logger=csv: metrics.csv in the job's folder, tidy long form: one row per step and metric (step, warmup,
    metric, value); a figure a step does not have is left out, never written as 0."""
    # each value as steps.csv and samples.csv hold it (repr: no digit lost to a shorter format)
    rows = [(index, int(warmup), metric, repr(value)) for index, warmup, values in steps
            for metric, value in values.items()]
    atomic_write(out_dir / METRICS_CSV, csv_text(["step", "warmup", "metric", "value"], rows))
