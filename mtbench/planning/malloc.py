"""memory.cpu_malloc=auto for a CPU job that plans under a budget: `cached` where the budget has room for its heap."""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from mtbench.device import glibc, peak
from mtbench.planning import choose as plan_select
from mtbench.workload.plans import MemoryPlan

# The share of the budget left free above the probed peak under `cached`: glibc's heap can still grow a little in the
# steps after the probe's two (a free block of the right size is not always where the next tensor needs it).
HEAP_MARGIN = 0.05
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

    threading.Thread(target=run, name="mtbench-cached-probe", daemon=True).start()
    interrupted: Optional[BaseException] = None
    while not finished.is_set():
        try:
            finished.wait()
        except BaseException as exc:  # noqa: B902 - the probe's step ends first, then this is raised
            interrupted = interrupted or exc
    if interrupted is not None:
        raise interrupted
    if "error" in done:
        raise done.pop("error")  # pop: no cycle through this frame keeps the probe's tensors alive
    return done.pop("result"), done.get("main_heap")


def _fits(probe: Dict[str, Any], room: int) -> bool:
    return not probe["oom"] and probe["peak_bytes"] is not None and probe["peak_bytes"] <= room


def choose_cpu_malloc(workload: Any, plan: MemoryPlan, device: torch.device, runtime_bytes: Optional[int],
                      is_oom: Callable[[BaseException], bool], budget_bytes: int,
                      live_peak_bytes: Optional[int] = None) -> Dict[str, Any]:
    """After the plan was chosen under `live` (the resident peak follows what the job holds): how much glibc keeps
    under `cached` (freed memory kept for the next tensors, no trimming, so no page faults: the throughput of a
    GPU's caching allocator) is measured, not guessed: the chosen plan's probe, two steps under `cached`, the higher
    resident peak (less the runtime) counts. Within the budget less HEAP_MARGIN: `cached` stays; else `live` again
    and what glibc kept is given back. Returns summary.json's `cpu_malloc`, with `chosen_because`.

    The probe runs first in a thread of its own (`in_own_arena`): where it does not fit, the main heap is as `live`
    left it. Where it fits, the two steps run again in the main thread, where the job's steps will run, and that
    peak decides (a thread's heaps are at most 64 MiB each and keep other blocks than the main heap: the first
    probe can be higher or lower). No probe runs where the plan's peak under `live` (`live_peak_bytes`) is already
    over the room: `cached` keeps at least as much."""
    room = int(budget_bytes * (1 - HEAP_MARGIN))
    room_is = f"{room} bytes (the budget less {HEAP_MARGIN:.0%})"
    if live_peak_bytes is not None and live_peak_bytes > room:
        live = peak.set_cpu_malloc("live", budgeted=True) or {}
        return {**live, "chosen_because": (f"the budget leaves no room for the heap cached keeps: {plan.label} "
                                           f"peaked at {live_peak_bytes} bytes under live, over {room_is}, and "
                                           "cached keeps at least as much; not probed")}
    cached = peak.set_cpu_malloc("cached", budgeted=True)
    if cached is None or cached.get("mmap_threshold_bytes") is None:  # not glibc's malloc: nothing was set
        live = peak.set_cpu_malloc("live", budgeted=True) or {}
        return {**live, "chosen_because": f"cached could not be set ({(cached or {}).get('note')})"}

    def probe() -> Dict[str, Any]:
        return plan_select.probe_step(workload, plan, device, runtime_bytes, is_oom, budget_bytes)

    first, main_heap = in_own_arena(probe)
    where = ("in a thread of its own, which glibc served from its main heap (the arena limit was reached): its freed "
             "blocks stay there" if main_heap else "in a thread of its own")
    decided, steps = first, f"{plan.label} probed under cached {where} (two steps, the higher peak)"
    if _fits(first, room) and not main_heap:
        decided = probe()  # the main thread's heap, where the job's steps run
        steps += f" {first['peak_bytes']} bytes, then in the main thread"
    extra = {"probed_peak_bytes": decided["peak_bytes"], "own_arena_probed_peak_bytes": first["peak_bytes"]}
    if _fits(decided, room):
        return {**cached, **extra, "chosen_because": (f"the budget leaves room for the heap cached keeps: {steps} "
                                                      f"{decided['peak_bytes']} bytes <= {room_is}")}
    live = peak.set_cpu_malloc("live", budgeted=True) or {}
    peak.release_memory(device)  # malloc_trim: the heap cached kept goes back before the measured steps
    measured = "ran out of memory" if decided["oom"] else f"peaked at {decided['peak_bytes']} bytes"
    kept = ("" if decided is first and not main_heap else
            "; its freed blocks stay in the main heap, where live tensors can be served from them")
    return {**live, **extra,
            "chosen_because": (f"the budget leaves no room for the heap cached keeps: {steps} {measured}, over "
                               f"{room_is}; live: the resident peak follows what the job holds{kept}")}
