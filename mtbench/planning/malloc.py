"""memory.cpu_malloc=auto for a CPU job that plans under a budget: `cached` where the budget has room for its heap."""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch

from mtbench.device import peak
from mtbench.planning import choose as plan_select
from mtbench.workload.plans import MemoryPlan

# The share of the budget left free above the probed peak under `cached`: glibc's heap can still grow a little in the
# steps after the probe's two (a free block of the right size is not always where the next tensor needs it).
HEAP_MARGIN = 0.05


def choose_cpu_malloc(workload: Any, plan: MemoryPlan, device: torch.device, runtime_bytes: Optional[int],
                      is_oom: Callable[[BaseException], bool], budget_bytes: int) -> Dict[str, Any]:
    """After the plan was chosen under `live` (the resident peak follows what the job holds): how much glibc keeps
    under `cached` (freed memory kept for the next tensors, no trimming, so no page faults: the throughput of a
    GPU's caching allocator) is measured, not guessed: the chosen plan's probe, two steps under `cached`, the higher
    resident peak (less the runtime) counts. Within the budget less HEAP_MARGIN: `cached` stays; else `live` again
    and what glibc kept is given back. Returns summary.json's `cpu_malloc`, with `chosen_because`."""
    cached = peak.set_cpu_malloc("cached", budgeted=True)
    if cached is None or cached.get("mmap_threshold_bytes") is None:  # not glibc's malloc: nothing was set
        live = peak.set_cpu_malloc("live", budgeted=True) or {}
        return {**live, "chosen_because": f"cached could not be set ({(cached or {}).get('note')})"}
    probe = plan_select.probe_step(workload, plan, device, runtime_bytes, is_oom, budget_bytes)
    room = int(budget_bytes * (1 - HEAP_MARGIN))
    probed = probe["peak_bytes"]
    if not probe["oom"] and probed is not None and probed <= room:
        return {**cached, "probed_peak_bytes": probed,
                "chosen_because": (f"the budget leaves room for the heap cached keeps: {plan.label} probed under "
                                   f"cached (two steps, the higher peak) {probed} bytes <= {room} bytes (the budget "
                                   f"less {HEAP_MARGIN:.0%})")}
    live = peak.set_cpu_malloc("live", budgeted=True) or {}
    peak.release_memory(device)  # malloc_trim: the heap cached kept goes back before the measured steps
    measured = "ran out of memory" if probe["oom"] else f"peaked at {probed} bytes"
    return {**live, "probed_peak_bytes": probed,
            "chosen_because": (f"the budget leaves no room for the heap cached keeps: {plan.label} {measured} under "
                               f"cached, over {room} bytes (the budget less {HEAP_MARGIN:.0%}); live: the resident "
                               "peak follows what the job holds")}
