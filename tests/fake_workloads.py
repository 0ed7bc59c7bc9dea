"""Workloads that exist only to test the runner: an OOM, a busy loop, a tensor of chosen size."""
from __future__ import annotations

import time
from typing import List

import torch

from mtbench.workload.base import SetupContext, Workload


class _Base(Workload):
    def setup(self, ctx: SetupContext) -> None:
        self.net = torch.nn.Linear(2, 2)

    def modules(self) -> List[torch.nn.Module]:
        return [self.net]


class OutOfMemory(_Base):
    """Runs out of memory for real on its first step: the CPU allocator refuses an exabyte ("cpu", the text a real
    DefaultCPUAllocator failure has), CUDA's caching allocator does ("cuda"), or Python's allocator ("MemoryError")."""

    def __init__(self, error: str = "MemoryError") -> None:
        self.error = error

    def step(self) -> None:
        if self.error == "cpu":
            torch.empty(1 << 60, dtype=torch.uint8)
        if self.error == "cuda":
            torch.empty(1 << 60, dtype=torch.uint8, device="cuda")
        bytearray(1 << 60)


class Signalled(_Base):
    """Its process receives `signal` (a name such as SIGKILL or SIGSEGV) during step `at_step`."""

    def __init__(self, signal: str = "SIGKILL", at_step: int = 1) -> None:
        self.signal = signal
        self.at_step = at_step
        self.steps = 0

    def step(self) -> None:
        import os
        import signal

        self.steps += 1
        if self.steps == self.at_step:
            os.kill(os.getpid(), getattr(signal, self.signal))


class StickyCudaError(_Base):
    """A step fails, then releasing the workload fails the way a sticky CUDA error makes every later call fail."""

    def step(self) -> None:
        raise ValueError("a bug in the model")

    def close(self) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


class Broken(_Base):
    def step(self) -> None:
        raise ValueError("a bug in the model")


class BusyLoop(_Base):
    """One thread spinning in Python for `seconds` per step: 100 % of one core where the machine gives it one.
    With `truth_file`, each step appends the CPU seconds this process got during it (from its own nanosecond clock)
    and its wall seconds: on a loaded VM a spinning thread is not on a core all the time it spins."""

    def __init__(self, seconds: float = 0.3, ready_file: str = "", truth_file: str = "") -> None:
        self.seconds = seconds
        self.ready_file = ready_file  # touched at the first step, for tests that act on a running job
        self.truth_file = truth_file

    def step(self) -> None:
        if self.ready_file:
            open(self.ready_file, "a").close()
        cpu0, wall0 = time.process_time(), time.monotonic()
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass
        if self.truth_file:
            with open(self.truth_file, "a") as f:
                f.write(f"{time.process_time() - cpu0} {time.monotonic() - wall0}\n")


class Interrupted(_Base):
    """As if the user pressed Ctrl-C during the second step."""

    def __init__(self) -> None:
        self.steps = 0

    def step(self) -> None:
        self.steps += 1
        if self.steps == 2:
            raise KeyboardInterrupt


class CrashOnClose(_Base):
    """Trains, then its process dies of SIGSEGV while the workload is released (as a driver teardown can)."""

    def step(self) -> None:
        pass

    def close(self) -> None:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGSEGV)


class TerminatedAt(_Base):
    """SIGTERM reaches the job during its step number `at_step` (1 = the first, warm-up or measured, or one of
    the untimed steps after them: training memory's two on a CPU, then the breakdown's), as signals.py turns it
    into signals.Terminated."""

    def __init__(self, at_step: int = 1) -> None:
        self.at_step = at_step
        self.steps = 0

    def step(self) -> None:
        import signal

        from mtbench.job.signals import Terminated

        self.steps += 1
        if self.steps == self.at_step:
            raise Terminated(signal.SIGTERM)


class ExitsInStep(_Base):
    """Library code that calls sys.exit() inside a step (SystemExit is no Exception)."""

    def step(self) -> None:
        raise SystemExit(3)


class BigFirstStep(_Base):
    """Its first step (the warm-up) holds `mib` MiB, every page written, and frees it; the later steps hold nothing."""

    def __init__(self, mib: int = 256) -> None:
        self.mib = mib
        self.steps = 0

    def step(self) -> None:
        self.steps += 1
        if self.steps == 1:
            held = torch.ones(self.mib * 2**20, dtype=torch.uint8)
            del held


class GrowingProducts(_Base):
    """Each step multiplies a matrix with more rows than the step before by one 512 x 7709 weight, as seq2seq's
    output projection does over batches padded each to its own length: MKL's memory manager keeps new buffers."""

    def __init__(self) -> None:
        self.steps = 0
        self.weight = torch.randn(512, 7709)

    def step(self) -> None:
        self.steps += 1
        out = torch.randn(40 + 8 * self.steps, 512) @ self.weight
        del out


class Projection(_Base):
    """A 512 -> 7709 linear layer (seq2seq's output projection) trained with SGD on one batch of random rows: three
    products a step (forward, the input's and the weight's gradients) that MKL runs with buffers it keeps."""

    def setup(self, ctx: SetupContext) -> None:
        self.net = torch.nn.Linear(512, 7709).to(ctx.device)
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.01)
        self.x = torch.randn(ctx.batch_size, 512, device=ctx.device, requires_grad=True)

    def step(self) -> torch.Tensor:
        self.optimizer.zero_grad()
        loss = self.net(self.x).square().mean()
        loss.backward()
        self.optimizer.step()
        return loss.detach()
