"""What MKL's memory manager holds: its own statistics, read where torch links MKL (x86 builds), else null and why."""
from __future__ import annotations

import ctypes
import os
from typing import Any, Dict, Optional

import torch

# MKL's service functions (mkl_service.h): mkl_mem_stat(&buffers) gives the bytes its memory manager holds, in use
# or kept for reuse; mkl_peak_mem_usage(mode) gathers the most it held. x86 torch wheels link MKL statically into
# libtorch_cpu and export these under the mkl_serv_ names; a torch linked to a shared MKL has the public names
PEAK_DISABLE, PEAK_ENABLE, PEAK_RESET, PEAK_READ = 0, 1, -1, 2
_NAMES = (("mkl_serv_mem_stat", "mkl_serv_peak_mem_usage", "mkl_serv_free_buffers"),
          ("MKL_Mem_Stat", "MKL_Peak_Mem_Usage", "MKL_Free_Buffers"))
# what a job's training memory holds of MKL's: its matrix products' packing buffers, which its memory manager keeps
# after each product for the next (MKL_DISABLE_FAST_MM=1 in the environment when the process starts: not kept)
WHAT = ("the most MKL's memory manager held over the steps the training memory was measured in (its matrix "
        "products' buffers, kept for reuse; part of mem_training_bytes)")


class MklMemory:
    """MKL's held bytes and their peak over a window: `start()` once (before the job's first matrix product, so
    that the peak counts every buffer; a buffer held before it is counted from mkl_mem_stat then), `reset()` at a
    window's start, `read()` at its end. On a torch without MKL, or one whose MKL does not export its statistics,
    every read is None with the reason in `why`."""

    def __init__(self, library: Optional[str] = None) -> None:
        self.why: Optional[str] = None
        self._stat: Any = None
        self._peak: Any = None
        self._free: Any = None
        self._base = 0  # what MKL held when its peak began to be gathered: its peak counts from there
        self.started = False
        if not torch.backends.mkl.is_available():
            self.why = f"torch {torch.__version__} is built without MKL (its products use another BLAS)"
            return
        handle = _loaded(library or os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        for stat, peak, free in _NAMES:
            if handle is not None and all(hasattr(handle, name) for name in (stat, peak, free)):
                self._stat, self._peak, self._free = getattr(handle, stat), getattr(handle, peak), getattr(handle, free)
                self._free.restype = None
                self._stat.restype, self._stat.argtypes = ctypes.c_int64, [ctypes.POINTER(ctypes.c_int)]
                self._peak.restype, self._peak.argtypes = ctypes.c_int64, [ctypes.c_int]
                return
        self.why = ("this torch's MKL does not export its memory statistics (mkl_mem_stat, mkl_peak_mem_usage)"
                    if handle is not None else "torch's libtorch_cpu is not loaded from its own folder")

    def held(self) -> Optional[int]:
        """The bytes MKL's memory manager holds now (None: not readable)."""
        if self._stat is None:
            return None
        buffers = ctypes.c_int(0)
        value = int(self._stat(ctypes.byref(buffers)))
        return value if value >= 0 else None

    def free_buffers(self) -> None:
        """Give back the buffers MKL's memory manager keeps and no product uses (mkl_free_buffers)."""
        if self._free is not None:
            self._free()

    def start(self) -> None:
        """Begin gathering MKL's peak (once per process: a later call keeps the first)."""
        if self._peak is None or self.started:
            return
        base = self.held()
        if base is None or int(self._peak(PEAK_ENABLE)) < 0:
            self.why = "MKL refused to gather its peak (mkl_peak_mem_usage)"
            return
        self._base, self.started = base, True

    def reset(self) -> None:
        """A window's start: its peak is what MKL holds now, then the most it holds until `read`."""
        if not self.started:
            self.start()
        if self.started:
            self._peak(PEAK_RESET)

    def read(self) -> Dict[str, Any]:
        """summary.json's `mem_mkl_bytes` (the window's peak) and `mem_mkl_note` (what it is, or why null)."""
        if not self.started:
            return {"mem_mkl_bytes": None, "mem_mkl_note": self.why or "MKL's peak was not gathered"}
        peak = int(self._peak(PEAK_READ))
        if peak == -1:  # its "not gathered" answer
            return {"mem_mkl_bytes": None, "mem_mkl_note": "MKL gave no peak (mkl_peak_mem_usage: -1)"}
        return {"mem_mkl_bytes": max(0, self._base + peak), "mem_mkl_note": WHAT}


def _loaded(path: str) -> Optional[ctypes.CDLL]:
    """The handle of a library this process has already loaded (RTLD_NOLOAD: nothing is opened that is not in
    memory already, so no file planted at `path` is loaded); None where it is not loaded."""
    try:
        return ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return None


_PROCESS: Optional[MklMemory] = None


def process() -> MklMemory:
    """This process's one MklMemory (MKL's statistics are the process's)."""
    global _PROCESS
    if _PROCESS is None:
        _PROCESS = MklMemory()
    return _PROCESS
