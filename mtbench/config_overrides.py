"""The checks before any job: the command line's overrides (`check_overrides`: unknown keys and options, values
out of range, output folders), the config Hydra will compose from them (`check_composition`, with each value's
kind), what Hydra's own nodes may build or run (`check_hydra_node`) and the composed values (`check_composed`)."""
from __future__ import annotations

import inspect
from typing import Any, Dict, List, Optional

from mtbench.config import GROUPS, _bases, _resolve, check_target, check_targets, conf_dir, group_options
from mtbench.config_schema import (OUTPUT_DIR_KEYS, SCHEMA, SCHEMA_DEFAULTS, check_output_dir, check_value,
                                   override_values, setting)
from mtbench.config_shape import check_shape, plain_value, short as _short
from mtbench.errors import UsageError


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
