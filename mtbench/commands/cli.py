"""The `mtbench` entry point: a subcommand of the registry, or Hydra overrides (one job or a `-m` sweep).

Values a user types are checked before Hydra starts, so that a bad one ends in one line and exit 2 before any job
of a sweep runs. Every UsageError, wherever raised, ends in `mtbench.errors.print_error`.
"""
from __future__ import annotations

import os
import sys
from typing import List, Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from mtbench.campaign.folders import claim_explicit_dirs, free_dir
from mtbench.campaign.power_hold import SWEEP
from mtbench.campaign.resume import cost_problem, finished_summary, objective_value
from mtbench.commands import registry
from mtbench.config import GROUPS, check_targets, conf_dir, group_options
from mtbench.config_overrides import check_composed, check_overrides
from mtbench.errors import UsageError, print_error
from mtbench.regular_files import folder_problem

__all__ = ["main", "hydra_app", "finished_summary", "objective_value"]


# conf/config.yaml's default run and sweep folders: the first free name, made at once (two runs started in the same
# second never share one). Cached per config, and the cache travels with a sweep's jobs to a launcher's processes.
OmegaConf.register_new_resolver("mtbench_free_dir", free_dir, use_cache=True, replace=True)


@hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")
def hydra_app(cfg: DictConfig) -> float:
    from mtbench.campaign.repeats import run_repeats
    from mtbench.device.budget import target_from_cfg
    from mtbench.results.console import print_summary

    hydra_cfg = HydraConfig.get()
    try:
        # the composed values (an experiment YAML sets them too) and every _target_, in the parent, before the job
        objective = check_composed(cfg)
        target_from_cfg(cfg)  # a target value of the wrong kind: one line here, not a traceback in the job
        if cost_problem(cfg):  # objective=energy_time_cost_j without a max power to weigh time by
            raise UsageError(cost_problem(cfg))
        if cfg.get("resume", False):
            done = finished_summary(hydra_cfg.runtime.output_dir, cfg)
            if done is not None:
                result = "ok" if done.get("success") else (done.get("failure") or {}).get("kind", "failed")
                print(f"    resume: {hydra_cfg.runtime.output_dir} holds this job's result ({result}); not run again",
                      flush=True)
                # the sweep's own eta and max power weigh a resumed job's figures (energy_time_cost_j)
                return objective_value({**done, "config": OmegaConf.to_container(cfg, resolve=True)}, objective)
        check_targets(cfg)
        check_job_folder(hydra_cfg.runtime.output_dir)
        # before the first job: a power restore file a run that died left is applied; a sweep restores once, at its end
        SWEEP.before_job(cfg, hydra_cfg.mode == RunMode.MULTIRUN, str(hydra_cfg.launcher.get("_target_", "")))
        # the job trains in a child process (repeat=N: N of them, one after the other)
        summary = run_repeats(cfg, hydra_cfg.runtime.output_dir)
    except UsageError as exc:
        sys.exit(print_error(exc))  # inside Hydra's task function: Hydra would print a traceback of a raise
    print_summary(summary, hydra_cfg.runtime.output_dir, compact=hydra_cfg.mode == RunMode.MULTIRUN)
    if hydra_cfg.mode != RunMode.MULTIRUN and (not summary["success"] or summary.get("write_error")):
        sys.exit(1)  # a single failed job (the summary says why) is a failed command
    return objective_value(summary, objective)


def check_job_folder(out_dir: str) -> None:
    """The job's folder and the one above it are this user's (or root's) and no other user can write them unless
    sticky; else a UsageError: another user could plant a file there that root reads (a power restore record), or
    swap the folder for one of their own while the job runs."""
    for folder in (out_dir, os.path.dirname(os.path.abspath(out_dir))):
        problem = folder_problem(folder)
        if problem is not None:
            raise UsageError(f"the job's folder {out_dir}: {folder} {problem}, refused (another user could change "
                             "what the job writes and reads there); allowed: hydra.run.dir (or hydra.sweep.dir) in a "
                             "folder of this user's, or in a sticky one such as /tmp")


