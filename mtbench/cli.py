"""Command line: `mtbench [overrides]` (one job or a `-m` sweep, through Hydra) and `mtbench models`.

Values a user types are checked before Hydra starts, so that a bad one ends in one line and a non-zero
exit before any job of a sweep runs.
"""
from __future__ import annotations

import sys
import math
from pathlib import Path
from typing import Any, Dict, List, Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from mtbench.config import GROUPS, check_target, check_targets, conf_dir, group_options, positive_float, positive_int
from mtbench.errors import UsageError
from mtbench.sweep import override_values

INT_KEYS = {"batch": 1, "steps": 1, "warmup": 0, "seed": 0}
FLOAT_KEYS = ("sampler.interval_ms",)
BOOL_KEYS = ("profile", "cudnn_benchmark", "resume", "allow_parallel")
# what a job returns to a Hydra sweeper (`objective=...`), and the direction a sweeper should take
OBJECTIVES = {"step_time_s": "minimize", "throughput": "maximize", "energy_per_sample_j": "minimize"}


def _fail(message: str, code: int = 2) -> None:
    print(f"mtbench: error: {message}", file=sys.stderr)
    sys.exit(code)


def check_overrides(args: List[str]) -> None:
    """Reject unknown config-group options and out-of-range numbers among the command-line overrides."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = get_args_parser().parse_args(args)
    except SystemExit:  # argparse already printed its one-line usage error
        raise
    try:
        overrides = OverridesParser.create().parse_overrides(parsed.overrides)
    except HydraException as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    for override in overrides:
        if override.is_delete():
            continue
        key = override.key_or_group
        values = override_values(override)
        if values is None:
            continue
        if key.endswith("_target_") and not key.startswith("hydra."):  # Hydra's own nodes (launcher, sweeper)
            where = key[:-len("_target_")].rstrip(".")
            for value in values:
                check_target(str(value), where)
        elif key in GROUPS:
            allowed = group_options(key)
            for value in values:
                if str(value) not in allowed:
                    raise UsageError(f"{key}={value!r} is not known; allowed: {', '.join(allowed)}")
        elif key in INT_KEYS:
            for value in values:
                positive_int(key, value, minimum=INT_KEYS[key])
        elif key in FLOAT_KEYS:
            for value in values:
                positive_float(key, value)
        elif key in BOOL_KEYS:
            for value in values:
                if not isinstance(value, bool):
                    raise UsageError(f"{key}={value!r} is not known; allowed: true, false")
        elif key in ("objective", "device_lock"):
            from mtbench.runner import LOCK_MODES

            allowed = list(OBJECTIVES) if key == "objective" else LOCK_MODES
            for value in values:
                if value not in allowed:
                    raise UsageError(f"{key}={value!r} is not known; allowed: {', '.join(allowed)}")


# keys that change how a job is run, not what it measures: a resumed sweep may differ in them
NOT_MEASURED_KEYS = ("resume", "device_lock", "lock_dir", "allow_parallel", "objective")


def finished_summary(out_dir: str, cfg: DictConfig) -> Optional[Dict[str, Any]]:
    """The summary in `out_dir` if it is a finished one (succeeded or a recorded failure) of this same config."""
    from omegaconf import OmegaConf

    from mtbench.results import read_summary

    try:
        summary = read_summary(Path(out_dir))
    except (OSError, ValueError):
        return None  # never written (the job was running when the sweep died), or half a file
    if not isinstance(summary.get("config"), dict) or "success" not in summary or summary.get("write_error"):
        return None
    if (summary.get("failure") or {}).get("kind") == "interrupted":
        return None  # stopped by the user, not measured: it runs again
    now = OmegaConf.to_container(cfg, resolve=True)
    same = {k: v for k, v in summary["config"].items() if k not in NOT_MEASURED_KEYS} == \
        {k: v for k, v in now.items() if k not in NOT_MEASURED_KEYS}
    return summary if same else None


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
    if value is None:
        return math.inf if OBJECTIVES[objective] == "minimize" else -math.inf
    return float(value)


@hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")
def hydra_app(cfg: DictConfig) -> float:
    from mtbench.console import print_summary
    from mtbench.runner import run_isolated

    hydra_cfg = HydraConfig.get()
    objective = str(cfg.get("objective", "step_time_s"))
    if objective not in OBJECTIVES:
        _fail(f"objective={objective!r} is not known; allowed: {', '.join(OBJECTIVES)}")
    if cfg.get("resume", False):
        done = finished_summary(hydra_cfg.runtime.output_dir, cfg)
        if done is not None:
            result = "ok" if done.get("success") else (done.get("failure") or {}).get("kind", "failed")
            print(f"    resume: {hydra_cfg.runtime.output_dir} holds this job's result ({result}); not run again",
                  flush=True)
            return objective_value(done, objective)
    try:
        # every _target_ resolves to an allowed module (checked here, in the parent, before this job runs)
        check_targets(cfg)
        summary = run_isolated(cfg, hydra_cfg.runtime.output_dir)  # the job trains in a child process
    except UsageError as exc:
        _fail(str(exc))
    print_summary(summary, hydra_cfg.runtime.output_dir, compact=hydra_cfg.mode == RunMode.MULTIRUN)
    if hydra_cfg.mode != RunMode.MULTIRUN and (not summary["success"] or summary.get("write_error")):
        sys.exit(1)  # a single failed job (the summary says why) is a failed command
    return objective_value(summary, objective)


def print_help(args: List[str]) -> None:
    """`mtbench --help`: Hydra's help, but each config group lists only its options (a `_base` is no choice)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from hydra.errors import HydraException

    overrides = [a for a in args if a not in ("--help", "-h") and not a.startswith("-")]
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        help_cfg = compose(config_name="config", return_hydra_config=True).hydra.help
        header, footer = help_cfg.header, help_cfg.footer
        try:
            cfg = compose(config_name="config", overrides=overrides)
        except HydraException:  # a sweep (`model=a,b`) composes no single config: show the defaults
            cfg = compose(config_name="config")
    groups = "\n".join(f"{group}: {', '.join(group_options(group))}" for group in GROUPS)
    print(f"{header}\n== Configuration groups ==\nCompose your configuration from those groups (group=option)\n\n"
          f"{groups}\n\n== Config ==\nOverride anything in the config (foo.bar=value)\n\n"
          f"{OmegaConf.to_yaml(cfg)}\n{footer}")


