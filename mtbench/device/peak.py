"""Peak memory of the measured steps: the CUDA caching allocator on GPU, the process high-water mark on CPU."""
from __future__ import annotations

import ctypes
import gc
import os
import re
import resource
import sys
from typing import Any, Dict, Optional

import torch

_HWM = re.compile(rb"VmHWM:\s+(\d+)\s+kB")
_RSS = re.compile(rb"VmRSS:\s+(\d+)\s+kB")


def _status_bytes(field: "re.Pattern[bytes]") -> Optional[int]:
    """One kB field of /proc/self/status in bytes (None where the file or the field is missing)."""
    try:
        with open("/proc/self/status", "rb") as f:
            match = field.search(f.read())
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def _read_hwm_bytes() -> Optional[int]:
    return _status_bytes(_HWM)


def current_rss_bytes() -> Optional[int]:
    """The process's resident memory now (None where /proc/self/status is missing)."""
    return _status_bytes(_RSS)


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
CACHED_MMAP_BYTES = 32 * 2**20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: the ceiling of its own dynamic rule
LIVE_TRIM_BYTES = 128 * 1024  # glibc's own M_TRIM_THRESHOLD, set again by live (cached may have raised it before)
CACHED_TRIM_BYTES = 2**31 - 1  # mallopt takes a C int: the largest, so the heap's top is not given back


def glibc_malloc() -> Optional[ctypes.CDLL]:
    """glibc, where its malloc is this process's; None where another allocator was put in front of it (LD_PRELOAD
    of jemalloc or tcmalloc, common in CPU images: glibc's mallopt would answer 1 and change nothing) or no glibc."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        in_use = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value
        return libc if in_use == ctypes.cast(libc.malloc, ctypes.c_void_p).value else None
    except (OSError, AttributeError):
        return None


def _mallopt(settings: Dict[int, int]) -> Optional[str]:
    """Set glibc's malloc parameters in this process; None when set, else why not."""
    if not sys.platform.startswith("linux"):
        return f"not set: {sys.platform} has no glibc"
    try:
        libc = glibc_malloc()
        if libc is None:
            return "not set: this process's malloc is not glibc's (LD_PRELOAD?)"
        for param, value in settings.items():
            if not -2**31 <= value < 2**31:  # mallopt(int, int): ctypes would pass a larger value cut to its low bits
                return f"not set: {value} does not fit mallopt's int"
            if libc.mallopt(param, value) != 1:
                return f"not set: mallopt({param}, {value}) refused"
    except (OSError, AttributeError) as exc:
        return f"not set: no glibc mallopt ({exc})"
    return None


def _hold(setting: str, params: Dict[int, int], threshold: int, note: str) -> Dict[str, Any]:
    """mallopt(params) for memory.cpu_malloc=`setting`: what was set, for summary.json, or why nothing was."""
    why_not = _mallopt(params)
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
    return {**held, **huge_pages_for_tensors()} if held["mmap_threshold_bytes"] else held


THP_ENV = "THP_MEM_ALLOC_ENABLE"  # torch >= 2.2: madvise(MADV_HUGEPAGE) on each CPU tensor of 2 MiB or more
THP_MODE_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"  # "always [madvise] never"
HUGE_PROBE_BYTES = 4 * 2**20  # one tensor made to see whether the kernel backs it with a 2 MiB page
PR_SET_THP_DISABLE = 41  # prctl: no new transparent huge pages for this process (Linux >= 3.15), 0 lifts it
_huge_pages_asked = False  # whether live asked torch for huge pages in this process (it reads the variable once)
_env_set_here = False  # THP_ENV was set by this module, not by the user: taken out again once torch has read it
_huge_pages_seen: Optional[str] = None  # the note of the first check that saw one (torch's answer does not change)


def _thp_disabled(disable: bool) -> bool:
    """prctl(PR_SET_THP_DISABLE): True where the kernel took it."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, int(disable), 0, 0, 0) == 0
    except (OSError, AttributeError):  # no prctl (not Linux)
        return False


def _anon_huge_kib() -> Optional[int]:
    """This process's anonymous memory in transparent huge pages (kB), or None where the kernel does not say."""
    try:
        with open("/proc/self/smaps_rollup", "rb") as f:
            match = re.search(rb"AnonHugePages:\s+(\d+)\s+kB", f.read())
    except OSError:
        return None
    return int(match.group(1)) if match else None


def ask_torch_for_huge_pages() -> None:
    """Set THP_MEM_ALLOC_ENABLE (unless the user did) before this process's first CPU tensor, which is when torch
    reads it: a job that will run under `live` calls it first thing (huge_pages_for_tensors checks the outcome)."""
    global _env_set_here
    if THP_ENV not in os.environ:
        os.environ[THP_ENV] = "1"
        _env_set_here = True


def withdraw_huge_pages_request() -> None:
    """At the job's end: take out THP_MEM_ALLOC_ENABLE where this module set it and no check took it out (a job that
    failed between the request and its `live`), so that processes started later do not inherit it."""
    global _env_set_here
    if _env_set_here:
        os.environ.pop(THP_ENV, None)
        _env_set_here = False


