"""Memory plans: recomputed activations (checkpointed runs of a workload's blocks), micro-batches (accumulated gradients)."""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from mtbench.config import setting

# torch >= 2.1: checkpoint(context_fn=...) lets the recomputation run without updating BatchNorm's running statistics
CONTEXT_FN = "context_fn" in inspect.signature(checkpoint).parameters


@dataclass(frozen=True)
class MemoryPlan:
    """How one training step runs: `segments` checkpointed segments over the blocks (0: keep every activation) and
    `microbatch` micro-batches per step (1: the whole batch at once), both at once when both are set."""

    segments: int = 0  # checkpointed segments (recomputation); 0: none; AUTO_SEGMENTS: the fewest-bytes partition
    microbatch: int = 1  # micro-batches per step; gradients accumulated, one optimizer update
    share: int = 100  # % of the activation bytes recomputed: the leading blocks that save that much (the rest kept)

    @property
    def name(self) -> str:
        parts = (["recompute"] if self.segments else []) + (["microbatch"] if self.microbatch > 1 else [])
        return "+".join(parts) or "none"

    @property
    def label(self) -> str:
        """Short form for steps.csv and tables: none, recompute/4, recompute/auto@50% (the leading blocks that save
        half the activation bytes), microbatch/2, recompute/4+microbatch/2."""
        seg = "auto" if self.segments == AUTO_SEGMENTS else self.segments
        share = f"@{self.share}%" if self.segments and self.share < 100 else ""
        parts = ([f"recompute/{seg}{share}"] if self.segments else []) + (
            [f"microbatch/{self.microbatch}"] if self.microbatch > 1 else [])
        return "+".join(parts) or "none"

    def to_dict(self) -> Dict[str, Any]:
        return {"plan": self.name, "segments": self.segments, "microbatch": self.microbatch, "share": self.share,
                "label": self.label}


NONE = MemoryPlan()
AUTO_SEGMENTS = -1  # memory.recompute=auto: the partition whose estimated activation memory is least
SHARES = (25, 50, 75, 100)  # memory.recompute_share=auto under a budget: the cheapest of these that fits


@dataclass(frozen=True)
class PlanSettings:
    """The `memory:` node of conf/config.yaml, checked."""

    plan: str  # none | recompute | microbatch | auto
    microbatch: int  # micro-batches per step for plan=microbatch (auto chooses its own)
    recompute: int  # segments for plan=recompute; AUTO_SEGMENTS: the partition with the least estimated memory
    budget_bytes: Optional[int]  # memory.budget_gb in bytes (None: the target's budget)
    budget_file: Optional[str]  # a file the run watches for a new budget
    expandable_segments: bool  # the CUDA caching allocator's expandable_segments setting
    cpu_malloc: str = "auto"  # glibc's malloc on CPU: auto | glibc | live | cached (mtbench.device.peak)
    recompute_share: Optional[int] = None  # % of activation bytes recomputed; None (auto): all, or under a budget
    # the least of SHARES that fits


def settings_from_cfg(cfg: Any) -> PlanSettings:
    """The job config's `memory:` node (absent: no plan); a bad value is a UsageError naming what is allowed."""
    plan = setting(cfg, "memory.plan", "none")
    micro = setting(cfg, "memory.microbatch", 2)
    rec = setting(cfg, "memory.recompute", "auto")
    segments = AUTO_SEGMENTS if rec == "auto" else rec
    gb = setting(cfg, "memory.budget_gb", None)
    expandable = setting(cfg, "memory.expandable_segments", False)
    budget_file = setting(cfg, "memory.budget_file", None)
    cpu_malloc = setting(cfg, "memory.cpu_malloc", "auto")
    share = setting(cfg, "memory.recompute_share", "auto")
    return PlanSettings(plan=plan, microbatch=int(micro), recompute=segments,
                        budget_bytes=None if gb is None else int(float(gb) * 2**30),
                        budget_file=None if budget_file is None else str(budget_file),
                        expandable_segments=expandable, cpu_malloc=cpu_malloc,
                        recompute_share=None if share == "auto" else int(share))


# --------------------------------------------------------------------------------------------------------------
# Running a planned step. Workload.planned_forward / planned_backward call these; no model repeats them.

