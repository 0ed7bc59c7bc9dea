"""A function run in a thread of its own, so that glibc serves its allocations from an arena of their own."""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from mtbench.device import glibc

NON_MAIN_ARENA = 0x4  # glibc's chunk header: the bit of the size word that says the chunk is not the main heap's


def on_main_heap() -> Optional[bool]:
    """Whether glibc serves this thread from its main heap (the main thread; any thread once the arena limit,
    M_ARENA_MAX or 8 per core, is reached): the size word before a fresh block holds the chunk's NON_MAIN_ARENA bit.
    None where that cannot be read (not glibc's malloc)."""
    libc = glibc.glibc_malloc()
    if libc is None:
        return None
    malloc, free = libc.malloc, libc.free
    malloc.restype, malloc.argtypes, free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
    block = malloc(4096)  # above the per-thread cache's largest (1032 bytes): a chunk of the thread's arena
    if not block:
        return None
    try:
        return not ctypes.c_size_t.from_address(block - ctypes.sizeof(ctypes.c_size_t)).value & NON_MAIN_ARENA
    finally:
        free(block)


def in_own_arena(fn: Callable[[], Dict[str, Any]]) -> Tuple[Dict[str, Any], Optional[bool]]:
    """fn() in a thread of its own, so that glibc serves its allocations from an arena of their own (each new
    thread gets one until the arena limit): what `cached` leaves in a heap stays out of the main thread's.
    Returns fn's result and whether that thread got the main heap after all (`on_main_heap`).

    Run in the main thread, a rejected `cached` probe left its tensors' freed blocks in the main heap, and under
    `live` glibc serves tensors above the mmap threshold from those blocks before it maps fresh ones; freed, they
    stay resident until the next trim. InceptionV1 32x32 batch 48, recompute/auto@75%: the steps after such a probe
    peaked at 866-1042 MiB over five steps of two processes (no probe: 862, every step of every process); after the
    probe in its own thread, 864 in every step. An interrupt (SIGINT, SIGTERM's handler) while fn runs is raised
    once fn has returned: a thread still in torch's kernels when the interpreter exits aborts the process."""
    done: Dict[str, Any] = {}
    finished = threading.Event()
    threads = torch.get_num_threads()  # torch sets it in a new thread when first asked; set here for older torch

    def run() -> None:
        try:
            torch.set_num_threads(threads)
            done["main_heap"] = on_main_heap()
            done["result"] = fn()
        except BaseException as exc:  # noqa: B902 - raised again in the calling thread
            done["error"] = exc
        finally:
            finished.set()

    thread = threading.Thread(target=run, name="mtbench-own-arena", daemon=True)
    thread.start()
    interrupted: Optional[BaseException] = None
    # an Event, not join(): on Python 3.11 a join() that an interrupt breaks marks the running thread as ended
    while not finished.is_set():
        try:
            finished.wait()
        except BaseException as exc:  # noqa: B902 - the probe's step ends first, then this is raised
            interrupted = interrupted or exc
    try:
        thread.join()  # fn has returned: the thread's last lines, so that nothing of it runs once this returns
    except BaseException as exc:  # noqa: B902 - as above
        interrupted = interrupted or exc
    if interrupted is not None:
        raise interrupted
    if "error" in done:
        raise done.pop("error")  # pop: no cycle through this frame keeps the probe's tensors alive
    return done.pop("result"), done.get("main_heap")