def huge_pages_for_tensors() -> Dict[str, Any]:
    """Under `live` every large tensor is faulted in afresh each time it is made; in 2 MiB pages rather than 4 KiB
    ones that costs less (InceptionV1 32x32 batch 16 on this project's CPU VM: 3.60-4.17 samples/s against 3.07-3.29,
    the same resident peak; docs/memory.md). torch (2.2 and later) asks the kernel for huge pages for tensors of
    2 MiB or more when THP_MEM_ALLOC_ENABLE is set before its first CPU tensor in the process; a kernel whose
    transparent huge pages are `madvise` or `always` gives them. This sets it (unless the user did) and checks
    with one 4 MiB tensor whether the kernel backed it with a huge page. Returns {"huge_pages": True/False/None,
    "huge_pages_note": why} for summary.json."""
    try:
        with open(THP_MODE_FILE) as f:
            mode = re.search(r"\[(\w+)\]", f.read())
    except OSError:
        mode = None
    if mode is None:
        return {"huge_pages": None, "huge_pages_note": f"not known: {THP_MODE_FILE} is missing or unreadable"}
    if mode.group(1) == "never":
        return {"huge_pages": False,
                "huge_pages_note": f"the kernel's transparent huge pages are off ({THP_MODE_FILE}: never)"}
    global _huge_pages_asked, _huge_pages_seen, _env_set_here
    ask_torch_for_huge_pages()
    asked = os.environ[THP_ENV]
    _huge_pages_asked = asked != "0"  # torch reads it as a number
    lifted = _thp_disabled(False)  # cached may have turned them off
    if _huge_pages_seen is not None:
        # seen once: torch asks from then on. A second probe could be served from a block glibc's heap kept
        # resident under cached, and see nothing
        return {"huge_pages": lifted, "huge_pages_note": _huge_pages_seen if lifted else
                "prctl(PR_SET_THP_DISABLE, 0) was refused after cached turned them off"}
    before = _anon_huge_kib()
    probe = torch.empty(HUGE_PROBE_BYTES, dtype=torch.uint8)
    probe.fill_(1)
    after = _anon_huge_kib()
    del probe
    withdraw_huge_pages_request()  # torch has read it now: processes this one starts do not inherit it
    if before is None or after is None:
        return {"huge_pages": None, "huge_pages_note": "not known: /proc/self/smaps_rollup gives no AnonHugePages"}
    if after - before >= 2048:
        _huge_pages_seen = f"tensors of 2 MiB or more in 2 MiB pages (kernel: {mode.group(1)}, {THP_ENV}={asked})"
        return {"huge_pages": True, "huge_pages_note": _huge_pages_seen}
    return {"huge_pages": False, "huge_pages_note": (
        f"a {HUGE_PROBE_BYTES >> 20} MiB tensor got no huge page (kernel: {mode.group(1)}, {THP_ENV}={asked}): "
        f"this torch predates the variable (2.2), or it read it before it was set (a CPU tensor made earlier in "
        f"this process), or the kernel had no free 2 MiB page")}


def hold_malloc_cached() -> Dict[str, Any]:
    """Let glibc keep freed memory for the next tensors, as a GPU's caching allocator does (memory.cpu_malloc=cached):
    the mmap threshold at its dynamic rule's ceiling (32 MiB) from the start, and the heap's top never trimmed.

    With glibc's defaults a step's tensors that it served from fresh mappings, or from a heap top it trimmed, are
    faulted in page by page each time they are made again; which ones depends on the order of the step's frees, so
    plans of one model pay very differently: measured (MobileNetV2 32x32, batch 56, CPU) recomputation took 0.96 s
    a step with 320,000 page faults, 0.60 s and none with this setting (plain training 0.43 s either way). The
    resident peak then counts memory glibc keeps: do not hold such a job to a budget (the peak check overstates)."""
    held = _hold("cached", {M_MMAP_THRESHOLD: CACHED_MMAP_BYTES, M_TRIM_THRESHOLD: CACHED_TRIM_BYTES},
                 CACHED_MMAP_BYTES, "glibc keeps freed memory for reuse (mmap threshold 32 MiB, no trimming): no page "
                 "faults for tensors made again, and a resident peak above what the job holds")
    if _huge_pages_asked:
        # live asked torch for huge pages, and torch keeps asking; in glibc's heap they keep more resident and cost
        # time (InceptionV1 32x32 batch 16: 1428-1477 MiB and 5.5 samples/s against 1325-1329 and 6.0-6.3 without)
        off = _thp_disabled(True)
        held.update(huge_pages=False if off else None, huge_pages_note=(
            "turned off after live turned them on (prctl PR_SET_THP_DISABLE): in glibc's heap they keep more "
            "resident" if off else "live turned them on and prctl(PR_SET_THP_DISABLE) was refused"))
    return held


def resolved_cpu_malloc(mode: str, budgeted: bool) -> Optional[str]:
    """The setting memory.cpu_malloc=`mode` stands for: auto is live when held to a budget, else glibc's own (None)."""
    if mode == "auto":
        return "live" if budgeted else None
    return mode


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


class PeakMemory:
    """`reset()` just before the measured steps, `read()` after them."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._hwm_resettable = False
        self.baseline_bytes: Optional[int] = None

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
        else:
            self._hwm_resettable = _reset_hwm()
            self.baseline_bytes = _read_hwm_bytes() if self._hwm_resettable else None

    def read(self) -> Dict[str, Any]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return {
                "mem_peak_bytes": int(torch.cuda.max_memory_allocated(self.device)),
                "mem_peak_source": "cuda_allocator",
                "mem_peak_reserved_bytes": int(torch.cuda.max_memory_reserved(self.device)),
                "mem_baseline_bytes": self.baseline_bytes,
            }
        hwm = _read_hwm_bytes() if self._hwm_resettable else None
        if hwm is not None:
            return {"mem_peak_bytes": hwm, "mem_peak_source": "process_rss", "mem_baseline_bytes": self.baseline_bytes}
        # no resettable high-water mark: ru_maxrss (KiB on Linux) is the whole process's lifetime peak
        return {
            "mem_peak_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024,
            "mem_peak_source": "process_ru_maxrss",
            "mem_baseline_bytes": None,
        }
