"""Where the Hydra configs live, the one place objects are instantiated from config, and job settings.

Long because it is the one validator: what each `_target_` may build, the job's settings, and every check of the
command-line overrides and of the composed config before a job runs.
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from mtbench.config_shape import check_shape, plain_value, short as _short
from mtbench.errors import UsageError

LOCK_MODES = ("wait", "fail", "off")  # device_lock: wait for another job's device, fail at once, or no lock
# what a job returns to a Hydra sweeper (`objective=...`), and the direction a sweeper should take
OBJECTIVES = {"step_time_s": "minimize", "throughput": "maximize", "energy_per_sample_j": "minimize"}
# a run to a target (until.*): the training time and energy it took, +inf where the target was not met
OBJECTIVES.update({"time_to_target_s": "minimize", "energy_to_target_j": "minimize"})
# Zeus's weighted time-energy cost per sample: objective_eta x energy + (1 - objective_eta) x max power x time, in J
OBJECTIVES["energy_time_cost_j"] = "minimize"
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


def check_target(target: str, where: str) -> None:
    """The one `_target_` of the node at `where` is allowed (see `check_targets`), or a UsageError says why."""
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


# ---------------------------------------------------------------------------------------------------------------
# The schema: every scalar key a job reads, with the rule that checks it. Every place that reads one of these keys
# asks `setting` (a composed config) or `check_value` (one value, e.g. from the command line), so a value is judged
# once, by one rule, with one message naming it and what is allowed.

PLANS = ("none", "recompute", "microbatch", "auto")  # memory.plan
CPU_MALLOC = ("auto", "glibc", "live", "cached")  # memory.cpu_malloc (mtbench.device.peak applies it)
SELECTORS = ("auto", "predictor", "probes")  # memory.select
SAMPLER_MODES = ("process", "thread")  # sampler.mode: where the sampling loop runs (see conf/sampler/_base.yaml)
DEVICES = ("cpu", "cuda", "auto")  # device.name


def _whole(minimum: int) -> Any:
    return lambda key, value: positive_int(key, value, minimum=minimum)


def _bounded(minimum: int, maximum: Any, why: str) -> Any:
    """A whole number from `minimum` to `maximum()` (a callable: the bound may be this machine's)."""
    def rule(key: str, value: Any) -> int:
        number = positive_int(key, value, minimum=minimum)
        if number > maximum():
            raise UsageError(f"{key}={number} is out of range; allowed: {minimum}-{maximum()} ({why})")
        return number
    return rule


def _max_workers() -> int:
    return 4 * (os.cpu_count() or 1)


def _one_of(*allowed: str) -> Any:
    return lambda key, value: choice(key, value, allowed)


def _boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise UsageError(f"{key}={_short(value)} is not known; allowed: true, false")
    return value


def _auto_or_whole(minimum: int, maximum: Optional[int], what: str) -> Any:
    def rule(key: str, value: Any) -> Any:
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum or \
                (maximum is not None and value > maximum):
            raise UsageError(f"{key}={_short(value)} is not allowed; allowed: auto or {what}")
        return value
    return rule


def _micro(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{key}={_short(value)} is not allowed; allowed: a whole number >= 1")
    return value


def _gib_or_null(key: str, value: Any) -> Optional[float]:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
                              or value == float("inf")):
        raise UsageError(f"{key}={_short(value)} is not allowed; allowed: null or a number of GiB > 0")
    return value


def _path_or_null(key: str, value: Any) -> Optional[str]:
    if value is not None and (not isinstance(value, str) or not value):
        raise UsageError(f"{key}={_short(value)} is not allowed; allowed: null or a file path")
    return value


def _null_or(test: Any, allowed: str) -> Any:
    """A rule for a power.* key: null (leave the device as it is), or a value `test` accepts (and may convert)."""
    def rule(key: str, value: Any) -> Any:
        if value is None:
            return None
        try:
            return test(list(value) if hasattr(value, "__iter__") and not isinstance(value, str) else value)
        except (TypeError, ValueError):
            raise UsageError(f"{key}={value!r} is not allowed; allowed: null or {allowed}") from None
    return rule


def _require(ok: bool) -> None:
    """A value rule's test: a ValueError (the rule's caller says the one line) where it fails. Not `assert`, which
    `python -O` removes: every value would then pass."""
    if not ok:
        raise ValueError("not allowed")


def _int(v: Any, minimum: int = 1) -> int:
    _require(isinstance(v, int) and not isinstance(v, bool) and v >= minimum)
    return v


def _cores(v: Any) -> Any:  # a count, or distinct core indices
    return _int(v) if not isinstance(v, list) else [_int(c, 0) for c in v] if v and len(set(v)) == len(v) else _int(-1)


def _mhz_pair(v: Any) -> List[int]:  # one clock (min = max) or [min, max]
    pair = [_int(c) for c in (v if isinstance(v, list) else [v, v])]
    _require(len(pair) == 2 and pair[0] <= pair[1])
    return pair


def _watts(v: Any) -> float:
    _require(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf"))
    return v


def _eta(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise UsageError(f"{key}={_short(value)} is not allowed; allowed: a number 0-1 (1: energy alone, 0: time "
                         "alone)")
    return value


def _mode(v: Any) -> Any:
    _require(bool((isinstance(v, str) and v) or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)))
    return v


def _accuracy(v: Any) -> float:  # an accuracy: a share of the held-out samples
    _require(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1)
    return float(v)


def _loss(v: Any) -> float:  # a training loss to reach: finite and > 0
    _require(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf"))
    return float(v)


def _word(v: Any) -> str:
    _require(isinstance(v, str) and v.replace("_", "").isalnum())
    return v

SCHEMA: Dict[str, Any] = {
    "batch": _whole(1),
    "steps": _whole(1),
    "warmup": _whole(0),
    "seed": _whole(0),
    "device.name": _one_of(*DEVICES),
    "profile": _boolean,
    "cudnn_benchmark": _boolean,
    "resume": _boolean,
    "allow_parallel": _boolean,
    "objective": _one_of(*OBJECTIVES),
    "objective_eta": _eta,
    "objective_max_power_w": _null_or(_watts, "a number of W > 0 (the device's highest power draw)"),
    "device_lock": _one_of(*LOCK_MODES),
    "lock_timeout_s": _null_or(_watts, "a number of seconds > 0 (how long a job waits for another job's device)"),
    "sampler.mode": _one_of(*SAMPLER_MODES),
    "sampler.interval_ms": lambda key, value: interval_ms(key, value),
    "memory.plan": _one_of(*PLANS),
    "memory.microbatch": _micro,
    "memory.recompute": _auto_or_whole(1, None, "a whole number of segments >= 1"),
    "memory.recompute_share": _auto_or_whole(1, 100, "a whole percentage 1-100"),
    "memory.budget_gb": _gib_or_null,
    "memory.budget_file": _path_or_null,
    "memory.select": _one_of(*SELECTORS),
    "memory.expandable_segments": _boolean,
    "memory.cpu_malloc": _one_of(*CPU_MALLOC),
    "memory.breakdown": _boolean,
    "power.nvpmodel": _null_or(_mode, "an nvpmodel mode id or name (`mtbench power` lists them)"),
    "power.cpu_cores": _null_or(_cores, "a number of cores >= 1 or a list of core indices (e.g. [0,2])"),
    "power.cpu_max_khz": _null_or(_int, "a whole number of kHz >= 1"),
    "power.gpu_max_hz": _null_or(_int, "a whole number of Hz >= 1"),
    "power.emc_max_hz": _null_or(_int, "a whole number of Hz >= 1"),
    "power.governor": _null_or(_word, "a cpufreq governor name"),
    "power.lock_clocks": _boolean,
    "power.gpu_power_limit_w": _null_or(_watts, "a number of W > 0"),
    "power.gpu_locked_clocks_mhz": _null_or(_mhz_pair, "a clock in MHz or [min, max] MHz with min <= max"),
    "power.sysfs_root": _path_or_null,
    "data.loader": _one_of("preloaded", "dataloader"),
    "data.workers": _bounded(0, _max_workers, "at most 4 loader processes per core of this machine"),
    "data.pin_memory": _boolean,
    "data.prefetch_factor": _bounded(1, lambda: 64, "batches each loader process prepares ahead"),
    "data.persistent_workers": _boolean,
    "data.cache_dir": _path_or_null,
    "repeat": lambda key, value: repeat_count(key, value),
    "logger.name": _one_of("none", "csv", "tensorboard", "mlflow", "wandb"),
    "logger.mode": _one_of("offline", "online", "disabled"),
    "until.accuracy": _null_or(_accuracy, "a held-out top-1 accuracy 0 < A <= 1 (0.94 for 94 %)"),
    "until.loss": _null_or(_loss, "a training loss > 0"),
    "until.eval_every": _whole(1),
    "data.cache": _one_of("warm", "cold", "drop_caches"),
}


# what a key is where a composed config lacks it (a test's hand-made config)
SCHEMA_DEFAULTS: Dict[str, Any] = {"sampler.interval_ms": 5.0, "sampler.mode": "process", "device_lock": "wait",
                                   "resume": False, "allow_parallel": False}


def check_value(key: str, value: Any) -> Any:
    """`value` for schema key `key`, checked (and parsed: "16" -> 16 for whole numbers); a UsageError otherwise."""
    return SCHEMA[key](key, value)


def setting(cfg: Any, key: str, default: Any = None) -> Any:
    """The composed config's value at dotted `key` (`default` where absent), checked by the schema."""
    node: Any = cfg
    for part in key.split("."):
        node = node.get(part) if hasattr(node, "get") else None
        if node is None:
            return check_value(key, default)
    return check_value(key, node)


def positive_int(key: str, value: Any, minimum: int = 1) -> int:
    """`value` as an int >= minimum, or a UsageError naming `key` and the allowed range."""
    allowed = f"allowed: a whole number >= {minimum}"
    if isinstance(value, bool):
        raise UsageError(f"{key}={value!r} is not a number; {allowed}")
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: inf
        raise UsageError(f"{key}={value!r} is not a whole number; {allowed}") from None
    if number != value and str(number) != str(value).strip():
        raise UsageError(f"{key}={value!r} is not a whole number; {allowed}")
    if number < minimum:
        raise UsageError(f"{key}={number} is out of range; {allowed}")
    return number


MAX_REPEAT = 100  # repeat=N: a 95 % interval narrows as 1/sqrt(N); past 100 runs a sweep is the better tool


def repeat_count(key: str, value: Any) -> int:
    """repeat=N: a whole number 1..MAX_REPEAT, or a UsageError naming the value and the range."""
    number = positive_int(key, value)
    if number > MAX_REPEAT:
        raise UsageError(f"{key}={number} is out of range; allowed: a whole number from 1 to {MAX_REPEAT}")
    return number


def positive_float(key: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{key}={value!r} is not a number; allowed: a number > 0") from None
    if not number > 0:
        raise UsageError(f"{key}={value!r} is out of range; allowed: a number > 0")
    return number


def choice(key: str, value: Any, allowed: Any) -> str:
    if value not in allowed:
        raise UsageError(f"{key}={_short(value)} is not known; allowed: {', '.join(allowed)}")
    return str(value)


def override_values(override: Any) -> Optional[List[Any]]:
    """Every value a parsed override stands for (a sweep expanded), or None where it cannot be listed (glob)."""
    if not override.is_sweep_override():
        return [override.value()]
    try:
        return list(override.sweep_iterator())
    except Exception:
        return None


# sampler.interval_ms: /proc/stat moves every 10 ms, so a period under 1 ms only burns a core; a period over 1 s
# cannot mark steps (docs/measurement.md)
INTERVAL_MS_RANGE = (1.0, 1000.0)
NAME_MAX_BYTES = 255  # one name in a path (Linux NAME_MAX)
OUTPUT_DIR_KEYS = ("hydra.run.dir", "hydra.sweep.dir")
PSEUDO_FILE_SYSTEMS = ("/proc", "/sys", "/dev")


def interval_ms(key: str, value: Any) -> float:
    """A sampling period in ms within INTERVAL_MS_RANGE, or a UsageError naming `key` and the range."""
    low, high = INTERVAL_MS_RANGE
    allowed = (f"allowed: {low:g} to {high:g} ms (/proc/stat moves every 10 ms; a slower period than "
               f"{high:g} ms cannot mark steps)")
    if isinstance(value, bool):
        raise UsageError(f"{key}={value!r} is not a number; {allowed}")
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise UsageError(f"{key}={_short(value)} is not a number; {allowed}") from None
    if not low <= number <= high:  # NaN fails both comparisons
        raise UsageError(f"{key}={_short(value)} is out of range; {allowed}")
    return number


def check_output_dir(key: str, value: Any) -> None:
    """An explicit hydra.run.dir / hydra.sweep.dir that Hydra could not create or write ends in one line here."""
    import os

    text = str(value)
    if "${" in text:
        return  # an interpolation (the default's date and time): Hydra resolves it
    if not text.strip():
        raise UsageError(f"{key}={text!r} is empty; allowed: a folder name")
    where = f"{key}={_short(text)}"
    too_long = [name for name in text.split("/") if len(os.fsencode(name)) > NAME_MAX_BYTES]
    if too_long:
        raise UsageError(f"{where}: a name in it is {len(os.fsencode(too_long[0]))} bytes; allowed: at most "
                         f"{NAME_MAX_BYTES} bytes per name")
    path = os.path.abspath(text)
    if any(path == root or path.startswith(root + "/") for root in PSEUDO_FILE_SYSTEMS):
        raise UsageError(f"{where} is under {path.split('/')[1] and '/' + path.split('/')[1]}; allowed: a folder "
                         f"outside {', '.join(PSEUDO_FILE_SYSTEMS)}")
    probe = path
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise UsageError(f"{where}: {probe} is an existing file, not a folder; allowed: a folder, or a path where "
                         "one can be created")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{where}: {probe} is not writable by this user; allowed: a folder this user can write in")


def _loader() -> Any:
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path

    return ConfigLoaderImpl(config_search_path=create_config_search_path(str(conf_dir())))


def check_composition(overrides: List[str], multirun: bool, base: Optional[List[str]] = None) -> None:
    """Compose and resolve the config as the job will (sweep lists of -m left out: each job composes one value),
    so that what Hydra or OmegaConf would refuse inside the job (a `+key` that exists, a value of the wrong type
    for its node, an interpolation to no key, a sweep list without -m) ends here in one line. With `base` (the
    group choices among the overrides), each value keeps the kind it has in the config composed from them alone
    (config_shape.check_shape)."""
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    mode = RunMode.MULTIRUN if multirun else RunMode.RUN
    try:
        cfg = _loader().load_configuration(config_name="config", overrides=overrides, run_mode=mode)
        check_hydra_node(cfg.get("hydra"))  # what Hydra builds or runs itself, from any YAML or override
        for key in cfg:  # Hydra resolves its own node (dates, job names) when the job starts
            if key != "hydra":
                node = cfg[key]
                if OmegaConf.is_config(node):
                    OmegaConf.to_container(node, resolve=True)
        if base is not None:
            plain = _loader().load_configuration(config_name="config", overrides=base, run_mode=mode)
            for key in plain:
                if key != "hydra" and key in cfg:
                    check_shape(plain_value(plain[key]), plain_value(cfg[key]), key, SCHEMA)
    except (HydraException, OmegaConfBaseException, ValueError, TypeError, OverflowError, RecursionError,
            OSError) as exc:  # OSError: a group name longer than a file name may be
        text = " ".join(str(exc).split("\n")[0].split())  # Hydra adds hints and full-key lines below the first
        raise UsageError(f"{text[:300] or type(exc).__name__}; see docs/configuration.md") from None


# Hydra's own nodes that name code: its plugins (whose classes Hydra itself limits to registered plugins, though it
# builds what is nested in their nodes first), its callbacks, and Python's logging.config (a "()" key calls any
# importable callable; "class" names a handler or formatter class)
PLUGIN_NODES = ("launcher", "sweeper")
SAMPLER_BASE = "optuna.samplers._base.BaseSampler"  # the Optuna sweeper's hydra.sweeper.sampler
LOGGING_NODES = ("job_logging", "hydra_logging")


def check_hydra_node(hydra_node: Any) -> None:
    """Every `_target_` and logging factory in the composed `hydra` node is one it may hold, or a UsageError names
    it: a callback is an allowed Callback subclass, a plugin's node holds no `_target_` below its own (but an
    Optuna sampler), no other `_target_` anywhere, and logging names classes of the logging package only."""
    from omegaconf import OmegaConf

    if hydra_node is None:
        return
    tree = OmegaConf.to_container(hydra_node, resolve=False)
    for name, node in (tree.get("callbacks") or {}).items():
        if not isinstance(node, dict) or "_target_" not in node:
            raise UsageError(f"hydra.callbacks.{name} has no _target_; allowed: a node whose _target_ names a Hydra "
                             "Callback subclass of mtbench")
        check_targets(_resolved(hydra_node, f"callbacks.{name}"), f"hydra.callbacks.{name}")
    for key, value in tree.items():
        if key in LOGGING_NODES:
            for where, target in _targets(value, f"hydra.{key}"):
                raise UsageError(f"_target_ '{target}' at {where}: no _target_ belongs in Hydra's logging config; "
                                 "allowed: 'class' naming a logging handler or formatter")
            _check_logging(value, f"hydra.{key}")
            for name, handler in ((value or {}).get("handlers") or {}).items():
                if not isinstance(handler, dict) or not handler.get("class"):
                    raise UsageError(f"hydra.{key}.handlers.{name} names no 'class' (logging.config cannot build "
                                     "it); allowed: a logging handler class, as logging.StreamHandler")
        elif key in PLUGIN_NODES:
            for where, target in _targets(value, f"hydra.{key}"):
                if where == f"hydra.{key}":
                    continue  # Hydra instantiates only a registered plugin class there
                if where == "hydra.sweeper.sampler":
                    _check_class(_resolved_target(hydra_node, "sweeper.sampler"), where, SAMPLER_BASE,
                                 "an Optuna sampler class (optuna.samplers)")
                    continue
                raise UsageError(f"_target_ '{target}' at {where}: no _target_ belongs there; allowed: "
                                 f"the plugin's own _target_ at hydra.{key}")
        elif key != "callbacks":
            for where, target in _targets(value, f"hydra.{key}"):
                raise UsageError(f"_target_ '{target}' at {where}: no _target_ belongs there; allowed: "
                                 "hydra.callbacks (an mtbench Callback), hydra.launcher and hydra.sweeper")


def _targets(node: Any, where: str) -> List[tuple]:
    """(dotted path, value) of every `_target_` in plain container `node` at `where`."""
    found = []
    if isinstance(node, dict):
        if "_target_" in node:
            found.append((where, node["_target_"]))
        for key, value in node.items():
            found.extend(_targets(value, f"{where}.{key}"))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.extend(_targets(value, f"{where}[{i}]"))
    return found


def _resolved(hydra_node: Any, key: str) -> Any:
    """hydra.`key` with its interpolations resolved (a `_target_` from ${oc.env:...} is judged on its value)."""
    from omegaconf import OmegaConf

    node = OmegaConf.select(hydra_node, key, throw_on_missing=False)
    try:
        return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    except Exception as exc:  # noqa: BLE001 - an interpolation that cannot resolve before the job names no code
        raise UsageError(f"hydra.{key} cannot be resolved before the job ({type(exc).__name__}); allowed: a node "
                         "whose _target_ is a plain name") from None


def _resolved_target(hydra_node: Any, key: str) -> str:
    node = _resolved(hydra_node, key)
    return str(node.get("_target_")) if isinstance(node, dict) else ""


def _check_class(name: str, where: str, base: str, kind: str) -> None:
    obj = _resolve(name, f" at {where}")
    if not (inspect.isclass(obj) and base in _bases(obj)):
        raise UsageError(f"_target_ '{name}' at {where} is not {kind}; allowed there: {kind}")


def _check_logging(node: Any, where: str) -> None:
    """A logging.config dict: no "()" factory (it calls any importable callable); each "class" a class defined in
    the logging package (a handler, a formatter or a filter, as logging.config takes them)."""
    if isinstance(node, dict):
        for key, value in node.items():
            at = f"{where}.{key}"
            if key == "()":
                raise UsageError(f"{where}: a '()' factory ({_short(value)}) is not allowed in Hydra's logging "
                                 "config; allowed: 'class' naming a logging handler or formatter")
            if key == "class" and isinstance(value, str):
                obj = _resolve(value, f" at {at}")
                module = str(getattr(obj, "__module__", ""))
                if not (inspect.isclass(obj) and (module == "logging" or module.startswith("logging."))):
                    raise UsageError(f"{at}={_short(value)} is not a class of the logging package; allowed: "
                                     "logging.StreamHandler, logging.FileHandler, logging.Formatter and the like")
            else:
                _check_logging(value, at)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _check_logging(value, f"{where}[{i}]")


def _config_keys(choices: Dict[str, List[str]]) -> Optional[set]:
    """Every dotted key of the config composed with each listed group option (their union), Hydra's own left out."""
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    runs = [[]] + [[f"{group}={value}"] for group, values in choices.items() for value in values]
    keys: set = set()
    for overrides in runs:
        if tuple(overrides) not in _KEYS_CACHE:
            try:
                cfg = _loader().load_configuration(config_name="config", overrides=overrides, run_mode=RunMode.RUN)
            except Exception:  # noqa: BLE001 - a choice that does not compose: check_composition says why
                return None
            tree = OmegaConf.to_container(cfg, resolve=False)
            tree.pop("hydra", None)
            _KEYS_CACHE[tuple(overrides)] = set(_walk(tree))
        keys |= _KEYS_CACHE[tuple(overrides)]
    return keys


_KEYS_CACHE: Dict[tuple, set] = {}


def _walk(node: Any, prefix: str = "") -> List[str]:
    keys = []
    if isinstance(node, dict):
        for key, value in node.items():
            dotted = f"{prefix}.{key}" if prefix else str(key)
            keys.append(dotted)
            keys.extend(_walk(value, dotted))
    return keys


def check_known_key(key: str, keys: set) -> None:
    """`key` is in the composed config, or a UsageError names it and the closest known key."""
    import difflib

    if key in keys:
        return
    close = difflib.get_close_matches(key, sorted(keys), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}?" if close else "allowed: a key of the composed config (mtbench --help lists them)"
    name = key if len(key) <= 60 and key.isprintable() else _short(key)
    raise UsageError(f"unknown key {name}; {hint} (+{name}=VALUE adds a new key)")


def _parse_each(args: List[str]) -> list:
    """Hydra's parse of every override, one at a time, so that a failure names the override that caused it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    overrides = []
    for arg in args:
        try:
            overrides.extend(parser.parse_overrides([arg]))
        except HydraException as exc:
            raise UsageError(f"{_short(arg)} is not an override Hydra can read ({str(exc).splitlines()[0][:120]}); "
                             "allowed: key=value (see docs/configuration.md)") from None
        except (ValueError, OverflowError, RecursionError) as exc:  # e.g. an int of more than 4300 digits
            raise UsageError(f"{_short(arg)} cannot be read ({str(exc).split(';')[0][:120]}); allowed: key=value "
                             "with a number of at most 4300 digits") from None
    return overrides


def check_overrides(args: List[str]) -> None:
    """Reject unknown keys, unknown config-group options, out-of-range numbers and output folders that cannot be
    written among the command-line overrides, each in one line (a UsageError)."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()

    def refuse(message: str) -> None:  # Hydra's argparse would print its usage and exit: one line instead
        raise UsageError(message)

    parser.error = refuse  # type: ignore[assignment]
    parsed, _ = parser.parse_known_args(args)
    overrides = _parse_each(parsed.overrides)
    choices: Dict[str, List[str]] = {}
    for override in overrides:
        if override.key_or_group in GROUPS and not override.is_delete():
            values = override_values(override) or []
            choices[override.key_or_group] = [str(v) for v in values]
    for override in overrides:
        key = override.key_or_group
        if override.is_delete():
            continue
        values = override_values(override)
        if values is None:
            continue
        if key in OUTPUT_DIR_KEYS:
            for value in values:
                check_output_dir(key, value)
        elif key.endswith("_target_") and not key.startswith("hydra."):  # Hydra's own nodes (launcher, sweeper)
            where = key[:-len("_target_")].rstrip(".")
            for value in values:
                check_target(str(value), where)
        elif key in GROUPS:
            allowed = group_options(key)
            for value in values:
                if str(value) not in allowed:
                    raise UsageError(f"{key}={_short(value)} is not known; allowed: {', '.join(allowed)}")
        elif key in SCHEMA:  # the schema's rule, as the job will apply it to the composed value
            for value in values:
                check_value(key, value)
    unknown = [o.key_or_group for o in overrides
               if not (o.is_add() or o.is_force_add() or o.key_or_group in GROUPS or o.package is not None
                       or o.key_or_group.startswith("hydra") or "/" in o.key_or_group)]
    swept = [o.key_or_group for o in overrides if parsed.multirun and o.is_sweep_override()]
    trial = [a for a, o in zip(parsed.overrides, overrides) if not (parsed.multirun and o.is_sweep_override())]
    known_choices = {g: v for g, v in choices.items() if all(x in group_options(g) for x in v)}
    try:
        # one composition: where it holds, every key it overrode exists (Hydra refuses a key that does not)
        base = [a for a, o in zip(parsed.overrides, overrides) if o.key_or_group in GROUPS and a in trial]
        check_composition(trial, parsed.multirun, base)
    except UsageError:
        _check_known_keys(unknown, known_choices)  # an unknown key is named, with the closest known one
        raise
    _check_known_keys([key for key in unknown if key in swept], known_choices)  # -m lists: not in the trial


def _check_known_keys(keys: List[str], choices: Dict[str, List[str]]) -> None:
    """Each of `keys` is a key of the config composed with some listed group option, or a UsageError names it."""
    if not keys:
        return
    known = _config_keys(choices)
    for key in keys if known is not None else []:
        check_known_key(key, known)


def check_composed(cfg: Any) -> str:
    """The composed config's own values a job cannot start without (an experiment YAML sets them too, past the
    command line's checks); returns the objective."""
    for key in ("sampler.interval_ms", "sampler.mode", "device_lock", "resume", "allow_parallel"):
        setting(cfg, key, SCHEMA_DEFAULTS.get(key))
    model = cfg.get("model")
    name = model.get("name") if hasattr(model, "get") else ""
    if model is not None and (not isinstance(name, str) or not name):  # e.g. `~model.name` on the command line
        raise UsageError(f"model.name={_short(name)} is not a model name; allowed: a model= option "
                         f"({', '.join(group_options('model'))}), whose name it keeps")
    return str(setting(cfg, "objective", "step_time_s"))
