"""Where the Hydra configs live, the one place objects are instantiated from config, and job settings."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List

from mtbench.errors import UsageError

# Config groups whose option a user picks on the command line (`model=vgg19`); each is a folder in conf/.
GROUPS = ("model", "data", "device", "sampler", "target")

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


def instantiate(node: Any, **kwargs: Any) -> Any:
    """hydra.utils.instantiate restricted to ALLOWED_TARGET_PREFIXES (checked recursively)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate as hydra_instantiate

    _check_targets(node)
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


def _check_targets(node: Any, where: str = "") -> None:
    from omegaconf import DictConfig, ListConfig

    if isinstance(node, (dict, DictConfig)):
        target = node.get("_target_")
        if target is not None and not str(target).startswith(ALLOWED_TARGET_PREFIXES):
            raise UsageError(
                f"_target_ '{target}'{' at ' + where if where else ''} is not allowed; "
                f"allowed prefixes: {', '.join(ALLOWED_TARGET_PREFIXES)}"
            )
        for key, value in node.items():
            _check_targets(value, f"{where}.{key}" if where else str(key))
    elif isinstance(node, (list, ListConfig)):
        for i, value in enumerate(node):
            _check_targets(value, f"{where}[{i}]")


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
            batch_size=positive_int("batch", cfg["batch"]),
            steps=positive_int("steps", cfg["steps"]),
            warmup=positive_int("warmup", cfg["warmup"], minimum=0),
            seed=positive_int("seed", cfg["seed"], minimum=0),
            device=choice("device", cfg["device"]["name"], ("cpu", "cuda", "auto")),
        )


def positive_int(key: str, value: Any, minimum: int = 1) -> int:
    """`value` as an int >= minimum, or a UsageError naming `key` and the allowed range."""
    allowed = f"allowed: a whole number >= {minimum}"
    if isinstance(value, bool):
        raise UsageError(f"{key}={value!r} is not a number; {allowed}")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"{key}={value!r} is not a whole number; {allowed}") from None
    if number != value and str(number) != str(value).strip():
        raise UsageError(f"{key}={value!r} is not a whole number; {allowed}")
    if number < minimum:
        raise UsageError(f"{key}={number} is out of range; {allowed}")
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
        raise UsageError(f"{key}={value!r} is not known; allowed: {', '.join(allowed)}")
    return str(value)
