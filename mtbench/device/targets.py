"""Board targets (conf/target/): a Jetson's shared memory, the budget one training process gets, its peak figures."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any, Dict, Optional, Tuple, Union

from mtbench.config import conf_dir, group_options
from mtbench.errors import UsageError


OPTIONAL = ("gpu_capability",)  # fields a target file may leave out (null)


@dataclass(frozen=True)
class Target:
    """One board as in conf/target/<name>.yaml; None where the file says null (the `none` target: all None)."""

    name: str  # option name, e.g. "tx2"
    description: Optional[str]
    memory_total_bytes: Optional[int]  # the board's DRAM, shared by CPU and GPU
    memory_budget_bytes: Optional[int]  # what one training process can use: total - OS/desktop - CUDA context
    peak_fp32_flops: Optional[float]  # GPU peak FLOP/s, FP32
    peak_fp16_flops: Optional[float]  # GPU peak FLOP/s, FP16 (tensor cores, dense, where the GPU has them)
    dram_bandwidth_bytes_per_s: Optional[float]
    cpu_cores: Optional[int]
    cpu_types: Union[Tuple[str, ...], str, None]  # per core by index, or one type for all cores
    jetpack: Optional[str]  # the JetPack the board runs (its last, or the current one)
    cuda: Optional[str]
    python: Optional[str]
    torch: Optional[str]  # the newest torch NVIDIA ships for that JetPack
    gpu_capability: Optional[str] = None  # the GPU's CUDA compute capability, "major.minor" (TX2: "6.2")

    @classmethod
    def none(cls) -> "Target":
        """No target board: no budget, no figures."""
        return cls(name="none", **{f.name: None for f in fields(cls) if f.name != "name"})

    def capability(self) -> Optional[Tuple[int, int]]:
        """The GPU's compute capability as (major, minor); None where the file does not say."""
        match = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", self.gpu_capability or "")
        return (int(match.group(1)), int(match.group(2))) if match else None

    @property
    def is_none(self) -> bool:
        return self.memory_budget_bytes is None

    @classmethod
    def from_mapping(cls, node: Dict[str, Any]) -> "Target":
        """A Target from a composed config's `target` node (or the YAML file's mapping)."""
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in node and n not in OPTIONAL]
        if missing:
            raise UsageError(f"target {node.get('name')!r} lacks {', '.join(missing)}; see conf/target/none.yaml")
        values = {n: node.get(n) for n in names}
        for key in ("memory_total_bytes", "memory_budget_bytes", "cpu_cores"):
            values[key] = _whole(values[key], key)
        for key in ("peak_fp32_flops", "peak_fp16_flops", "dram_bandwidth_bytes_per_s"):
            values[key] = _rate(values[key], key)
        for key in ("description", "jetpack", "cuda", "python", "torch", "gpu_capability"):
            if values[key] is not None and not isinstance(values[key], (str, int, float)):
                raise UsageError(f"target.{key}={_shown(values[key])} is not a text; allowed: a text or null")
            values[key] = None if values[key] is None else str(values[key])
        types = values["cpu_types"]
        if types is not None and not isinstance(types, str):
            listed = hasattr(types, "__iter__") and not hasattr(types, "keys")  # a list, also OmegaConf's
            if not listed or any(not isinstance(t, str) for t in types):
                raise UsageError(f"target.cpu_types={_shown(types)} is not a core type or a list of them; allowed: "
                                 "e.g. cortex-a57 or [denver2, denver2, cortex-a57]")
            types = tuple(str(t) for t in types)
        values["cpu_types"] = types
        values["name"] = str(values["name"])
        return cls(**values)

    def to_dict(self) -> Dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if isinstance(out["cpu_types"], tuple):
            out["cpu_types"] = list(out["cpu_types"])
        return out


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 and text.isprintable() else ascii(text[:57]) + "..."


def _number(value: Any) -> Optional[float]:
    """`value` as a finite number; None where it is none (a bool, a text, a list, inf or nan)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def _whole(value: Any, key: str) -> Optional[int]:
    if value is None:
        return None
    number = _number(value)
    if number is None or number != int(number) or number < 0:
        raise UsageError(f"target.{key}={_shown(value)} is not a whole number >= 0; allowed: such a number or null")
    return int(number)


def _rate(value: Any, key: str) -> Optional[float]:
    if value is None:
        return None
    number = _number(value)
    if number is None or number <= 0:
        raise UsageError(f"target.{key}={_shown(value)} is not a number > 0; allowed: such a number or null")
    return number


def load_target(name: str) -> Target:
    """conf/target/<name>.yaml as a Target; an unknown name is a UsageError naming the allowed ones."""
    from omegaconf import OmegaConf

    allowed = group_options("target")
    if name not in allowed:
        raise UsageError(f"target={name!r} is not known; allowed: {', '.join(allowed)}")
    node = OmegaConf.to_container(OmegaConf.load(conf_dir() / "target" / f"{name}.yaml"), resolve=True)
    return Target.from_mapping(node)
