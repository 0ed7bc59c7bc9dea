"""Whether an error (or an error's text, from a job's process) says the device ran out of memory."""
from __future__ import annotations

import torch


# What out-of-memory looks like from each allocator: the CPU allocator ("DefaultCPUAllocator: can't allocate
# memory: you tried to allocate N bytes"), CUDA's caching allocator ("CUDA out of memory"), a Jetson torch build
# whose failed cudaMalloc trips an NVML assert in the caching allocator, and cuBLAS / cuDNN workspaces.
OOM_MARKERS = (
    "out of memory",
    "can't allocate memory",
    "nvml_success == r internal assert failed",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
)


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and is_oom_text(str(exc))


def is_oom_text(text: str) -> bool:
    """An error's text says it ran out of memory (also for one that reached us only as text, from a child)."""
    return any(m in text.lower() for m in OOM_MARKERS)