def main(argv: Optional[List[str]] = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if ("--help" in args or "-h" in args) and not (args and args[0] in ("models", "report", "maxbatch", "predict", "calibrate")):
        try:
            check_overrides([a for a in args if a not in ("--help", "-h")])
            print_help(args)
        except UsageError as exc:
            _fail(str(exc))
        return
    if args and args[0] == "models":
        from mtbench.catalog import print_models

        try:
            check_overrides(args[1:])
            print_models(args[1:])
        except UsageError as exc:
            _fail(str(exc))
        return
    if args and args[0] == "maxbatch":
        from mtbench.memory.maxbatch import main as maxbatch_main

        sys.exit(maxbatch_main(args[1:]))
    if args and args[0] in ("predict", "calibrate"):
        from mtbench.predict.cli import main_calibrate, main_predict

        sys.exit((main_predict if args[0] == "predict" else main_calibrate)(args[1:]))
    if args and args[0] == "report":
        from mtbench.report import main as report_main

        try:
            report_main(args[1:])
        except UsageError as exc:
            _fail(str(exc))
        return
    try:
        check_overrides(args)
    except UsageError as exc:
        _fail(str(exc))
    sys.argv = [sys.argv[0]] + args
    try:
        hydra_app()
    except KeyboardInterrupt:  # the job's summary already says "interrupted"
        print("mtbench: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
