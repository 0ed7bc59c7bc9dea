"""Peak memory of the measured steps: the CUDA caching allocator on GPU, the process high-water mark on CPU."""
from __future__ import annotations

import ctypes
import gc
import os
import re
import resource
import sys
from typing import Any, Callable, Dict, Optional

import torch

from mtbench.device import hugepages, mkl_memory
from mtbench.device.arena import in_own_arena
from mtbench.device.glibc import MMAP_THRESHOLD_MAX, mallopt
from mtbench.regular_files import read_head

_HWM = re.compile(rb"VmHWM:\s+(\d+)\s+kB")
_RSS = re.compile(rb"VmRSS:\s+(\d+)\s+kB")
_RSS_FILE = re.compile(rb"RssFile:\s+(\d+)\s+kB")  # Linux >= 4.5
_RSS_ANON = re.compile(rb"RssAnon:\s+(\d+)\s+kB")
_RSS_SHMEM = re.compile(rb"RssShmem:\s+(\d+)\s+kB")


def _status_bytes(field: "re.Pattern[bytes]") -> Optional[int]:
    """One kB field of /proc/self/status in bytes (None where the file or the field is missing)."""
    try:
        with open("/proc/self/status", "rb") as f:
            match = field.search(f.read())
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def hwm_bytes() -> Optional[int]:
    """The process's resident high-water mark, VmHWM (None where /proc/self/status is missing)."""
    return _status_bytes(_HWM)


def current_rss_bytes() -> Optional[int]:
    """The process's resident memory now (None where /proc/self/status is missing)."""
    return _status_bytes(_RSS)


def file_rss_bytes() -> Optional[int]:
    """The file-backed pages resident in the process now (the libraries' code and data it mapped), RssFile."""
    return _status_bytes(_RSS_FILE)


def anon_rss_bytes() -> Optional[int]:
    """What the process owns in memory now: RssAnon + RssShmem (None where the kernel gives neither, < 4.5)."""
    anon, shmem = _status_bytes(_RSS_ANON), _status_bytes(_RSS_SHMEM)
    return None if anon is None else anon + (shmem or 0)


def budget_runtime_bytes() -> Optional[int]:
    """What the process holds before the model is built, in the measure a CPU budget compares (device/budget.py):
    its own memory (RssAnon + RssShmem) where the kernel says, else its resident size."""
    anon = anon_rss_bytes()
    return anon if anon is not None else current_rss_bytes()


