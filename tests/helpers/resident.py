"""In a child process: a workload's step against its resident high-water mark, as training memory is measured
(glibc's mmap and trim thresholds fixed at 128 KiB, no transparent huge pages), beside the trace of the same step."""
from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any, Callable, Tuple


def hold_malloc() -> Any:
    """This process's libc with transparent huge pages off (with them a touched page makes 2 MiB resident) and
    glibc's mmap and trim thresholds fixed at 128 KiB; call it before torch allocates."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    assert libc.prctl(41, 1, 0, 0, 0) == 0  # PR_SET_THP_DISABLE
    assert libc.mallopt(-3, 128 * 1024) == 1 and libc.mallopt(-1, 128 * 1024) == 1  # mmap and trim thresholds
    return libc


def status(key: str) -> int:
    """A figure of /proc/self/status in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def step_against_trace(libc: Any, make: Callable[[], Any], batch: int) -> Tuple[int, int]:
    """(what the third step of `make()`'s workload raises VmHWM by over its start, the heap trimmed and the mark
    reset after two steps; the trace's tensor peak of the step beyond what is held between steps)."""
    import torch

    from mtbench.predict.trace import trace_step
    from mtbench.workload.base import SetupContext

    ctx = SetupContext(device=torch.device("cpu"), batch_size=batch, data=None, seed=0, batches=1)
    w = make()
    w.setup(ctx)
    w.step()
    w.step()
    libc.malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status("VmRSS")
    w.step()
    grown = status("VmHWM") - before
    trace = trace_step(make, ctx, fresh_mapping_bytes=128 << 10)
    held = sum(trace.breakdown_bytes[k] for k in ("parameters", "gradients", "optimizer_state", "inputs"))
    return grown, trace.peak_tensor_bytes - held
