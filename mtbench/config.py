"""Where the Hydra configs live, the one place objects are instantiated from config (what each `_target_` may
build), and a job's settings (JobSpec). The schema of every scalar key is config_schema's (its names are read from
here too); the checks before any job are config_overrides'."""
from __future__ import annotations

import importlib
import inspect
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from mtbench.config_schema import (CPU_MALLOC, DEVICES, LOCK_MODES, OBJECTIVES, PLANS, SAMPLER_MODES, SCHEMA,  # noqa: F401
                                   SCHEMA_DEFAULTS, SELECTORS, check_output_dir, check_value, choice, interval_ms,
                                   override_values, positive_float, positive_int, repeat_count, setting)
from mtbench.errors import UsageError

# top-level keys that change how a job is run, not what it measures: a resumed sweep may differ in them, and a
# report draws jobs that differ only in them as one series
NOT_MEASURED_KEYS = ("resume", "device_lock", "lock_dir", "lock_timeout_s", "allow_parallel", "objective", "logger", "objective_eta",
                     "objective_max_power_w")

# Config groups whose option a user picks on the command line (`model=vgg19`); each is a folder in conf/.
GROUPS = ("model", "data", "device", "sampler", "target", "experiment", "logger")

# Hydra 1.4 warns about unrestricted `_target_`s: every instantiate goes through `instantiate` below,
# which accepts only these prefixes. Tests may extend the tuple (monkeypatch) for their fake workloads.
ALLOWED_TARGET_PREFIXES = ("models.", "mtbench.", "torch.optim.", "torchvision.models.")


def conf_dir() -> Path:
    """The conf/ folder: beside the package in a source or editable install, else in <prefix>/share."""
    here = Path(__file__).resolve().parent.parent / "conf"
    if (here / "config.yaml").is_file():
        return here
    installed = Path(sys.prefix) / "share" / "mtbench" / "conf"
    if (installed / "config.yaml").is_file():
        return installed
    raise FileNotFoundError(f"mtbench's conf/ folder was found neither at {here} nor at {installed}")


def group_options(group: str) -> List[str]:
    """The selectable options of a config group (file stems; names starting with '_' are bases, not options)."""
    folder = conf_dir() / group
    return sorted(p.stem for p in folder.glob("*.yaml") if not p.stem.startswith("_"))


def default_option(group: str, model: str, overrides: Sequence[str] = ()) -> Optional[str]:
    """The option of `group` a job of `model` with `overrides` composes: the last `group=X` override, else what the
    model's file (or a file of the model group its defaults list names) picks with `override /group: X`, else
    conf/config.yaml's default; None where another group's override could pick it (a global config such as
    `experiment=`) or a file is not where it should be."""
    from omegaconf import DictConfig, OmegaConf

    for item in reversed(list(overrides)):
        key, _, value = item.partition("=")
        key = key.lstrip("+~")
        if key == group:
            return value
        if key in GROUPS:
            return None

    def picked(path: Path, seen: set) -> Optional[str]:
        if path in seen or not path.is_file():
            return None
        seen.add(path)
        for entry in OmegaConf.load(path).get("defaults") or []:
            for key, value in (entry.items() if isinstance(entry, DictConfig) else [(str(entry), None)]):
                if value is not None and str(key).split()[-1].lstrip("/") == group:
                    return str(value)
                if value is None and key != "_self_":  # a base file of the same folder (_cnn)
                    found = picked(path.parent / f"{key}.yaml", seen)
                    if found is not None:
                        return found
        return None

    return picked(conf_dir() / "model" / f"{model}.yaml", set()) or picked(conf_dir() / "config.yaml", set())


# What each config node may build, judged on the resolved object (not on its dotted name): the node's path
# decides the kind. Base classes are named as strings so that this lowest layer imports neither torch nor the
# layers that define them; a config can only name existing objects, and their module and qualified name are
# what their definition made them.
WORKLOAD_BASE = "mtbench.workload.base.Workload"
DATA_BASE = "mtbench.data.base.DataSource"
MODULE_BASE = "torch.nn.modules.module.Module"
OPTIMIZER_BASE = "torch.optim.optimizer.Optimizer"
CALLBACK_BASE = "hydra.experimental.callback.Callback"
KINDS = {
    "workload": "a Workload subclass",
    "data": "a data source class (a DataSource subclass)",
    "part": "an nn.Module (a subclass, or a function declared to return one) or a torch.optim.Optimizer subclass",
    "callback": "a Hydra Callback subclass",
}


def node_kind(where: str) -> Optional[str]:
    """The kind of object the config node at dotted path `where` builds, or None where no `_target_` belongs."""
    if where == "data":
        return "data"
    if where == "model.workload":
        return "workload"
    if where.startswith(("model.workload.", "model.workload[")):
        return "part"  # a workload's network(s) and optimizer(s), at any depth
    if where.startswith("hydra.callbacks."):
        return "callback"
    return None


