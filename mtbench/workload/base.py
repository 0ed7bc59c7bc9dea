"""The small surface every benchmark model implements.

The runner owns measurement (warm-up, synchronization, timing, memory reset and read). A workload only
builds itself on a device, makes its inputs before timing, and runs one training step including the
optimizer update. GANs and DQN own their extra optimizers or environment inside `step`.
"""
from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import torch

from mtbench.data.base import BatchRecipe, DataSource
from mtbench.errors import UsageError
from mtbench.workload import plans

MAX_PREPARED_BATCHES = 8  # distinct input batches a job makes before timing; its steps cycle through them

# what `step` returns: its loss as a detached 0-d tensor, a dict of named losses (the first is the headline), or None
StepLoss = Union[torch.Tensor, Dict[str, torch.Tensor], None]


def batch_of_size(batches: List[Any], steps: range, stat: str = "max") -> int:
    """The index of the largest (by tensor bytes) of `batches` that steps `steps` take, step i taking i % len; with
    `stat` "median" or "min", the batch of that size among the steps' batches (each as often as a step takes it; the
    lower middle of an even count): a padded job's median or fastest step is about that batch's step."""
    if stat not in ("max", "median", "min"):
        raise ValueError(f"stat={stat!r}: allowed max, median, min")
    size = [sum(t.numel() * t.element_size() for t in b if isinstance(t, torch.Tensor)) for b in batches]
    if stat == "max":
        return max(sorted({i % len(batches) for i in steps}), key=lambda i: size[i])
    taken = sorted((i % len(batches) for i in steps), key=lambda i: (size[i], i))
    return taken[0] if stat == "min" else taken[(len(taken) - 1) // 2]


@dataclass
class SetupContext:
    device: torch.device  # where the model trains
    batch_size: int  # samples per step
    data: DataSource  # where inputs come from (synthetic by default)
    seed: int  # for weights and synthetic inputs
    batches: int  # how many distinct input batches to prepare (the runner cycles through them)


class Workload(abc.ABC):
    """One trainable benchmark. Subclasses set up in `setup` and train in `step`.

    Memory plans (memory.plan): a workload whose network is a chain of blocks offers them once in `blocks()` and
    runs that network through `planned_forward`; one whose loss is a mean over the samples of its batch computes
    it through `planned_backward` and sets MICROBATCH. The runner sets `memory_plan` between steps.
    """

    memory_plan: plans.MemoryPlan = plans.NONE  # how the next step runs (recompute, micro-batches)
    MICROBATCH = False  # True: `step` computes its gradients through `planned_backward`
    EVALUATES_ACCURACY = False  # True: `held_out_batches` and `accuracy` measure it on held-out data (until.accuracy)
    # True: every step takes inputs of the same shapes and leaves nothing the next depends on but the gradients and
    # the optimizers' state (the predictor's trace then makes those instead of running a first step)
    STEP_LEAVES_ONLY_STATE = False
    # True: each of `self.batches` is padded to its own longest example, and the vocabulary comes from all of them,
    # so batches differ in size: the predictor prepares the job's batches and traces the largest one it measures
    PADDED_PER_BATCH = False

    @abc.abstractmethod
    def setup(self, ctx: SetupContext) -> None:
        """Build model(s) and optimizer(s) on ctx.device and prepare every input batch."""

    @abc.abstractmethod
    def step(self) -> StepLoss:
        """One training step: forward, loss, backward, optimizer update. Never times itself.

        Returns the step's loss as a detached 0-d tensor on the device, never read back to the host here (`.item()`
        would be a CPU-GPU sync point inside the timed window; the job reads it after the step's closing
        synchronization); a workload with several losses returns them by name, headline first (DCGAN:
        {"loss_d": ..., "loss_g": ...}); None where it has no loss."""

    @abc.abstractmethod
    def modules(self) -> List[torch.nn.Module]:
        """The trained networks (for parameter counts)."""

    def batch_recipe(self) -> Optional[BatchRecipe]:
        """How data.loader=dataloader makes this workload's batches from a set's files (after `setup`: it may need
        the vocabulary); None: it trains only on the batches it prepares."""
        return None

    def take_batch(self, batch: Any) -> None:
        """Train the next step on `batch` (on the device already), from data.loader=dataloader's pipeline."""
        raise NotImplementedError(f"{type(self).__name__} trains only on the batches it prepares")

    def held_out_batches(self, data: DataSource, batch_size: int) -> List[Any]:
        """The held-out batches `accuracy` measures on, made before timing (EVALUATES_ACCURACY workloads)."""
        raise NotImplementedError(f"{type(self).__name__} measures no accuracy")

    def accuracy(self, batches: List[Any]) -> float:
        """Top-1 accuracy (0-1) of the trained network on `batches`, without training on them (EVALUATES_ACCURACY
        workloads); the caller times nothing of it and synchronizes after it."""
        raise NotImplementedError(f"{type(self).__name__} measures no accuracy")

    def blocks(self) -> Optional[List[torch.nn.Module]]:
        """The trained network as a sequence of blocks (x -> b_n(...b_1(x))) for recomputation; None: not segmented."""
        return None

    def set_memory_plan(self, plan: plans.MemoryPlan) -> None:
        """Run the following steps under `plan`; a plan this workload cannot run is a UsageError."""
        if plan.segments and not self.blocks():
            raise UsageError(f"memory.plan=recompute: {type(self).__name__} offers no sequential blocks to "
                             "recompute; allowed: memory.plan=none" + (" or microbatch" if self.MICROBATCH else ""))
        if plan.microbatch > 1 and not self.MICROBATCH:
            raise UsageError(f"memory.plan=microbatch: {type(self).__name__} does not accumulate micro-batches; "
                             "allowed: memory.plan=none" + (" or recompute" if self.blocks() else ""))
        self.memory_plan = plan

    def planned_forward(self, net: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """net(x), or its blocks in checkpointed segments under a recompute plan."""
        segments = self.memory_plan.segments
        blocks = self.blocks() if segments else None
        if not blocks:
            return net(x)
        return plans.forward_segments(blocks, self.segment_runs(segments, x, self.memory_plan.share), x)

    def segment_runs(self, segments: int, x: torch.Tensor, share: int = 100) -> List[Tuple[int, int]]:
        """The runs of blocks that make `segments` checkpointed segments over the leading blocks that save `share` %
        of the activation bytes, from a profile of what each block saves (one forward of two samples of `x`, on the
        first call: BatchNorm needs two at 1x1)."""
        blocks = self.blocks() or []
        profile = getattr(self, "_block_profile", None)
        if profile is None:
            profile = self._block_profile = plans.profile_blocks(blocks, x[:2].detach())
        cache = self.__dict__.setdefault("_segment_runs", {})
        if (segments, share) not in cache:
            cache[segments, share] = plans.partition(profile, segments, share)
        return cache[segments, share]

    def runs_used(self, plan: plans.MemoryPlan) -> Optional[List[Tuple[int, int]]]:
        """The checkpointed runs of blocks `plan` used in this workload's steps (None before a step ran under it)."""
        return self.__dict__.get("_segment_runs", {}).get((plan.segments, plan.share))

    def planned_backward(self, loss_of: Callable[..., torch.Tensor], *batch: Any, batch_dim: int = 0) -> torch.Tensor:
        """loss_of(*batch).backward(), in micro-batches under a micro-batch plan (gradients accumulated; the caller
        then makes one optimizer update). loss_of must return the mean loss over the samples it is given."""
        if self.memory_plan.microbatch <= 1:
            try:
                loss = loss_of(*batch)
                loss.backward()
            finally:  # torch 2.0 under recompute: BatchNorm's statistics updated once, even by a step that fails
                plans.restore_running_stats()
            return loss.detach()
        return plans.accumulate_backward(loss_of, batch, self.memory_plan.microbatch, batch_dim)

    def parameter_count(self) -> int:
        return sum(p.numel() for m in self.modules() for p in m.parameters())

    def units_per_sample(self) -> Dict[str, float]:
        """Extra throughput units per sample, e.g. {"chars": 100} for a 100-character sequence."""
        return {}

    def step_next_on_largest(self, measured: range) -> None:
        """Make the step after next take the largest input batch the `measured` steps took (a PADDED_PER_BATCH
        workload cycles through `self.batches` with `self.i`), so that the two untimed steps that measure training
        memory see the job's peak, which the predictor traces; nothing for any other workload."""
        held = getattr(self, "batches", None)
        if self.PADDED_PER_BATCH and isinstance(held, list) and len(held) > 1:
            self.i = batch_of_size(held, measured) - 1

    def host_bytes(self, later_steps: int) -> int:
        """Memory the workload holds outside torch tensors (NumPy arrays: a replay buffer's touched pages) once
        `later_steps` more steps have run: the predictor adds it on a CPU, where it counts against a budget."""
        return 0

    def host_seconds(self) -> float:
        """Seconds of its last step the workload spent outside torch's ops (an emulator's environment steps), as it
        timed them: the predictor adds it to the ops' time on the host that traced it. 0 where it spends none."""
        return 0.0

    def close(self) -> None:
        """Release what the workload opened (an environment, files); the runner calls it after the job."""

    def extra_metrics(self, measured_steps: int) -> Dict[str, Any]:
        """Figures only this workload knows (e.g. environment vs update time) over its last
        `measured_steps` steps (the measured ones), added to summary.json."""
        return {}


def step_losses(result: StepLoss) -> Dict[str, float]:
    """A step's return value as {name: float}: "loss" for a single tensor, the workload's names for a dict (headline
    first); {} for None. Reads the tensors back to the host: call it after the step's closing synchronization."""
    if result is None:
        return {}
    if isinstance(result, torch.Tensor):
        return {"loss": float(result)}
    return {str(name): float(value) for name, value in result.items()}


def optimizer_from(partial: Any, params: Any) -> torch.optim.Optimizer:
    """Call a `_partial_: true` optimizer config once the parameters exist."""
    return partial(params)


@contextlib.contextmanager
def default_plan(plan: plans.MemoryPlan) -> Iterator[None]:
    """Every Workload made inside the block starts with `plan` (the predictor builds its own workloads)."""
    saved = Workload.memory_plan
    Workload.memory_plan = plan
    try:
        yield
    finally:
        Workload.memory_plan = saved
