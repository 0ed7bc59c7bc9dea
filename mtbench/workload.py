"""The small surface every benchmark model implements.

The runner owns measurement (warm-up, synchronization, timing, memory reset and read). A workload only
builds itself on a device, makes its inputs before timing, and runs one training step including the
optimizer update. GANs and DQN own their extra optimizers or environment inside `step`.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Dict, List

import torch

from mtbench.data import DataSource


@dataclass
class SetupContext:
    device: torch.device  # where the model trains
    batch_size: int  # samples per step
    data: DataSource  # where inputs come from (synthetic by default)
    seed: int  # for weights and synthetic inputs
    batches: int  # how many distinct input batches to prepare (the runner cycles through them)


class Workload(abc.ABC):
    """One trainable benchmark. Subclasses set up in `setup` and train in `step`."""

    @abc.abstractmethod
    def setup(self, ctx: SetupContext) -> None:
        """Build model(s) and optimizer(s) on ctx.device and prepare every input batch."""

    @abc.abstractmethod
    def step(self) -> None:
        """One training step: forward, loss, backward, optimizer update. Never times itself."""

    @abc.abstractmethod
    def modules(self) -> List[torch.nn.Module]:
        """The trained networks (for parameter counts)."""

    def parameter_count(self) -> int:
        return sum(p.numel() for m in self.modules() for p in m.parameters())

    def units_per_sample(self) -> Dict[str, float]:
        """Extra throughput units per sample, e.g. {"chars": 100} for a 100-character sequence."""
        return {}

    def close(self) -> None:
        """Release what the workload opened (an environment, files); the runner calls it after the job."""

    def extra_metrics(self, measured_steps: int) -> Dict[str, Any]:
        """Figures only this workload knows (e.g. environment vs update time) over its last
        `measured_steps` steps (the measured ones), added to summary.json."""
        return {}


def optimizer_from(partial: Any, params: Any) -> torch.optim.Optimizer:
    """Call a `_partial_: true` optimizer config once the parameters exist."""
    return partial(params)