def _reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); ru_maxrss cannot be reset."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def release_memory(device: torch.device) -> None:
    """Give back what the previous job held, so that the next job's peak is its own."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    if sys.platform.startswith("linux"):
        # glibc keeps freed heap pages mapped (so RSS stays up) until trimmed
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's own initial threshold, here kept fixed (memory.cpu_malloc=live)
CACHED_MMAP_BYTES = MMAP_THRESHOLD_MAX  # the ceiling of glibc's own dynamic rule
LIVE_TRIM_BYTES = 128 * 1024  # glibc's own M_TRIM_THRESHOLD, set again by live (cached may have raised it before)
CACHED_TRIM_BYTES = 2**31 - 1  # mallopt takes a C int: the largest, so the heap's top is not given back


def _hold(setting: str, params: Dict[int, int], threshold: int, note: str) -> Dict[str, Any]:
    """mallopt(params) for memory.cpu_malloc=`setting`: what was set, for summary.json, or why nothing was."""
    why_not = mallopt(params)
    if why_not is not None:
        return {"setting": setting, "mmap_threshold_bytes": None, "note": why_not}
    return {"setting": setting, "mmap_threshold_bytes": threshold, "note": note}


def hold_malloc_to_live_memory() -> Dict[str, Any]:
    """Make the process's resident memory follow the memory it holds: glibc's mmap threshold fixed at 128 KiB
    (memory.cpu_malloc=live; `auto` for a CPU job held to a budget).

    glibc serves an allocation above the threshold with a mapping of its own, returned to the kernel when freed;
    below it, from its heaps, which keep freed memory resident for reuse. The threshold is dynamic by default: every
    freed mapping raises it to that size (up to 32 MiB), so after a training step's first tensors are freed, tensors
    of up to 32 MiB come from the heaps, whose high-water mark then holds every hole the step's frees leave in it.
    (The resident peak with and without it: docs/benchmarks.md "Figures behind design choices".) `mallopt` fixes it (and turns the
    dynamic adjustment off) for the rest of the process; large tensors then cost a page fault per page every
    time they are made. Returns what was set, for summary.json, or why nothing was (not glibc)."""
    held = _hold("live", {M_MMAP_THRESHOLD: MMAP_THRESHOLD_BYTES, M_TRIM_THRESHOLD: LIVE_TRIM_BYTES},
                 MMAP_THRESHOLD_BYTES,
                 "glibc's mmap threshold fixed (mallopt): freed tensors above it go back to the kernel, so the "
                 "resident peak counts what the job holds, not what glibc keeps for reuse")
    return {**held, **hugepages.for_live()} if held["mmap_threshold_bytes"] else held


def hold_malloc_cached() -> Dict[str, Any]:
    """Let glibc keep freed memory for the next tensors, as a GPU's caching allocator does (memory.cpu_malloc=cached):
    the mmap threshold at its dynamic rule's ceiling (32 MiB) from the start, and the heap's top never trimmed.

    With glibc's defaults a step's tensors that it served from fresh mappings, or from a heap top it trimmed, are
    faulted in page by page each time they are made again; which ones depends on the order of the step's frees, so
    plans of one model pay very differently: measured (MobileNetV2 32x32, batch 56, CPU) recomputation took 0.96 s
    a step with 320,000 page faults, 0.60 s and none with this setting (plain training 0.43 s either way). A block
    above the threshold's ceiling is still mapped fresh and faulted in each time it is made (AlexNet's 151 MB
    gradient of its first linear layer: docs/benchmarks.md). The resident peak then counts memory glibc keeps: do
    not hold such a job to a budget (the peak check overstates)."""
    held = _hold("cached", {M_MMAP_THRESHOLD: CACHED_MMAP_BYTES, M_TRIM_THRESHOLD: CACHED_TRIM_BYTES},
                 CACHED_MMAP_BYTES, "glibc keeps freed memory for reuse (mmap threshold 32 MiB, no trimming): no page "
                 "faults for tensors made again, and a resident peak above what the job holds")
    return {**held, **hugepages.for_cached()} if held["mmap_threshold_bytes"] else held


def resolved_cpu_malloc(mode: str, budgeted: bool) -> Optional[str]:
    """The setting memory.cpu_malloc=`mode` stands for: auto is live when held to a budget, else glibc's own (None)."""
    if mode == "auto":
        return "live" if budgeted else None
    return mode


def measured_cpu_malloc(mode: str) -> str:
    """The malloc setting a CPU job's training memory is measured under: auto is live (a job held to a budget runs
    every step so; one without measures two more steps so, measure_training_step), else memory.cpu_malloc itself."""
    return "live" if mode == "auto" else mode


def set_cpu_malloc(mode: str, budgeted: bool) -> Optional[Dict[str, Any]]:
    """memory.cpu_malloc for a CPU job: auto (live when held to a budget, else glibc's own), glibc, live, cached.
    Returns what was set (summary.json `cpu_malloc`), None for glibc's own settings under auto."""
    resolved = resolved_cpu_malloc(mode, budgeted)
    if resolved is None:
        return None
    mode = resolved
    if mode == "live":
        return hold_malloc_to_live_memory()
    if mode == "cached":
        return hold_malloc_cached()
    return {"setting": "glibc", "mmap_threshold_bytes": None, "note": "glibc's own settings (memory.cpu_malloc=glibc)"}


# nvmap's per-process accounting of the buffers it maps for the GPU (Jetson, debugfs: root): "CLIENT PROCESS PID
# SIZE" lines, one per client (a process may hold several), "<name> <comm> <pid> <K>K", then a total and a note
NVMAP_CLIENTS = "/sys/kernel/debug/nvmap/iovmm/clients"


