"""glibc's malloc in this process: whether it is the process's malloc at all, and its mallopt (no torch)."""
from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import Dict, List, Optional


class _Mallinfo2(ctypes.Structure):
    """glibc's struct mallinfo2 (2.33+; struct mallinfo has the same fields as ints): the fields read here."""
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


class _Mallinfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int) for name, _ in _Mallinfo2._fields_]


MMAP_THRESHOLD_MAX = 32 * 2**20  # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: the largest its dynamic mmap threshold reaches
PROBE_BYTES = 64 * 2**20  # above glibc's largest mmap threshold (32 MiB): a mapping of its own, never touched


def _glibc_bytes_in_use(libc: ctypes.CDLL) -> int:
    """What glibc's arenas (all of them) and its own mappings hand out now, uordblks + hblkhd, modulo 2**32: the
    old int mallinfo (glibc < 2.33, JetPack 5's 2.31) wraps there, and a difference of two reads stays exact."""
    try:
        info = libc.mallinfo2
        info.restype = _Mallinfo2
    except AttributeError:
        info = libc.mallinfo
        info.restype = _Mallinfo
    got = info()
    return (got.uordblks + got.hblkhd) % 2**32


_PROBING = threading.Lock()  # one probe at a time: two threads' probes, interleaved, hide each other's block
_FOUND: List[ctypes.CDLL] = []  # glibc, once a probe found it the process's malloc (that does not change)


def _unlocked_in_child() -> None:
    global _PROBING
    _PROBING = threading.Lock()  # a thread that held it at the fork is not in the child


os.register_at_fork(after_in_child=_unlocked_in_child)


def glibc_malloc() -> Optional[ctypes.CDLL]:
    """glibc, where its malloc is this process's (`_probe_glibc_malloc` says how that is asked); one thread asks at
    a time, and the answer is kept once glibc is found."""
    with _PROBING:
        if not _FOUND:
            libc = _probe_glibc_malloc()
            if libc is None:  # asked again next time: a free in another thread can hide every probe's block
                return None
            _FOUND.append(libc)
        return _FOUND[0]


def _probe_glibc_malloc() -> Optional[ctypes.CDLL]:
    """glibc, where its malloc is this process's; None where another allocator was put in front of it (LD_PRELOAD
    of jemalloc or tcmalloc, common in CPU images: glibc's mallopt would answer 1 and change nothing) or no glibc.

    Asked of glibc itself: a block from the process's own malloc either shows in glibc's count of what it hands out
    or does not. Comparing the two functions' addresses is fooled by an executable that is not position-independent
    (Debian's /usr/bin/python3): there the process's `malloc` resolves to the executable's own PLT entry."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        process = ctypes.CDLL(None)
        malloc, free = process.malloc, process.free
    except (OSError, AttributeError):
        return None
    malloc.restype, malloc.argtypes, free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
    for _ in range(2):  # twice: another thread's free between the two reads can hide one probe's block
        try:
            before = _glibc_bytes_in_use(libc)
        except AttributeError:  # a libc.so.6 without mallinfo is not glibc
            return None
        block = malloc(PROBE_BYTES)
        if not block:
            return None
        try:
            grown = (_glibc_bytes_in_use(libc) - before) % 2**32
        finally:
            free(block)
        if grown >= PROBE_BYTES:
            return libc
    return None


def mallopt(settings: Dict[int, int]) -> Optional[str]:
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
