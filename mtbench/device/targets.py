"""Board targets (conf/target/): a Jetson's shared memory, the budget one training process gets, its peak figures."""
from __future__ import annotations

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
            values[key] = None if values[key] is None else float(values[key])
        for key in ("description", "jetpack", "cuda", "python", "torch", "gpu_capability"):
            values[key] = None if values[key] is None else str(values[key])
        types = values["cpu_types"]
        if types is not None and not isinstance(types, str):
            types = tuple(str(t) for t in types)
        values["cpu_types"] = types
        values["name"] = str(values["name"])
        return cls(**values)

    def to_dict(self) -> Dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if isinstance(out["cpu_types"], tuple):
            out["cpu_types"] = list(out["cpu_types"])
        return out


def _whole(value: Any, key: str) -> Optional[int]:
    if value is None:
        return None
    number = int(float(value))
    if number != float(value) or number < 0:
        raise UsageError(f"target.{key}={value!r} is not a whole number >= 0")
    return number


def load_target(name: str) -> Target:
    """conf/target/<name>.yaml as a Target; an unknown name is a UsageError naming the allowed ones."""
    from omegaconf import OmegaConf

    allowed = group_options("target")
    if name not in allowed:
        raise UsageError(f"target={name!r} is not known; allowed: {', '.join(allowed)}")
    node = OmegaConf.to_container(OmegaConf.load(conf_dir() / "target" / f"{name}.yaml"), resolve=True)
    return Target.from_mapping(node)
