"""memory.cpu_malloc=auto for a CPU job that plans under a budget: `cached` where the budget has room for its heap."""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional

import torch

from mtbench.device import peak
from mtbench.planning import choose as plan_select
from mtbench.workload.plans import MemoryPlan

# The share of the budget left free above the probed peak under `cached`: glibc's heap can still grow a little in the
# steps after the probe's two (a free block of the right size is not always where the next tensor needs it).
HEAP_MARGIN = 0.05


def in_own_arena(fn: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
    """fn() in a thread of its own, so that glibc serves its allocations from an arena of their own (each new
    thread gets one, up to 8 per core): what `cached` leaves in a heap stays out of the main thread's.

    Run in the main thread, a rejected `cached` probe left its tensors' freed blocks in the main heap, and under
    `live` glibc serves tensors above the mmap threshold from those blocks before it maps fresh ones; freed, they
    stay resident until the next trim. InceptionV1 32x32 batch 48, recompute/auto@75%: the steps after such a probe
    peaked at 866-1042 MiB over five steps of two processes (no probe: 862, every step of every process); after the
    probe in its own thread, 864 in every step. A thread's arena keeps more than the main heap (the same probe:
    1246-1269 against 1126-1134 MiB), so `cached` is kept only where it fits with that to spare."""
    done: Dict[str, Any] = {}
    threads = torch.get_num_threads()  # a new thread starts at OpenMP's default, not at the job's setting

    def run() -> None:
        torch.set_num_threads(threads)
        try:
            done["result"] = fn()
        except BaseException as exc:  # noqa: B902 - raised again in the calling thread
            done["error"] = exc

    worker = threading.Thread(target=run, name="mtbench-cached-probe", daemon=True)  # daemon: a signal's exit
    worker.start()  # does not wait for a probe step
    worker.join()
    if "error" in done:
        raise done["error"]
    return done["result"]


def choose_cpu_malloc(workload: Any, plan: MemoryPlan, device: torch.device, runtime_bytes: Optional[int],
                      is_oom: Callable[[BaseException], bool], budget_bytes: int,
                      live_peak_bytes: Optional[int] = None) -> Dict[str, Any]:
    """After the plan was chosen under `live` (the resident peak follows what the job holds): how much glibc keeps
    under `cached` (freed memory kept for the next tensors, no trimming, so no page faults: the throughput of a
    GPU's caching allocator) is measured, not guessed: the chosen plan's probe, two steps under `cached`, the higher
    resident peak (less the runtime) counts. Within the budget less HEAP_MARGIN: `cached` stays; else `live` again
    and what glibc kept is given back. The probe runs in a thread of its own (`in_own_arena`); none runs where the
    plan's peak under `live` (`live_peak_bytes`) is already over that room: `cached` keeps at least as much.
    Returns summary.json's `cpu_malloc`, with `chosen_because`."""
    room = int(budget_bytes * (1 - HEAP_MARGIN))
    if live_peak_bytes is not None and live_peak_bytes > room:
        live = peak.set_cpu_malloc("live", budgeted=True) or {}
        return {**live, "chosen_because": (f"the budget leaves no room for the heap cached keeps: {plan.label} "
                                           f"peaked at {live_peak_bytes} bytes under live, over {room} bytes (the "
                                           f"budget less {HEAP_MARGIN:.0%}), and cached keeps at least as much; "
                                           "not probed")}
    cached = peak.set_cpu_malloc("cached", budgeted=True)
    if cached is None or cached.get("mmap_threshold_bytes") is None:  # not glibc's malloc: nothing was set
        live = peak.set_cpu_malloc("live", budgeted=True) or {}
        return {**live, "chosen_because": f"cached could not be set ({(cached or {}).get('note')})"}
    probe = in_own_arena(lambda: plan_select.probe_step(workload, plan, device, runtime_bytes, is_oom, budget_bytes))
    probed = probe["peak_bytes"]
    if not probe["oom"] and probed is not None and probed <= room:
        return {**cached, "probed_peak_bytes": probed,
                "chosen_because": (f"the budget leaves room for the heap cached keeps: {plan.label} probed under "
                                   f"cached (two steps in a thread of its own, the higher peak) {probed} bytes <= {room} bytes (the budget "
                                   f"less {HEAP_MARGIN:.0%})")}
    live = peak.set_cpu_malloc("live", budgeted=True) or {}
    peak.release_memory(device)  # malloc_trim: the heap cached kept goes back before the measured steps
    measured = "ran out of memory" if probe["oom"] else f"peaked at {probed} bytes"
    return {**live, "probed_peak_bytes": probed,
            "chosen_because": (f"the budget leaves no room for the heap cached keeps: {plan.label} {measured} under "
                               f"cached, over {room} bytes (the budget less {HEAP_MARGIN:.0%}); live: the resident "
                               "peak follows what the job holds")}
