"""Transparent huge pages for CPU tensors under memory.cpu_malloc=live: asked of torch, checked with the kernel."""
from __future__ import annotations

import ctypes
import os
import re
from typing import Any, Dict, List, Optional, Tuple

import torch

# torch >= 2.2 (c10 alloc_cpu): madvise(MADV_HUGEPAGE) on each CPU tensor of 2 MiB or more where this is "1", read once
# per process at its first CPU tensor (a process forked after that keeps the answer; one exec'd reads it again)
THP_ENV = "THP_MEM_ALLOC_ENABLE"
THP_DIR = "/sys/kernel/mm/transparent_hugepage"  # enabled: "always [madvise] never"; defrag; hpage_pmd_size
TORCH_MIN_BYTES = 2 * 2**20  # torch advises tensors from this size
PR_SET_THP_DISABLE, PR_GET_THP_DISABLE = 41, 42  # prctl (Linux >= 3.15): no new huge pages; inherited over fork/exec


class _State:
    env_set_here = False  # THP_ENV was set here, not by the user: taken out once torch has read it
    result: Optional[Dict[str, Any]] = None  # the first check's (torch's answer does not change in a process)
    torch_asks = False  # the check saw torch's advice work (kernel `madvise`): cached must turn it off
    off_here = False  # cached turned THP off for this process (live turns it on again, its ranges unadvised first)


def thp_setting(name: str) -> Optional[str]:
    """One file of THP_DIR: the bracketed choice ("madvise" of "always [madvise] never") or its text; None if unread."""
    try:
        with open(os.path.join(THP_DIR, name)) as f:
            text = f.read().strip()
    except OSError:
        return None
    found = re.search(r"\[(\S+)\]", text)
    return found.group(1) if found else text


def _prctl(option: int, value: int = 0) -> Optional[int]:
    try:
        answer = ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl (not Linux)
        return None
    return None if answer < 0 else int(answer)


def _anon_huge_kib() -> Optional[int]:
    """This process's anonymous memory in transparent huge pages (kB), or None where the kernel does not say."""
    try:
        with open("/proc/self/smaps_rollup", "rb") as f:
            match = re.search(rb"AnonHugePages:\s+(\d+)\s+kB", f.read())
    except OSError:
        return None
    return int(match.group(1)) if match else None


MADV_NOHUGEPAGE = 15