class _KeepRunningStats:
    """While a segment is recomputed in the backward pass, BatchNorm must not update its running statistics a
    second time (the forward already did): they are copied before the recomputation and put back after it. (The
    recomputation must save the same tensors as the forward, so BatchNorm still gets its running buffers.)"""

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        self.norms = [m for block in modules for m in block.modules()
                      if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
        self.saved: List[List[torch.Tensor]] = []

    def __enter__(self) -> None:
        self.saved = [[b.clone() for b in self._buffers(m)] for m in self.norms]

    def __exit__(self, *exc: Any) -> None:
        with torch.no_grad():
            for m, saved in zip(self.norms, self.saved):
                for buf, old in zip(self._buffers(m), saved):
                    buf.copy_(old)
        self.saved = []

    @staticmethod
    def _buffers(m: nn.Module) -> List[torch.Tensor]:
        return [b for b in (m.running_mean, m.running_var, m.num_batches_tracked) if b is not None]


def _segment_fn(blocks: Sequence[nn.Module]) -> Callable[[torch.Tensor], torch.Tensor]:
    def run(x: torch.Tensor) -> torch.Tensor:
        for block in blocks:
            x = block(x)
        return x

    return run


@dataclass(frozen=True)
class BlockProfile:
    """Bytes per sample of each block's input and of what it saves for the backward pass (parameters excluded)."""

    input_bytes: List[int]
    saved_bytes: List[int]


def profile_blocks(blocks: Sequence[nn.Module], x: torch.Tensor) -> BlockProfile:
    """One forward of a small batch `x` through the blocks, counting what each saves for backward (saved-tensor
    hooks; works on fake tensors too). Running statistics and the RNG are left as they were; no backward runs."""
    samples = max(1, x.shape[0])
    inputs: List[int] = []
    saved: List[int] = []
    counted = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, nn.Parameter):
            counted[0] += t.numel() * t.element_size()
        return t

    devices = [x.device.index or 0] if x.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), _KeepRunningStats(blocks), torch.enable_grad():
        for block in blocks:
            inputs.append(x.numel() * x.element_size() // samples)
            counted[0] = 0
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                x = block(x)
            saved.append(counted[0] // samples)
    return BlockProfile(inputs, saved)


def _partition_under(saved: Sequence[int], limit: int) -> List[Tuple[int, int]]:
    """Greedy runs of blocks each saving at most `limit` bytes (a block over the limit stays alone)."""
    runs, start, total = [], 0, 0
    for i, b in enumerate(saved):
        if total and total + b > limit:
            runs.append((start, i))
            start, total = i, 0
        total += b
    runs.append((start, len(saved)))
    return runs


def estimate_bytes(profile: BlockProfile, runs: Sequence[Tuple[int, int]]) -> int:
    """Activation bytes per sample with every run checkpointed: the runs' inputs are kept through the step, and the
    backward recomputes one run at a time (the first run's input is the batch, held anyway)."""
    kept = sum(profile.input_bytes[start] for start, _ in runs[1:])
    return kept + max(sum(profile.saved_bytes[a:b]) for a, b in runs)


def leading_blocks(profile: BlockProfile, share: int) -> int:
    """How many blocks, from the first, save `share` % of the activation bytes (at least one)."""
    want = sum(profile.saved_bytes) * share / 100
    acc = 0
    for k, b in enumerate(profile.saved_bytes, 1):
        acc += b
        if acc >= want:
            return k
    return 1  # no blocks


def partition(profile: BlockProfile, segments: int, share: int = 100) -> List[Tuple[int, int]]:
    """[start, end) runs of blocks: `segments` runs balanced by saved bytes, or (AUTO_SEGMENTS) the partition with
    the least estimated activation memory over every balance limit; over the leading blocks that save `share` % of
    the activation bytes (the blocks after the last run keep their activations: their forward is not repeated)."""
    if share < 100:
        k = leading_blocks(profile, share)
        return partition(BlockProfile(profile.input_bytes[:k], profile.saved_bytes[:k]), segments)
    saved = profile.saved_bytes
    n = len(saved)
    limits = sorted({sum(saved[a:b]) for a in range(n) for b in range(a + 1, n + 1)})
    options = [_partition_under(saved, limit) for limit in limits]
    if segments == AUTO_SEGMENTS:
        return min(options, key=lambda runs: (estimate_bytes(profile, runs), len(runs)))
    # the smallest limit that makes at most `segments` runs: runs as even as the blocks allow
    for runs in options:
        if len(runs) <= segments:
            return runs
    return options[-1]


# torch 2.0 (no context_fn): each recomputed segment's running statistics as its forward left them, put back by
# restore_running_stats() once the backward pass (which recomputed the segment) is over
_AFTER_FORWARD: List[_KeepRunningStats] = []


def restore_running_stats() -> None:
    """After a backward pass on torch 2.0: BatchNorm's running statistics back to what the forward made of them
    (the recomputation updated them again); nothing to do on torch >= 2.1, where the recomputation keeps them."""
    while _AFTER_FORWARD:
        _AFTER_FORWARD.pop().__exit__(None, None, None)


def forward_segments(blocks: Sequence[nn.Module], runs: Sequence[Tuple[int, int]], x: torch.Tensor) -> torch.Tensor:
    """x through the blocks, each run of blocks a non-reentrant checkpoint: its activations are dropped after the
    forward and recomputed from its input in the backward pass (Chen et al. 2016; torch.utils.checkpoint).
    BatchNorm's running statistics are updated once per step: on torch >= 2.1 the recomputation runs under
    _KeepRunningStats (CONTEXT_FN); on torch 2.0 they are copied after the forward and put back after the
    backward pass (Workload.planned_backward calls restore_running_stats)."""
    if not torch.is_grad_enabled():
        return _segment_fn(blocks)(x)
    for start, end in runs:
        part = list(blocks[start:end])
        kwargs: Dict[str, Any] = {"use_reentrant": False}
        if CONTEXT_FN:
            kwargs["context_fn"] = lambda part=part: (contextlib.nullcontext(), _KeepRunningStats(part))
        x = checkpoint(_segment_fn(part), x, **kwargs)
        if not CONTEXT_FN:
            keep = _KeepRunningStats(part)
            if keep.norms:
                keep.__enter__()  # the statistics this forward made
                _AFTER_FORWARD.append(keep)
    end = runs[-1][1] if runs else 0
    return _segment_fn(blocks[end:])(x) if end < len(blocks) else x  # a share < 100 %: the rest as usual


def microbatch_slices(batch: int, microbatch: int) -> List[slice]:
    """`microbatch` nearly equal slices of [0, batch) (fewer when the batch is smaller: no empty micro-batch)."""
    n = max(1, min(microbatch, batch))
    bounds = [round(i * batch / n) for i in range(n + 1)]
    return [slice(bounds[i], bounds[i + 1]) for i in range(n)]


def accumulate_backward(loss_of: Callable[..., torch.Tensor], tensors: Sequence[Any], microbatch: int,
                        batch_dim: int = 0) -> torch.Tensor:
    """Forward and backward of one batch in micro-batches: each micro-batch's mean loss is weighted by its share
    of the batch (1/N for equal parts), so the accumulated gradients are those of the batch's mean loss. Tensors
    are split along `batch_dim`; anything else is passed to every micro-batch as it is. Returns the batch's loss
    (detached)."""
    sizes = {t.shape[batch_dim] for t in tensors if isinstance(t, torch.Tensor)}
    if len(sizes) != 1:
        raise ValueError(f"micro-batching needs tensors of one batch size along dim {batch_dim}; got {sorted(sizes)}")
    batch = sizes.pop()
    total: Optional[torch.Tensor] = None
    for part in microbatch_slices(batch, microbatch):
        index = [slice(None)] * batch_dim + [part]
        chunk = [t[tuple(index)] if isinstance(t, torch.Tensor) else t for t in tensors]
        try:
            loss = loss_of(*chunk) * ((part.stop - part.start) / batch)
            loss.backward()
        finally:  # also after a failed micro-batch (an OOM a probe survives): no stale copies for the next step
            restore_running_stats()
        total = loss.detach() if total is None else total + loss.detach()
    assert total is not None
    return total
