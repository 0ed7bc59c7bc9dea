"""Resuming a sweep: which job folders hold a finished result of the same configuration, and the figure a
sweeper optimizes."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from omegaconf import DictConfig

from mtbench.config import NOT_MEASURED_KEYS, OBJECTIVES


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
        elif objective == "energy_time_cost_j":
            value = energy_time_cost_j(summary)
    if value is None:
        return math.inf if OBJECTIVES[objective] == "minimize" else -math.inf
    return float(value)


def max_power_w(cfg: Any) -> Optional[float]:
    """The max power that weighs time in energy_time_cost_j: objective_max_power_w, else the target's max_power_w
    (a board's highest draw in its fastest mode), else None."""
    given = cfg.get("objective_max_power_w")
    target = cfg.get("target") or {}
    return given if given is not None else target.get("max_power_w")


def cost_problem(cfg: Any) -> Optional[str]:
    """Why objective=energy_time_cost_j cannot be computed for this config (said before any job runs), or None."""
    if cfg.get("objective") != "energy_time_cost_j" or max_power_w(cfg) is not None:
        return None
    return ("objective=energy_time_cost_j weighs time by the device's max power, and none is known; allowed: "
            "objective_max_power_w=W (e.g. 60 for an AGX Orin in MAXN, 15 for a TX2, the GPU's top power limit)")


def energy_time_cost_j(summary: Dict[str, Any]) -> Optional[float]:
    """Zeus's cost per sample, eta x energy + (1 - eta) x max power x time (J): eta and the max power from the
    config the summary records (a resumed job's are the sweep's: see commands/cli.py); None without energy."""
    config = summary.get("config") or {}
    eta, top_w = config.get("objective_eta", 0.5), max_power_w(config)
    per_step = (summary.get("energy_j") or {}).get("per_step_mean")
    step_s = (summary.get("step_time_s") or {}).get("median")
    if per_step is None or step_s is None or top_w is None or not summary.get("batch_size"):
        return None
    return (eta * per_step + (1 - eta) * top_w * step_s) / summary["batch_size"]

