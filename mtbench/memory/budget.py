"""Hold a job to a target board's memory budget: cap the CUDA allocator before the model exists, or check the CPU peak."""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from mtbench.memory.targets import Target

# on CPU the budget is compared with this peak of the job's summary (PeakMemory.read): the process's resident
# high-water mark over the measured steps. System RAM in use is not compared: other processes share it here.
COMPARED_PEAK = "mem_peak_bytes"


def target_from_cfg(cfg: Any) -> Target:
    """The composed config's target (command-line overrides such as target.memory_budget_bytes=N included)."""
    node = cfg.get("target") if hasattr(cfg, "get") else None
    if node is None:
        return Target.none()
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=True)
    return Target.from_mapping(node)


def apply_budget(target: Target, device: torch.device) -> Dict[str, Any]:
    """Before the model is built: on CUDA, cap the caching allocator at the budget so an oversized job fails with a
    real out-of-memory error, as on the board. Returns how the budget is held (for summary.json)."""
    budget = target.memory_budget_bytes
    if budget is None:
        return {"budget_bytes": None, "budget_enforced_by": None}
    if device.type != "cuda":
        return {"budget_bytes": budget, "budget_enforced_by": "peak_check"}
    total = torch.cuda.get_device_properties(device).total_memory
    if budget >= total:
        # nothing to emulate: this GPU runs out before the board would; an OOM here is the GPU's own
        return {"budget_bytes": budget, "budget_enforced_by": None,
                "budget_note": f"the GPU has {total} bytes, not more than the budget: not capped"}
    # the fraction caps what the allocator may reserve; the CUDA context is outside it, as the budget excludes it
    torch.cuda.set_per_process_memory_fraction(budget / total, device)
    return {"budget_bytes": budget, "budget_enforced_by": "cuda_memory_fraction"}


def release_budget(device: torch.device) -> None:
    """Lift the cap (a process that runs several jobs, as the tests do)."""
    if device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def budget_failure(target: Target, mem: Dict[str, Any], enforced_by: Optional[str]) -> Optional[Dict[str, str]]:
    """After the job (CPU): failure {"kind": "budget", ...} when its peak exceeds the budget, else None."""
    budget = target.memory_budget_bytes
    peak = mem.get(COMPARED_PEAK)
    if budget is None or enforced_by != "peak_check" or peak is None or peak <= budget:
        return None
    source = mem.get("mem_peak_source")
    which = {
        "process_rss": "the process's resident high-water mark (VmHWM) over the measured steps",
        "process_ru_maxrss": "the process's lifetime resident peak (ru_maxrss)",
    }.get(str(source), str(source))
    return {
        "kind": "budget",
        "message": (f"peak {_gib(peak)} ({which}) exceeds target {target.name}'s budget {_gib(budget)} "
                    f"by {_gib(peak - budget)} ({peak} > {budget} bytes)"),
    }


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
