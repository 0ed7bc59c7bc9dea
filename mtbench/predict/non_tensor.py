"""Training memory outside tensors where no calibration gives it: the assumed CPU figures, cuBLAS's workspaces."""
from __future__ import annotations

import os
from typing import Optional, Tuple

import torch

# Training memory that is not tensors, where no calibration says otherwise. CPU: the libraries' pages a step
# touches, oneDNN primitives and scratch, glibc arenas (an assumed figure: the measured range is in
# docs/benchmarks.md "Figures behind design choices"). CUDA: cuBLAS's workspace, which goes through the caching
# allocator and so counts in max_memory_allocated and against a fraction cap (cuda_non_tensor_bytes).
DEFAULT_NON_TENSOR_BYTES_CPU = 256 << 20
DEFAULT_NON_TENSOR_NOTE_CPU = ("assumed 256 MiB (libraries' pages, oneDNN primitives, allocator arenas): not "
                               "calibrated for this device")
# Training memory is measured with glibc's mmap threshold fixed (memory.cpu_malloc=auto or live): freed tensors go
# back to the kernel and the arenas stay small, so what is not tensors is far less (15-58 MiB measured at the max
# batch of resnet50, vgg16, mobilenetv2 and densenet40 under target=nano; docs/benchmarks.md).
DEFAULT_NON_TENSOR_BYTES_CPU_LIVE = 48 << 20
DEFAULT_NON_TENSOR_NOTE_CPU_LIVE = ("assumed 48 MiB (libraries' pages and oneDNN scratch with glibc's mmap threshold "
                                    "fixed, as training memory is measured): not calibrated for this device")


def cublas_workspace_bytes(major: Optional[int], minor: Optional[int], config: Optional[str]) -> int:
    """The cuBLAS workspace torch allocates through its caching allocator for one stream (torch's
    CUDABlasHandlePool: CUBLAS_WORKSPACE_CONFIG as ':SIZE_KIB:COUNT' pairs, else 4096 KiB x 8 = 32 MiB on sm90
    and 4096 KiB x 2 + 16 KiB x 8 (~8 MiB) elsewhere)."""
    if config:
        pairs = [p for p in config.split(":") if p]
        try:
            numbers = [int(p) for p in pairs]
        except ValueError:
            numbers = []
        if numbers and len(numbers) % 2 == 0:
            return sum(numbers[i] * numbers[i + 1] for i in range(0, len(numbers), 2)) * 1024
    if (major, minor) == (9, 0):
        return 4096 * 8 * 1024
    return (4096 * 2 + 16 * 8) * 1024


# torch keeps one cuBLAS workspace per (handle, stream), and a handle per thread: a training step has two, the
# forward pass's (the job's thread) and the backward pass's (autograd's device thread)
CUBLAS_THREADS_IN_TRAINING = 2


def cuda_non_tensor_bytes(capability: Optional[Tuple[int, int]] = None) -> Tuple[int, str]:
    """The CUDA term without a calibration: cuBLAS's workspaces of a training step, sized for the target's GPU
    (`capability`; else this machine's, else a GPU other than sm90), and what it does not count (cuDNN's
    per-algorithm workspaces: calibrate to include them)."""
    where = "the target's GPU"
    if capability is None and torch.cuda.is_available():
        capability, where = torch.cuda.get_device_capability(), "this machine's GPU"
    major, minor = capability if capability is not None else (None, None)
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    each = cublas_workspace_bytes(major, minor, config)
    size = CUBLAS_THREADS_IN_TRAINING * each
    gpu = f"{where}, sm{major}{minor}" if major is not None else "a GPU other than sm90 (none visible here)"
    return size, (f"not calibrated: cuBLAS's workspaces {size / 2**20:.2f} MiB ({CUBLAS_THREADS_IN_TRAINING} x "
                  f"{each / 2**20:.2f} MiB: the forward thread's and autograd's backward thread's; {gpu}"
                  f"{', CUBLAS_WORKSPACE_CONFIG=' + config if config else ''}); cuDNN's workspaces are not counted "
                  "(calibrate to include them; the CUDA context is outside the target's budget, as its rule says)")
