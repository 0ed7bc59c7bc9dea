"""A trace's first training step, or where a workload allows it, only the optimizer state and gradients it leaves."""
from __future__ import annotations

from typing import Any, List, Optional

import torch


def state_only(workload: Any) -> bool:
    """Whether a first step of `workload` leaves nothing a second step depends on but its gradients and its optimizers'
    state (Workload.STEP_LEAVES_ONLY_STATE) under the memory plan it runs (a recomputing plan profiles its blocks in
    the first step)."""
    plan = getattr(workload, "memory_plan", None)
    return bool(getattr(workload, "STEP_LEAVES_ONLY_STATE", False)) and not getattr(plan, "segments", 0)


def take(workload: Any, optimizers: Optional[List[torch.optim.Optimizer]]) -> Optional[List[torch.optim.Optimizer]]:
    """A trace's first step of the set-up `workload`: where `optimizers` (the workload's) are given and state_only
    holds, the state it leaves (leave_state), and the optimizers are returned; else the step runs and None is."""
    if optimizers is not None and state_only(workload):
        leave_state(optimizers)
        return optimizers
    workload.step()
    return None


def leave_state(optimizers: List[torch.optim.Optimizer]) -> None:
    """What a first step leaves, without its forward and backward: each trained parameter's gradient (zeros of its
    shape and strides, as autograd's accumulation makes it) and the state each optimizer's update creates for it."""
    for opt in optimizers:
        for p in _trained(opt):
            p.grad = torch.zeros_like(p)
        opt.step()


def all_trained(optimizers: List[torch.optim.Optimizer]) -> bool:
    """Whether every parameter of the optimizers has a gradient after a step: then a first step would have given each
    one the gradient and the state `leave_state` gave it (an optimizer makes state only for a parameter with one)."""
    return all(p.grad is not None for opt in optimizers for p in _trained(opt))


def _trained(opt: torch.optim.Optimizer) -> List[torch.Tensor]:
    return [p for group in opt.param_groups for p in group["params"] if p.requires_grad]
