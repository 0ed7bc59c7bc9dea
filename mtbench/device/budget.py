"""Hold a job to a target board's memory budget: cap the CUDA allocator before the model exists, or check the CPU peak."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from mtbench.config import setting
from mtbench.device.targets import Target
from mtbench.errors import UsageError

# On CPU the budget is compared with the job's training memory: the peak of what the process owns (anonymous and
# shmem memory: VmHWM over the measured steps less the file-backed pages resident then, PeakMemory's
# "mem_training_peak_bytes", the summary's mem_training_bytes) less what it owned before the model was built (torch
# and its libraries' heap: the runtime that the budget rule already took off the board's memory, see
# conf/target/tx2.yaml). The libraries' mapped code is not counted: its resident share follows the page cache, not
# training. Where the kernel gives no RssFile (< 4.5) the resident peak less the resident runtime is compared.
# System RAM in use is not compared: other processes share it here. A job held to a budget runs with glibc's mmap
# threshold fixed (peak.hold_malloc_to_live_memory), so that its peak is what it holds.
_PEAK_SOURCES = {
    "process_rss": "the process's resident high-water mark (VmHWM) over the measured steps",
    "process_hwm_lifetime": "the process's resident high-water mark (VmHWM), not reset: its lifetime peak",
    "process_ru_maxrss": "the process's lifetime resident peak (ru_maxrss)",
}


def target_from_cfg(cfg: Any) -> Target:
    """The composed config's target (command-line overrides such as target.memory_budget_bytes=N included)."""
    node = cfg.get("target") if hasattr(cfg, "get") else None
    if node is None:
        return Target.none()
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=True)
    return Target.from_mapping(node)


def job_budget(cfg: Any) -> Tuple[Optional[int], Optional[str]]:
    """The one memory budget of a job and where it comes from: memory.budget_gb (GiB) where set, else the target's
    memory_budget_bytes; (None, None) without either. The planner holds the job to it and a dead job's summary
    records it, so that a job records the same budget however it ends."""
    gb = setting(cfg, "memory.budget_gb", None)
    if gb is not None:
        return int(float(gb) * 2**30), "memory.budget_gb"
    try:
        target = target_from_cfg(cfg)
    except (ValueError, TypeError, UsageError):  # a target the job refuses (its summary says why): no budget
        return None, None
    if target.memory_budget_bytes is not None:
        return int(target.memory_budget_bytes), f"target {target.name}"
    return None, None


def apply_budget(target: Target, device: torch.device, cpu_malloc: str = "auto") -> Dict[str, Any]:
    """Before the model is built: on CUDA, cap the caching allocator at the budget so an oversized job fails with a
    real out-of-memory error, as on the board. Returns how the budget is held (for summary.json)."""
    budget = target.memory_budget_bytes
    if budget is None:
        return {"budget_bytes": None, "budget_enforced_by": None}
    if device.type != "cuda":
        # a board trains on its GPU, whose caching allocator reuses the blocks it keeps reserved; glibc's dynamic
        # mmap threshold would add hundreds of MiB of freed heap kept resident, which no board's budget pays
        # (memory.cpu_malloc=auto: live)
        from mtbench.device.peak import set_cpu_malloc

        return {"budget_bytes": budget, "budget_enforced_by": "peak_check",
                "cpu_malloc": set_cpu_malloc(cpu_malloc, budgeted=True)}
    total = torch.cuda.get_device_properties(device).total_memory
    if budget >= total:
        # nothing to emulate: this GPU runs out before the board would; an OOM here is the GPU's own
        return {"budget_bytes": budget, "budget_enforced_by": None,
                "budget_note": f"the GPU has {total} bytes, not more than the budget: not capped"}
    # the fraction caps what the allocator may reserve; the CUDA context is outside it, as the budget excludes it
    torch.cuda.set_per_process_memory_fraction(budget / total, device)
    return {"budget_bytes": budget, "budget_enforced_by": "cuda_memory_fraction"}


def release_budget(device: torch.device) -> None:
    """Lift the cap (a process that runs several jobs, as the tests do), and take back the request for huge pages
    where the job failed before its `live` did."""
    from mtbench.device import hugepages

    hugepages.withdraw()
    if device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def _compared_peak(mem: Dict[str, Any]) -> Tuple[Optional[int], str]:
    """The CPU peak a budget compares and its words: the training peak where measured, else the resident one."""
    if mem.get("mem_training_peak_bytes") is not None:
        return int(mem["mem_training_peak_bytes"]), ("training memory: the resident high-water mark less the "
                                                     "file-backed pages (the libraries' code)")
    peak = mem.get("mem_peak_bytes")
    which = _PEAK_SOURCES.get(str(mem.get("mem_peak_source")), str(mem.get("mem_peak_source")))
    return (None if peak is None else int(peak)), which


def compared_bytes(mem: Dict[str, Any], runtime_bytes: Optional[int]) -> Optional[int]:
    """The figure held against the budget on CPU: the training peak less the runtime (peak.budget_runtime_bytes;
    the raw peak when that is unknown)."""
    peak, _ = _compared_peak(mem)
    if peak is None:
        return None
    return peak - int(runtime_bytes or 0)


def budget_failure(target: Target, mem: Dict[str, Any], enforced_by: Optional[str],
                   runtime_bytes: Optional[int] = None) -> Optional[Dict[str, str]]:
    """After the job: failure {"kind": "budget", ...} when its memory exceeds the budget, else None. On CPU the
    training memory less the runtime; on an integrated GPU (a Jetson) the board's memory, the host's training
    memory plus the allocator's reserved peak, less the host's runtime (the allocator alone is capped at the
    budget before the model is built, the host's memory comes on top of it in the same DRAM)."""
    budget = target.memory_budget_bytes
    if mem.get("mem_board_bytes") is not None:  # an integrated GPU: host and allocator share the board's DRAM
        peak, which = int(mem["mem_board_bytes"]), f"board memory: {mem.get('mem_board_source')}"
        compared = peak - int(runtime_bytes or 0)
    elif enforced_by == "peak_check":
        compared = compared_bytes(mem, runtime_bytes)
        peak, which = _compared_peak(mem)
    else:
        return None
    if budget is None or compared is None or compared <= budget:
        return None
    assert peak is not None
    held = (f" less {_gib(runtime_bytes)} held before the model was built (the runtime) = {_gib(compared)}"
            if runtime_bytes else "")
    return {
        "kind": "budget",
        "message": (f"peak {_gib(peak)} ({which}){held} exceeds target {target.name}'s budget {_gib(budget)} "
                    f"by {_gib(compared - budget)} ({compared} > {budget} bytes)"),
    }


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
