"""The config's schema: every scalar key a job reads with the rule that checks it (SCHEMA, `setting`,
`check_value`), the objectives a sweep may optimise, and the checks of one value (numbers, choices, output folders)."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from mtbench.config_shape import short as _short
from mtbench.errors import UsageError

LOCK_MODES = ("wait", "fail", "off")  # device_lock: wait for another job's device, fail at once, or no lock
# what a job returns to a Hydra sweeper (`objective=...`), and the direction a sweeper should take
OBJECTIVES = {"step_time_s": "minimize", "throughput": "maximize", "energy_per_sample_j": "minimize"}
# a run to a target (until.*): the training time and energy it took, +inf where the target was not met
OBJECTIVES.update({"time_to_target_s": "minimize", "energy_to_target_j": "minimize"})
# Zeus's weighted time-energy cost per sample: objective_eta x energy + (1 - objective_eta) x max power x time, in J
OBJECTIVES["energy_time_cost_j"] = "minimize"


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


def sets_key(override: str, key: str) -> bool:
    """Whether a command-line override sets `key`: `key=`, `+key=` or `++key=`."""
    return override.startswith(tuple(plus + key + "=" for plus in ("", "+", "++")))


def last_override(overrides: List[str], key: str, default: str) -> str:
    """The value `key=` takes among command-line overrides: the last one given wins, as Hydra composes them (a
    config group's too), `+key=` and `++key=` as well (sets_key); `default` where none sets it."""
    return next((o.split("=", 1)[1] for o in reversed(overrides) if sets_key(o, key)), default)


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
