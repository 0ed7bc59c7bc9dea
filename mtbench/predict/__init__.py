"""Predict a training job before running it: fake-tensor trace of the workload's step, FLOPs, a calibrated roofline."""
from __future__ import annotations

MIN_TORCH = (2, 5)  # torch.distributed._tools.mem_tracker.MemTracker and torch.utils.flop_counter's module tracking


def require_torch() -> None:
    """Raise a UsageError (one line) when this torch is too old for the predictor."""
    import torch

    from mtbench.errors import UsageError

    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2] if p.isdigit())
    if version < MIN_TORCH:
        raise UsageError(f"mtbench predict needs torch >= {'.'.join(map(str, MIN_TORCH))} (MemTracker, fake tensors); "
                         f"this is torch {torch.__version__}: predict on a host with a newer torch, for any target=")