def instantiate(node: Any, where: str, **kwargs: Any) -> Any:
    """hydra.utils.instantiate of the config node at dotted path `where`, after `check_targets` allowed it."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate as hydra_instantiate

    check_targets(node, where)
    try:
        return hydra_instantiate(node, **kwargs)
    except InstantiationException as exc:
        # Hydra wraps what the constructor raised; a user's bad value must stay a one-line UsageError
        cause = exc.__cause__
        while cause is not None and not isinstance(cause, UsageError):
            cause = cause.__cause__
        if cause is not None:
            raise cause from None
        raise


def check_targets(node: Any, where: str = "") -> None:
    """Every `_target_` in `node` (the config node at dotted path `where`, recursively) builds the kind of object
    its place allows (`node_kind`), or a UsageError says which and why.

    The dotted name must start with an allowed prefix, and so must the module that defines what it resolves
    to: `mtbench.commands.sample.os.system` starts with "mtbench." but is os.system (defined in posix). Then the
    resolved object must be of its node's kind: `data._target_=mtbench.results.atomic_write` is a function
    under mtbench, but not a data source.
    """
    from omegaconf import DictConfig, ListConfig

    if isinstance(node, (dict, DictConfig)):
        target = node.get("_target_")
        if target is not None:
            check_target(str(target), where)
        for key, value in node.items():
            if key != "_target_":
                check_targets(value, f"{where}.{key}" if where else str(key))
    elif isinstance(node, (list, ListConfig)):
        for i, value in enumerate(node):
            check_targets(value, f"{where}[{i}]")


def check_target(target: str, where: str) -> Any:
    """The one `_target_` of the node at `where` is allowed (see `check_targets`), or a UsageError says why; returns
    what it names."""
    at = f" at {where}" if where else ""
    allowed = f"allowed: callables defined under {', '.join(ALLOWED_TARGET_PREFIXES)}"
    if not target.startswith(ALLOWED_TARGET_PREFIXES):
        raise UsageError(f"_target_ '{target}'{at} is not allowed; {allowed}")
    obj = _resolve(target, at)
    defined_in = obj.__name__ if inspect.ismodule(obj) else getattr(obj, "__module__", None)
    what = "a module" if inspect.ismodule(obj) else f"{getattr(obj, '__qualname__', type(obj).__name__)} from {defined_in}"
    if inspect.ismodule(obj) or not callable(obj) or not (str(defined_in) + ".").startswith(ALLOWED_TARGET_PREFIXES):
        raise UsageError(f"_target_ '{target}'{at} is {what}, which is not allowed; {allowed}")
    kind = node_kind(where)
    if kind is None:
        raise UsageError(f"_target_ '{target}'{at}: no _target_ belongs there; allowed: a _target_ at data, "
                         "model.workload or inside model.workload")
    if not _is_kind(obj, kind):
        raise UsageError(f"_target_ '{target}'{at} is {what}, not {KINDS[kind]}; allowed there: {KINDS[kind]}")
    return obj


def _bases(cls: Any) -> List[str]:
    return [f"{base.__module__}.{base.__qualname__}" for base in inspect.getmro(cls)]


def _is_kind(obj: Any, kind: str) -> bool:
    if kind == "part":
        if inspect.isclass(obj):
            bases = _bases(obj)
            return MODULE_BASE in bases or OPTIMIZER_BASE in bases
        if inspect.isfunction(obj):  # a network factory (torchvision's builders, models.cifar_variants)
            try:
                returns = typing.get_type_hints(obj).get("return")
            except Exception:  # an annotation that does not resolve declares nothing
                return False
            return inspect.isclass(returns) and MODULE_BASE in _bases(returns)
        return False
    base = {"workload": WORKLOAD_BASE, "data": DATA_BASE, "callback": CALLBACK_BASE}[kind]
    return inspect.isclass(obj) and base in _bases(obj)


def _resolve(target: str, at: str) -> Any:
    """The object a dotted name names: the longest importable module part, then attributes."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name is not None and ".".join(parts[:cut]).startswith(exc.name):
                continue  # that module part does not exist: try a shorter one
            raise UsageError(f"_target_ '{target}'{at} cannot be imported ({type(exc).__name__}: {exc})") from None
        except ImportError as exc:
            raise UsageError(f"_target_ '{target}'{at} cannot be imported ({type(exc).__name__}: {exc})") from None
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            raise UsageError(f"_target_ '{target}'{at} does not exist ({'.'.join(parts[:cut])} has no "
                             f"'{'.'.join(parts[cut:])}')") from None
        return obj
    raise UsageError(f"_target_ '{target}'{at} does not exist (no module {parts[0]!r})")


@dataclass(frozen=True)
class JobSpec:
    """The validated scalar settings of one job."""

    model: str  # model name, as in conf/model/<name>.yaml
    batch_size: int  # samples per training step
    steps: int  # measured steps
    warmup: int  # steps run first and not counted (allocator and autotuners settle)
    seed: int  # seeds torch and the synthetic data
    device: str  # "cpu" | "cuda" | "auto" as asked; the runner resolves "auto"

    @classmethod
    def from_cfg(cls, cfg: Dict[str, Any]) -> "JobSpec":
        return cls(
            model=str(cfg["model"]["name"]),
            batch_size=setting(cfg, "batch"),
            steps=setting(cfg, "steps"),
            warmup=setting(cfg, "warmup"),
            seed=setting(cfg, "seed"),
            device=choice("device", cfg["device"]["name"], DEVICES),
        )