def _unadvise_all() -> Optional[Tuple[int, List[str]]]:
    """madvise(MADV_NOHUGEPAGE) on every mapping of this process advised for huge pages (VmFlags "hg" in
    /proc/self/smaps): (how many, the names of those the kernel refused), None where smaps cannot be read. A second
    pass reads smaps again: the heap's end moves while the first is read (ENOMEM for a range no longer mapped)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    done, refused = 0, []
    for _ in range(2):
        try:
            with open("/proc/self/smaps") as f:
                text = f.read()
        except OSError:
            return None
        refused, start, end, name = [], 0, 0, ""
        for line in text.splitlines():
            head = re.match(r"([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+\s*(.*)", line)
            if head:
                start, end, name = int(head.group(1), 16), int(head.group(2), 16), head.group(3) or "anonymous"
            elif line.startswith("VmFlags:") and " hg" in line:
                if libc.madvise(start, end - start, MADV_NOHUGEPAGE) == 0:
                    done += 1
                else:
                    refused.append(f"{name} ({os.strerror(ctypes.get_errno())})")
        if not refused:
            break
    return done, refused


def ask_torch() -> None:
    """Set THP_ENV=1 (unless the user set it, or a check already ran) before this process's first CPU tensor, which
    is when torch reads it: a job that will run under `live` calls it first thing."""
    if THP_ENV not in os.environ and _State.result is None:
        os.environ[THP_ENV] = "1"
        _State.env_set_here = True


def withdraw() -> None:
    """Take THP_ENV out where it was set here: once torch has read it, or at the job's end (a job that failed
    before its `live`), so that programs started later (exec'd) do not read it."""
    if _State.env_set_here:
        os.environ.pop(THP_ENV, None)
        _State.env_set_here = False


def for_live() -> Dict[str, Any]:
    """Under `live` every tensor above glibc's mmap threshold is faulted in afresh each time it is made; where the
    kernel gives a 2 MiB page per fault, that costs less (InceptionV1 32x32, recompute at 48 under an 837 MiB budget:
    3.23-3.67 samples/s against 2.43-2.68, the same resident peak; docs/memory.md). Asks torch (THP_ENV) and checks
    with one tensor of two huge pages whether the kernel backed a whole aligned block of it with one (torch aligns a
    tensor to 4 KiB only, so only its whole aligned 2 MiB blocks can be huge). {"huge_pages": True/False/None,
    "huge_pages_note": why} for summary.json."""
    if _State.off_here:
        # torch advised huge pages for ranges of glibc's heaps under cached; once THP is on again khugepaged could fill
        # a sparsely used one with a whole 2 MiB page: every range advised so far is unadvised first
        unadvised = _unadvise_all()
        if unadvised is None or _prctl(PR_SET_THP_DISABLE, 0) != 0:
            return {"huge_pages": False, "huge_pages_note": "left off since cached ran: /proc/self/smaps could not "
                                                            "be read, or prctl was refused"}
        _State.off_here = False
        if _State.result is not None:
            done, refused = unadvised
            return dict(_State.result, huge_pages_note=_State.result["huge_pages_note"] + (
                f"; on again after cached, its {done} advised ranges unadvised (MADV_NOHUGEPAGE)" +
                (f", {len(refused)} refused: {', '.join(refused[:3])}" if refused else "")))
    if _State.result is not None:
        return dict(_State.result)
    mode, defrag, pmd = thp_setting("enabled"), thp_setting("defrag"), thp_setting("hpage_pmd_size")
    result = _check(mode, defrag, int(pmd) if pmd and pmd.isdigit() else None)
    withdraw()  # torch has read it now (or never will in this process)
    _State.result = result
    return dict(result)


def _check(mode: Optional[str], defrag: Optional[str], pmd: Optional[int]) -> Dict[str, Any]:
    if mode is None:
        return {"huge_pages": None, "huge_pages_note": f"not known: {THP_DIR}/enabled is missing or unreadable"}
    if mode == "never":
        return {"huge_pages": False, "huge_pages_note": f"the kernel's transparent huge pages are off ({mode})"}
    if pmd != TORCH_MIN_BYTES:
        return {"huge_pages": None, "huge_pages_note": f"not probed: this kernel's huge page is {pmd} bytes, torch "
                                                       f"advises from {TORCH_MIN_BYTES}"}
    if _prctl(PR_GET_THP_DISABLE) == 1:  # set by what started the job (systemd, a wrapper): left so
        return {"huge_pages": False, "huge_pages_note": "off for this process (PR_SET_THP_DISABLE, set before the "
                                                        "job started): left so"}
    ask_torch()
    asked = os.environ.get(THP_ENV, "unset")
    before = _anon_huge_kib()
    probe = torch.empty(2 * pmd, dtype=torch.uint8)
    probe.fill_(1)
    after = _anon_huge_kib()
    del probe
    if before is None or after is None:
        return {"huge_pages": None, "huge_pages_note": "not known: /proc/self/smaps_rollup gives no AnonHugePages"}
    how = f"(kernel: {mode}, defrag: {defrag}, {THP_ENV}={asked})"
    if after - before >= pmd // 1024:
        _State.torch_asks = mode == "madvise"  # under `always` the kernel gives them unasked
        return {"huge_pages": True, "huge_pages_note": f"the whole aligned 2 MiB blocks of tensors in huge pages {how}"}
    return {"huge_pages": False, "huge_pages_note": (
        f"a {2 * pmd >> 20} MiB tensor got no huge page {how}: this torch predates the variable (2.2), or read it "
        f"before it was set (a CPU tensor made earlier in this process or its parent), or the kernel had no free "
        f"2 MiB page")}


def for_cached() -> Dict[str, Any]:
    """Under `cached` huge pages in glibc's heap keep more resident and cost time (InceptionV1 32x32 batch 16:
    1428-1477 MiB and 5.5 samples/s against 1325-1329 and 6.0-6.3 without): where torch advises them because `live`
    asked, THP is turned off for the process until `live` again (pages already huge stay so; processes it forks or
    execs meanwhile inherit it). Returns what to add to summary.json's cpu_malloc ({} where nothing was done)."""
    if not _State.torch_asks:
        return {}
    if not _State.off_here and _prctl(PR_SET_THP_DISABLE, 1) != 0:
        return {"huge_pages": None, "huge_pages_note": "live turned them on and prctl(PR_SET_THP_DISABLE) was refused"}
    _State.off_here = True
    return {"huge_pages": False, "huge_pages_note": "turned off for the process while cached holds (prctl "
                                                    "PR_SET_THP_DISABLE): in glibc's heap they keep more resident"}
