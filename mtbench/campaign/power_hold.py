"""One restore per sweep: a sweep's jobs keep their power settings between them (a job with the same ones as the
job before changes nothing) and the sweep restores the device once, at its end, whatever ends it. Before the first
job a restore file that a run which died left behind is applied (said in one line), and the permissions every job's
power.* keys need are checked before any job runs. Registers the resolvers the power presets use
(conf/experiment/powermodes.yaml, cores.yaml): the board's nvpmodel modes and core counts as sweep lists."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

from omegaconf import OmegaConf

from mtbench.config import override_values
from mtbench.device import power, power_record as machine, power_sysfs
from mtbench.errors import UsageError
from mtbench.job import signals

OmegaConf.register_new_resolver("mtbench_nvpmodel_modes", power_sysfs.mode_list, replace=True)
OmegaConf.register_new_resolver("mtbench_core_counts", power_sysfs.core_counts, replace=True)

# launchers that run a sweep's jobs in this process, one after another: the sweep's record can live here
IN_PROCESS = ("hydra._internal.core_plugins.basic_launcher.BasicLauncher",)


def asks_power(cfg: Any) -> bool:
    node = cfg.get("power") or {}
    return any(v is not None and v is not False for k, v in node.items() if k != "sysfs_root")


class SweepPower:
    """The run's hold of the device's power settings: `before_job` for each job, `close` when the run ends."""

    def __init__(self) -> None:
        self.started = False
        self.path: Optional[str] = None  # the machine's restore file while this sweep holds it

    def before_job(self, cfg: Any, sweep: bool, launcher: str) -> None:
        if self.started:
            return
        self.started = True
        try:
            path = machine.path_for(power.sysfs_root(cfg))
            found = machine.read(path)
        except UsageError:
            if asks_power(cfg):
                raise
            return  # a file another user planted must not stop a run that changes nothing
        if found is not None and not machine.alive(found):
            power.restore_leftover(path, found)
        if sweep and launcher in IN_PROCESS:
            os.environ[machine.HOLD_ENV] = json.dumps({"path": path, **machine.owner()})
            self.path = path

    def close(self) -> None:
        """The sweep's end (success, an error, Ctrl-C, SIGTERM): restore what its jobs changed, once."""
        self.started = False  # a next run in this process (tests call main() again) checks for leftovers again
        if self.path is None:
            return
        path, self.path = self.path, None
        os.environ.pop(machine.HOLD_ENV, None)
        try:
            found = machine.read(path)
        except UsageError as exc:
            power.say(str(exc))
            return
        if found is None or found.get("pid") != os.getpid():
            return
        if found.get("files") or found.get("nvpmodel") is not None or found.get("nvml"):  # a cores-only sweep: none
            with signals.stop_signals_deferred():  # a second Ctrl-C or SIGTERM waits for the restore
                power.restore_record(found)
            power.say(f"the sweep has ended: restored the device's settings as it found them (from {path})")
        machine.remove(path, os.getpid())


SWEEP = SweepPower()


def power_problem(config: Any) -> Optional[str]:
    """Why a sweep's power.* values cannot be set here (a value the board does not have, a file this user may not
    write, NVML's keys without root), said before any job runs; None where they can (or none is asked)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    hydra = config.get("hydra") or {}
    params = (hydra.get("sweeper") or {}).get("params") or {}
    typed = [f"{k}={v}" for k, v in params.items()] + list((hydra.get("overrides") or {}).get("task") or [])
    first: Dict[str, Any] = {k: v for k, v in (config.get("power") or {}).items()}
    every: Dict[str, List[Any]] = {}
    for override in OverridesParser.create().parse_overrides(typed):  # the command line's come last and win
        key = override.key_or_group
        if key.startswith("power.") and key[len("power."):] in power.KEYS:
            every[key[len("power."):]] = [v for v in (override_values(override) or []) if v is not None]
    for key, values in every.items():
        first[key] = values[0] if values else None
    if not any(v is not None and v is not False for k, v in first.items() if k != "sysfs_root"):
        return None
    if (first.get("gpu_power_limit_w") is not None or first.get("gpu_locked_clocks_mhz") is not None) \
            and os.geteuid() != 0:
        return ("power.gpu_power_limit_w / power.gpu_locked_clocks_mhz: NVML sets them for root only; run as root "
                "(sudo) or leave them null")
    sampler_root = (config.get("sampler") or {}).get("sysfs_root")
    trials = [first] + [{**first, key: value} for key, values in every.items() for value in values[1:]]
    try:
        for trial in trials:
            probe = {"power": {k: v for k, v in trial.items() if k in power.KEYS or k == "sysfs_root"},
                     "sampler": {"sysfs_root": sampler_root}}
            power.PowerControl(probe, os.devnull, None).check()
    except UsageError as exc:
        return str(exc)
    return None
