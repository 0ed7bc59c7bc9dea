"""Workloads that exist only to test the runner: an OOM, a busy loop, a tensor of chosen size."""
from __future__ import annotations

import time
from typing import List

import torch

from mtbench.workload import SetupContext, Workload


class _Base(Workload):
    def setup(self, ctx: SetupContext) -> None:
        self.net = torch.nn.Linear(2, 2)

    def modules(self) -> List[torch.nn.Module]:
        return [self.net]


class OutOfMemory(_Base):
    """Raises the given kind of out-of-memory error on its first step."""

    def __init__(self, error: str = "MemoryError") -> None:
        self.error = error

    def step(self) -> None:
        if self.error == "cuda":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if self.error == "runtime":
            raise RuntimeError("CUDA error: out of memory")
        raise MemoryError("cannot allocate 64 GiB")


class Broken(_Base):
    def step(self) -> None:
        raise ValueError("a bug in the model")


class BusyLoop(_Base):
    """One thread spinning in Python for `seconds` per step: 100 % of one core."""

    def __init__(self, seconds: float = 0.3) -> None:
        self.seconds = seconds

    def step(self) -> None:
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass


class Interrupted(_Base):
    """As if the user pressed Ctrl-C during the second step."""

    def __init__(self) -> None:
        self.steps = 0

    def step(self) -> None:
        self.steps += 1
        if self.steps == 2:
            raise KeyboardInterrupt