def nvmap_bytes(pid: int, path: str = NVMAP_CLIENTS) -> Optional[int]:
    """What nvmap holds for `pid`'s GPU buffers (its allocator's segments, the CUDA context, cuDNN's and cuBLAS's
    workspaces) on a Jetson; None where the file is not readable (not root, no debugfs, not a Jetson)."""
    try:
        text = read_head(path, 1 << 20).decode("utf-8", "replace")
    except OSError:
        return None
    total = 0
    for line in text.splitlines()[1:]:
        words = line.split()
        if len(words) >= 4 and words[-2].isdigit() and int(words[-2]) == pid and words[-1].endswith("K") \
                and words[-1][:-1].isdigit():
            total += int(words[-1][:-1]) * 1024
    return total


def integrated(device: torch.device) -> bool:
    """A CUDA device that shares the host's DRAM (a Jetson): its allocator's memory is the board's."""
    return device.type == "cuda" and bool(getattr(torch.cuda.get_device_properties(device), "is_integrated", False))


class PeakMemory:
    """`reset()` just before the measured steps, `read()` after them. On an integrated GPU (a Jetson) the board's
    memory is read too: the host's training memory plus what the CUDA allocator reserved, both in one DRAM."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._hwm_resettable = False
        self.baseline_bytes: Optional[int] = None
        self.integrated = integrated(device)
        self.mkl = mkl_memory.process()
        if device.type == "cpu":
            self.mkl.start()

    def reset(self, trim: bool = False) -> None:
        """trim (a CPU job held to a budget under `live`): first give back the heap earlier steps left (warm-up,
        auto's probes of other plans), as each probe step does, so that the measured peak is the steps' own and
        a plan that fitted its probe is measured as it was probed."""
        if trim:
            release_memory(self.device)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline_bytes = torch.cuda.memory_allocated(self.device)
            self._hwm_resettable = self.integrated and _reset_hwm()  # the host's half of the board's memory
        else:
            self._hwm_resettable = _reset_hwm()
            self.baseline_bytes = hwm_bytes() if self._hwm_resettable else None
            self.mkl.reset()

    def read(self) -> Dict[str, Any]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            out = {
                "mem_peak_bytes": int(torch.cuda.max_memory_allocated(self.device)),
                "mem_peak_source": "cuda_allocator",
                "mem_peak_reserved_bytes": int(torch.cuda.max_memory_reserved(self.device)),
                "mem_baseline_bytes": self.baseline_bytes,
            }
            return {**out, **self._board(out["mem_peak_reserved_bytes"])} if self.integrated else out
        hwm = hwm_bytes()
        if hwm is not None and self._hwm_resettable:
            return {"mem_peak_bytes": hwm, "mem_peak_source": "process_rss", "mem_baseline_bytes": self.baseline_bytes,
                    **training_peak(hwm), **self.mkl.read()}
        # VmHWM that cannot be reset: the process's lifetime peak, warm-up included. A job forked from a sweep
        # (isolation) starts with its parent's resident size, as ru_maxrss does; a program started by exec starts
        # at its own, where ru_maxrss keeps the parent's (Linux carries it across exec)
        if hwm is not None:
            return {"mem_peak_bytes": hwm, "mem_peak_source": "process_hwm_lifetime", "mem_baseline_bytes": None}
        # no /proc (not Linux): ru_maxrss, the lifetime peak, which Linux would carry across exec from the parent
        return {"mem_peak_bytes": ru_maxrss_bytes(), "mem_peak_source": "process_ru_maxrss", "mem_baseline_bytes": None}


    def _board(self, reserved: int) -> Dict[str, Any]:
        """The board's memory of an integrated GPU's job: the host's training peak (VmHWM less the file-backed
        pages) plus the allocator's reserved peak (an upper bound: the two peaks need not coincide); nvmap's
        figure for this process beside it where readable (it also counts the CUDA context and the libraries'
        workspaces, which a target's budget rule leaves to the runtime)."""
        hwm = hwm_bytes() if self._hwm_resettable else None
        host = training_peak(hwm) if hwm is not None else {}
        out: Dict[str, Any] = {**host, "mem_nvmap_bytes": nvmap_bytes(os.getpid())}
        if host.get("mem_training_peak_bytes") is None:
            return {**out, "mem_board_bytes": None,
                    "mem_board_source": "not known: the host's high-water mark could not be reset or read"}
        return {**out, "mem_board_bytes": host["mem_training_peak_bytes"] + reserved,
                "mem_board_source": "host training memory (VmHWM less file-backed pages) + CUDA allocator reserved "
                                    "peak"}


def measure_training_step(device: torch.device, step: Callable[[], Any], then_glibc: bool = False) -> Dict[str, Any]:
    """Training memory of a CPU job whose measured steps ran under glibc's own malloc (memory.cpu_malloc=auto
    without a budget): two more steps, untimed, with the mmap threshold fixed as under `live`, in a thread of its
    own (an arena of its own); the heap is given back (malloc_trim) and the high-water mark reset between them, and
    the second is measured. Returns PeakMemory.read's training figures (mem_training_peak_bytes, mem_file_bytes)
    and `mem_training_step`, how they were measured; empty on a GPU, where the high-water mark cannot be reset
    or where the malloc is not glibc's (nothing set).

    Under glibc's dynamic threshold the resident peak also holds the holes a step's frees leave in the heap, and
    which holes differs from run to run; glibc serves even a large tensor from such a hole before it maps fresh
    memory, so the main heap, trimmed, would fault them in again. In a fresh arena every tensor above the
    threshold is a mapping of its own, given back when freed: the peak follows what the step holds, as in a job
    held to a budget under `live`; the first step settles the thread's arena and its OpenMP team. The measured
    steps keep glibc's own settings, so their time is a default training loop's. then_glibc (profile=true, whose
    profiled steps follow): afterwards the settings glibc's own rule reaches once a step freed a 32 MiB tensor
    (mmap threshold 32 MiB, trim threshold twice it); its dynamic rule cannot be turned on again."""
    if device.type != "cpu":
        return {}
    live = hold_malloc_to_live_memory()
    if live.get("mmap_threshold_bytes") is None or not _reset_hwm():
        return {}

    mkl = mkl_memory.process()

    def two_steps() -> Dict[str, Any]:
        step()
        release_memory(device)
        _reset_hwm()
        mkl.reset()
        step()
        return {}

    _, main_heap = in_own_arena(two_steps)
    if then_glibc:
        mallopt({M_MMAP_THRESHOLD: CACHED_MMAP_BYTES, M_TRIM_THRESHOLD: 2 * CACHED_MMAP_BYTES})
    hwm = hwm_bytes()
    figures = training_peak(hwm) if hwm is not None else {}
    if not figures:
        return {}
    where = ("the main heap (glibc's arena limit was reached): holes the measured steps left can count"
             if main_heap else "an arena of its own")
    return {**figures, **mkl.read(), "mem_training_step": (
        f"the second of two untimed steps after the measured ones, in {where}, glibc's mmap threshold fixed at "
        f"{live['mmap_threshold_bytes']} bytes as under memory.cpu_malloc=live (the measured steps ran under "
        "glibc's own settings)")}


def training_peak(hwm: int) -> Dict[str, Any]:
    """The steps' training memory from the kernel's high-water mark: VmHWM less the file-backed pages resident at
    its read (RssFile: the libraries' pages, whose number follows the page cache, not training; they are mapped by
    the warm-up and stay as many through the measured steps), i.e. the peak of what the process owns (anonymous
    and shmem). Empty where the kernel gives no RssFile."""
    file_bytes = file_rss_bytes()
    if file_bytes is None:
        return {}
    return {"mem_training_peak_bytes": max(0, hwm - file_bytes), "mem_file_bytes": file_bytes}


def ru_maxrss_bytes() -> int:
    """getrusage's ru_maxrss in bytes: KiB on Linux, bytes on macOS."""
    scale = 1 if sys.platform == "darwin" else 1024
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale
