"""Expected step cost of memory plans from the predictor's traces (FLOPs and ops), where no step time is calibrated."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from mtbench.workload.plans import MemoryPlan

# What one op costs beside its FLOPs (dispatch, a oneDNN primitive's setup, a kernel launch), as FLOPs of the same
# time: ~10 us of a CPU that runs ~50 GFLOP/s. Not measured for this machine (a calibration would give it), so the
# cost of a plan is an interval: this figure a factor PER_OP_RANGE either way, and the recomputed FLOPs a factor
# RECOMPUTE_RANGE either way (a CNN's early blocks, which recomputation repeats first, run fewer FLOP/s than the
# step's average: larger maps, fewer channels).
PER_OP_FLOPS = 5e5
PER_OP_RANGE = 4.0
RECOMPUTE_RANGE = 1.25


@dataclass(frozen=True)
class TracedStep:
    """The figures of one traced training step under a plan (predict.Prediction and its trace)."""

    flops: int  # the whole step's, the recomputed forward included
    ops: int  # aten ops of the step
    optimizer_ops: int  # of which the optimizer update's (run once per step, whatever the micro-batches)


@dataclass(frozen=True)
class PlanCost:
    """A plan's step time relative to `none`'s (1.0): the estimate and its interval."""

    low: float
    mid: float
    high: float

    def to_dict(self) -> Dict[str, float]:
        return {"low": round(self.low, 4), "mid": round(self.mid, 4), "high": round(self.high, 4)}


def _relative(plain: TracedStep, flops: float, ops: float, per_op: float) -> float:
    return (flops + ops * per_op) / max(1.0, plain.flops + plain.ops * per_op)


def plan_cost(plan: MemoryPlan, plain: TracedStep, recomputed: Optional[TracedStep]) -> PlanCost:
    """The cost of `plan` from the trace of `none` (`plain`) and of its own recomputation share (`recomputed`, the
    same plan without micro-batches; None for a plan without recomputation): the recomputed forward's FLOPs and
    ops are the traces' difference; each micro-batch after the first runs the forward's and backward's ops again
    (the optimizer's once), on the same FLOPs in all."""
    step = recomputed if plan.segments and recomputed is not None else plain
    extra_flops = max(0, step.flops - plain.flops)
    passes_ops = step.ops - step.optimizer_ops
    corners = []
    for per_op in (PER_OP_FLOPS / PER_OP_RANGE, PER_OP_FLOPS, PER_OP_FLOPS * PER_OP_RANGE):
        for scale in (1 / RECOMPUTE_RANGE, 1.0, RECOMPUTE_RANGE):
            flops = plain.flops + extra_flops * scale
            ops = step.ops + (plan.microbatch - 1) * passes_ops
            corners.append(_relative(plain, flops, ops, per_op))
    mid = _relative(plain, step.flops, step.ops + (plan.microbatch - 1) * passes_ops, PER_OP_FLOPS)
    return PlanCost(min(corners), mid, max(corners))


def order_by_cost(plans: List[MemoryPlan], costs: Dict[MemoryPlan, PlanCost], batchnorm: bool = False
                  ) -> List[MemoryPlan]:
    """Cheapest expected cost first (ties: the order given); with BatchNorm, the plans without micro-batches first
    (the full batch's gradients; docs/memory.md)."""
    if batchnorm:
        return sorted(plans, key=lambda p: (p.microbatch > 1, costs[p].mid))
    return sorted(plans, key=lambda p: costs[p].mid)


def unsure(a: PlanCost, b: PlanCost) -> bool:
    """Whether the two plans' costs cannot be told apart: their intervals overlap."""
    return a.low <= b.high and b.low <= a.high
