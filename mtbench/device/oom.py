"""Whether an error (or an error's text, from a job's process) says the device ran out of memory."""
from __future__ import annotations

import re

import torch


# What out-of-memory looks like from each allocator: the CPU allocator ("DefaultCPUAllocator: can't allocate
# memory: you tried to allocate N bytes"), CUDA's caching allocator ("CUDA out of memory"), and cuBLAS / cuDNN
# workspaces.
OOM_MARKERS = (
    "out of memory",
    "can't allocate memory",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
)

# On Jetson (Tegra) torch builds before mid-2026 a failed cudaMalloc makes the caching allocator ask NVML which
# processes hold the GPU's memory (reportProcessMemoryInfo, for its out-of-memory message); NVML is absent or
# answers NOT_SUPPORTED there, and one of three TORCH_INTERNAL_ASSERTs fires instead of an OutOfMemoryError
# (pytorch issue 185240). Their texts, as torch prints them (the line number and path vary by release):
#   NVML_SUCCESS == r INTERNAL ASSERT FAILED at "../c10/cuda/CUDACachingAllocator.cpp":830, please report ...
#   NVML_SUCCESS == DriverAPI::get()->nvmlInit_v2_() INTERNAL ASSERT FAILED at "../c10/cuda/CUDACachingAllocator.cpp":1123, ...
#   NVML_SUCCESS == DriverAPI::get()->nvmlDeviceGetHandleByPciBusId_v2_( pci_id, &nvml_device) INTERNAL ASSERT
#   FAILED at "../c10/cuda/CUDACachingAllocator.cpp":815, ...
# Only in the caching allocator's file: the same asserts in other files (PeerToPeerAccess.cpp) are no OOM.
JETSON_NVML_ASSERT = re.compile(
    r"NVML_SUCCESS == (?:r|DriverAPI::get\(\)->(?:nvmlInit_v2_\(\)|nvmlDeviceGetHandleByPciBusId_v2_\([^)]*\)))"
    r" INTERNAL ASSERT FAILED at \"[^\"]*CUDACachingAllocator\.cpp\"")

# Said with a Jetson NVML assert that ended a job before its measured steps (docs/jetson.md, maxbatch)
CUDNN_WORKSPACE_NOTE = ("; a Jetson torch build's NVML assert after a failed cudaMalloc, not an OutOfMemoryError, so "
                        "cuDNN's fallback to an algorithm with a smaller workspace did not run: the cuDNN workspace "
                        "may be the cause (the job may fit with cudnn_benchmark=false)")


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and is_oom_text(str(exc))


def is_oom_text(text: str) -> bool:
    """An error's text says it ran out of memory (also for one that reached us only as text, from a child)."""
    return is_jetson_nvml_assert(text) or any(m in text.lower() for m in OOM_MARKERS)


def is_jetson_nvml_assert(text: str) -> bool:
    return JETSON_NVML_ASSERT.search(text) is not None


def oom_message(text: str, before_measured_steps: bool) -> str:
    """An OOM failure's message: the error's text, and where a Jetson NVML assert ended the job in its warm-up
    (before the measured steps), that cuDNN's workspace may be the cause."""
    if before_measured_steps and is_jetson_nvml_assert(text):
        return text + CUDNN_WORKSPACE_NOTE
    return text
