"""The one way a training step is timed, by jobs and by the planner's probes alike."""
from __future__ import annotations

import time
from typing import Callable, Tuple

import torch

from mtbench.device.select import sync


def timed_step(device: torch.device, step: Callable[[], object]) -> Tuple[float, float]:
    """Run `step()`; its (start, end) on the monotonic clock. The device is synchronized before the start and after
    the step (a CPU-GPU sync point: the work queued before stays out of the window, the step's kernels finish
    inside it)."""
    sync(device)
    start = time.monotonic()
    step()
    sync(device)
    return start, time.monotonic()
