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
from omegaconf import DictConfig, OmegaConf

from mtbench.config import GROUPS, OBJECTIVES, check_overrides, check_targets, conf_dir, group_options
from mtbench.campaign.folders import claim_explicit_dirs, free_dir
from mtbench.campaign.resume import finished_summary, objective_value
from mtbench.errors import UsageError

def _fail(message: str, code: int = 2) -> None:
    print(f"mtbench: error: {message}", file=sys.stderr)
    sys.exit(code)


# conf/config.yaml's default run and sweep folders: the first free name, made at once (two runs started in the same
# second never share one). Cached per config, and the cache travels with a sweep's jobs to a launcher's processes.
OmegaConf.register_new_resolver("mtbench_free_dir", free_dir, use_cache=True, replace=True)

@hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")
def hydra_app(cfg: DictConfig) -> float:
    from mtbench.results.console import print_summary
    from mtbench.job.isolation import run_isolated

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
        from mtbench.report.catalog import print_models

        try:
            check_overrides(args[1:])
            print_models(args[1:])
        except UsageError as exc:
            _fail(str(exc))
        return
    if args and args[0] == "maxbatch":
        from mtbench.campaign.maxbatch import main as maxbatch_main

        sys.exit(maxbatch_main(args[1:]))
    if args and args[0] in ("predict", "calibrate"):
        from mtbench.commands.predict import main_calibrate, main_predict

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
        claim_explicit_dirs(args)  # an explicit run or sweep folder that another run holds is refused here
    except UsageError as exc:
        _fail(str(exc))
    sys.argv = [sys.argv[0]] + args
    try:
        hydra_app()
    except KeyboardInterrupt as exc:  # the job's summary already says "interrupted" (or "terminated")
        from mtbench.job.signals import exit_code, stop_signal

        print(f"mtbench: {'interrupted' if stop_signal(exc) == 2 else 'terminated by ' + str(exc)}", file=sys.stderr)
        sys.exit(exit_code(exc))  # 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP, as a shell reports them


if __name__ == "__main__":
    main()
