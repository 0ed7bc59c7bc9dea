"""Command line: `mtbench [overrides]` (one job or a `-m` sweep, through Hydra) and `mtbench models`.

Values a user types are checked before Hydra starts, so that a bad one ends in one line and a non-zero
exit before any job of a sweep runs.
"""
from __future__ import annotations

import sys
from typing import List, Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from mtbench.config import GROUPS, conf_dir, group_options, positive_float, positive_int
from mtbench.errors import UsageError
from mtbench.sweep import override_values

INT_KEYS = {"batch": 1, "steps": 1, "warmup": 0, "seed": 0}
FLOAT_KEYS = ("sampler.interval_ms",)
BOOL_KEYS = ("profile",)


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
        if key in GROUPS:
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


@hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")
def hydra_app(cfg: DictConfig) -> Optional[float]:
    from mtbench.console import print_summary
    from mtbench.runner import run_job

    hydra_cfg = HydraConfig.get()
    try:
        summary = run_job(cfg, hydra_cfg.runtime.output_dir)
    except UsageError as exc:
        _fail(str(exc))
    print_summary(summary, hydra_cfg.runtime.output_dir, compact=hydra_cfg.mode == RunMode.MULTIRUN)
    if not summary["success"]:
        if hydra_cfg.mode != RunMode.MULTIRUN:
            sys.exit(1)  # a single failed job (the summary says why) is a failed command
        return None
    return summary["step_time_s"]["median"]  # what a sweeper would minimize


def main(argv: Optional[List[str]] = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "models":
        from mtbench.catalog import print_models

        print_models()
        return
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
