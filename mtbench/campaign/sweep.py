"""Progress of a `-m` sweep (job k of n, model, batch, last step time) and a table of all jobs at its end.

A Hydra callback (registered in conf/config.yaml under hydra.callbacks), so it sees every job of any
launcher that runs them in this process.
"""
from __future__ import annotations

import math
import re
import sys
from pathlib import Path
from typing import Any, List, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from mtbench.campaign.power_hold import power_problem
from mtbench.campaign.resume import cost_problem
from mtbench.config import override_values
from mtbench.errors import print_error


def sweep_size(overrides: List[str]) -> Optional[int]:
    """How many jobs the sweep overrides expand to (None where one cannot be counted, e.g. glob)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    n = 1
    for override in OverridesParser.create().parse_overrides(overrides):
        values = override_values(override)
        if values is None:
            return None
        n *= len(values)
    return n


def sweep_problem(config: DictConfig) -> Optional[str]:
    """What makes this sweep's composed config unfit to measure, or None: a launcher that runs jobs at once on
    this machine (jobs that measure one device at once spoil each other's figures; the device lock would make them
    wait) unless allow_parallel=true, or an energy objective with no power sensor."""
    launcher = config.hydra.launcher
    target = str(launcher.get("_target_", ""))
    parallel = None
    if target.endswith("JoblibLauncher") and launcher.get("n_jobs", -1) != 1:
        parallel = "hydra/launcher=joblib runs several jobs at once (hydra.launcher.n_jobs=1 runs one at a time)"
    elif target.endswith("submitit_launcher.LocalLauncher"):
        parallel = "hydra/launcher=submitit_local runs all jobs at once"
    elif target.endswith("RayLauncher") and not (launcher.get("ray") or {}).get("init", {}).get("address"):
        parallel = "hydra/launcher=ray on a local cluster (no hydra.launcher.ray.init.address) runs several jobs at once"
    if parallel and not config.get("allow_parallel", False):
        return (f"{parallel} on this machine, and jobs that measure one device at once spoil each other's figures; "
                "allow_parallel=true runs them anyway (each job still waits for the device lock)")
    if config.get("objective") in ("energy_per_sample_j", "energy_time_cost_j") and \
            list(config.sampler.sensors) == ["procfs"]:
        return (f"objective={config.get('objective')} needs a power sensor and sampler=procfs has none; allowed: "
                "sampler=jetson, jtop, nvml, rapl or auto")
    to_target = config.get("objective") in ("time_to_target_s", "energy_to_target_j")  # runs to a target (until.*)
    if to_target and all((config.get("until") or {}).get(k) is None for k in ("accuracy", "loss")):
        return f"objective={config.objective} needs a run to a target; allowed: until.accuracy=A or until.loss=L"
    if config.get("objective") == "energy_to_target_j" and list(config.sampler.sensors) == ["procfs"]:
        return ("objective=energy_to_target_j needs a power sensor and sampler=procfs has none; allowed: "
                "sampler=jetson, jtop, nvml, rapl or auto")
    if cost_problem(config):
        return cost_problem(config)
    if power_problem(config):  # power.* keys this user may not set: before any job, not at the first that asks
        return power_problem(config)
    return None


def summaries_in_job_order(root: Path) -> List[Path]:
    """Every summary.json under `root`, ordered by job number (Hydra's subdir starts with it: 2 before 10)."""
    def key(path: Path):
        name = path.parent.relative_to(root).as_posix()
        return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]

    return sorted(root.rglob("summary.json"), key=key)


def _fmt(v: Optional[float], spec: str) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


class SweepProgress(Callback):
    def __init__(self) -> None:
        self.total: Optional[int] = None
        self.done = 0

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        problem = sweep_problem(config)
        if problem:  # before any job runs, as for every other bad value
            sys.exit(print_error(problem))
        try:
            # the sweeper's own params (an experiment file's sweep) count too; the command line wins over them
            params = config.hydra.sweeper.get("params") or {}
            task = list(config.hydra.overrides.task)
            typed = {o.split("=", 1)[0].lstrip("+~") for o in task}
            self.total = sweep_size([f"{k}={v}" for k, v in params.items() if k not in typed] + task)
        except Exception:
            self.total = None

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.get().mode != RunMode.MULTIRUN:
            return
        print(f"[job {HydraConfig.get().job.num + 1} of {self.total or '?'}] model={config.model.name} "
              f"batch={config.batch} ...", flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from rich.markup import escape
        from rich.table import Table

        from mtbench.results.console import console, fmt_bytes
        from mtbench.results.reader import UnreadableSummary, checked, read_summary_file, unreadable_text

        root = Path(config.hydra.sweep.dir)
        table = Table(title=f"sweep: {root}")
        for col in ("job", "model", "batch", "result", "step median s", "samples/s", "energy/step J", "peak mem"):
            table.add_column(col)
        for path in summaries_in_job_order(root):
            try:
                s = checked(read_summary_file(path))
            except UnreadableSummary as exc:  # the row says so; the other jobs' rows stand
                table.add_row(escape(path.parent.name), "", "", escape(f"unreadable ({exc.reason})"), "", "", "", "")
                continue
            result = "ok" if s.get("success") else (s.get("failure") or {}).get("kind") or "failed"
            if s["_unreadable"]:
                result += f"; unreadable: {unreadable_text(s)}"
            table.add_row(escape(path.parent.name), escape(str(s.get("model"))), str(s.get("batch_size")), escape(result),
                          _fmt((s.get("step_time_s") or {}).get("median"), ".4f"),
                          _fmt(s.get("throughput_samples_per_s"), ".2f"),
                          _fmt((s.get("energy_j") or {}).get("per_step_mean"), ".3f"),
                          fmt_bytes(s.get("mem_peak_bytes")))
        console.print(table)
        console.print(f"results in {root}", markup=False, highlight=False, soft_wrap=True)
