"""Resuming a sweep: which job folders hold a finished result of the same configuration, and the figure a
sweeper optimizes."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from omegaconf import DictConfig

from mtbench.config import OBJECTIVES


# keys that change how a job is run, not what it measures: a resumed sweep may differ in them
NOT_MEASURED_KEYS = ("resume", "device_lock", "lock_dir", "allow_parallel", "objective", "logger")


def finished_summary(out_dir: str, cfg: DictConfig) -> Optional[Dict[str, Any]]:
    """The summary in `out_dir` if it is a finished one (succeeded or a recorded failure) of this same config.
    Any other summary there (unreadable, hand-edited, interrupted, of another config) means "run it again", said
    in one line; no summary at all (the job never ran, or was running when the sweep died) is said by no line."""
    summary, why = _finished(out_dir, cfg)
    if summary is None and why is not None:
        print(f"    resume: {out_dir} holds no finished result of this configuration ({why}); running it again",
              flush=True)
    return summary


def _finished(out_dir: str, cfg: DictConfig) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    from omegaconf import OmegaConf

    from mtbench.results.reader import UnreadableSummary, field_problems, read_summary

    try:
        # the recorded config is compared below, a stronger test than the schema key (which may be absent)
        summary = read_summary(Path(out_dir), require_schema=False)
    except UnreadableSummary as exc:
        return None, None if exc.missing else exc.reason
    problems = field_problems(summary)
    if problems:  # hand-edited: its figures cannot be trusted, nor a sweeper's objective read from them
        return None, "; ".join(f"{k}: {why}" for k, why in problems.items())
    if not isinstance(summary.get("config"), dict) or "success" not in summary:
        return None, "it records no config or no success"
    if summary.get("write_error"):
        return None, f"its results were not all written: {summary['write_error']}"
    kind = (summary.get("failure") or {}).get("kind")
    if kind in ("interrupted", "terminated"):
        return None, f"the job was {kind}"  # stopped by the user or a scheduler, not measured: it runs again
    now = OmegaConf.to_container(cfg, resolve=True)
    same = {k: v for k, v in summary["config"].items() if k not in NOT_MEASURED_KEYS} == \
        {k: v for k, v in now.items() if k not in NOT_MEASURED_KEYS}
    return (summary, None) if same else (None, "its config differs")


def objective_value(summary: Dict[str, Any], objective: str) -> float:
    """The figure a sweeper optimizes (see OBJECTIVES for its direction). A job without it (a failed job, or energy
    without a power sensor) gives the worst value for that direction, +inf or -inf: Optuna < 3 rejects NaN and
    then ends the whole study."""
    value: Optional[float] = None
    if summary.get("success"):
        if objective == "step_time_s":
            value = (summary.get("step_time_s") or {}).get("median")
        elif objective == "throughput":
            value = summary.get("throughput_samples_per_s")
        elif objective == "energy_per_sample_j":
            per_step = (summary.get("energy_j") or {}).get("per_step_mean")
            value = None if per_step is None else per_step / summary["batch_size"]
        elif objective in ("time_to_target_s", "energy_to_target_j"):  # null where the target was not met
            value = summary.get(objective)
    if value is None:
        return math.inf if OBJECTIVES[objective] == "minimize" else -math.inf
    return float(value)