def print_help(args: List[str]) -> None:
    """`mtbench --help`: the subcommands, then Hydra's help with each config group's options (a `_base` is none)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    overrides = [a for a in args if a not in ("--help", "-h") and not a.startswith("-")]
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        help_cfg = compose(config_name="config", return_hydra_config=True).hydra.help
        header, footer = help_cfg.header, help_cfg.footer
        try:
            cfg = compose(config_name="config", overrides=overrides)
        except HydraException:  # a sweep (`model=a,b`) composes no single config: show the defaults
            cfg = compose(config_name="config")
    groups = "\n".join(f"{group}: {', '.join(group_options(group))}" for group in GROUPS)
    print(f"{header}\n== Subcommands ==\n{registry.listing()}\n  (mtbench SUBCOMMAND --help for each one's "
          f"arguments)\n\n== Configuration groups ==\nCompose your configuration from those groups (group=option)\n\n"
          f"{groups}\n\n== Config ==\nOverride anything in the config (foo.bar=value)\n\n"
          f"{OmegaConf.to_yaml(cfg)}\n{footer}")


SWEEP_BATCH = 8  # Hydra's basic sweeper composes every job before the first runs: 96 s for 400; 8 at a time instead


def with_sweep_batches(args: List[str]) -> List[str]:
    """`args` with hydra.sweeper.max_batch_size=SWEEP_BATCH added to a sweep on Hydra's basic sweeper (none named
    on the command line, none set there): its first job starts after 8 jobs are composed, not all of them (the
    console's "[job 1 of N]" still counts them all). Another sweeper (hydra/sweeper=optuna) has no such key."""
    multirun = "-m" in args or "--multirun" in args
    other = any(a.lstrip("+~").startswith(("hydra/sweeper=", "override hydra/sweeper")) for a in args)
    set_here = any(a.lstrip("+~").startswith("hydra.sweeper.max_batch_size=") for a in args)
    return args + [f"hydra.sweeper.max_batch_size={SWEEP_BATCH}"] if multirun and not other and not set_here else args


def main(argv: Optional[List[str]] = None) -> None:
    """`mtbench SUBCOMMAND ...` or `mtbench [-m] key=value ...`; ends with sys.exit(status) except after a job."""
    args = list(sys.argv[1:] if argv is None else argv)
    sub = registry.find(args[0]) if args else None
    if sub is not None:
        status = registry.call(sub.name, args[1:])
        if argv is None and sub.quick_exit:  # the program itself, not a caller in this process
            registry.exit_now(status)
        sys.exit(status)
    try:
        asks_help = "--help" in args or "-h" in args
        # the help shows the defaults for a sweep's lists (`model=a,b`): checked as the sweep's would be
        check_overrides((["-m"] if asks_help else []) + [a for a in args if a not in ("--help", "-h")])
        if asks_help:
            print_help(args)
            return
        claim_explicit_dirs(args)  # an explicit run or sweep folder that another run holds is refused here
    except UsageError as exc:
        sys.exit(print_error(exc))
    sys.argv = [sys.argv[0]] + with_sweep_batches(args)
    from mtbench.job import signals

    signals.install_terminate_handlers()  # also while a launcher's workers run the jobs (submitit_local, joblib)
    try:
        hydra_app()
    except KeyboardInterrupt as exc:  # the job's summary already says "interrupted" (or "terminated")
        from mtbench.job.signals import exit_code, stop_signal

        signals.stop_descendants(stop_signal(exc))  # a launcher's workers and their jobs: stopped, none outlives
        print(f"mtbench: {'interrupted' if stop_signal(exc) == 2 else 'terminated by ' + str(exc)}", file=sys.stderr)
        sys.exit(exit_code(exc))  # 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP, as a shell reports them
    finally:
        SWEEP.close()  # the device's power settings as the sweep found them, whatever ended it


if __name__ == "__main__":
    main()
