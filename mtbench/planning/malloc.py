"""memory.cpu_malloc=auto for a CPU job that plans under a budget: `cached` where the budget has room for its heap."""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch

from mtbench.device import peak
from mtbench.device.arena import in_own_arena
from mtbench.planning import choose as plan_select
from mtbench.workload.plans import MemoryPlan

# The share of the budget left free above the probed peak under `cached`: glibc's heap can still grow a little in the
# steps after the probe's two (a free block of the right size is not always where the next tensor needs it).
HEAP_MARGIN = 0.05


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
