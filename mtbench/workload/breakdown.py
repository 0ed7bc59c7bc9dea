"""Where the peak goes: parameters, gradients, optimizer state, activations, inputs, the rest (torch's MemTracker)."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from mtbench.errors import describe_error
from mtbench.workload import torch_internals

PARTS = ("parameters", "gradients", "optimizer_state", "activations", "inputs", "other")
TOOL = "torch.distributed._tools.mem_tracker.MemTracker"
# MemTracker's categories (torch >= 2.5) -> ours. Tensors we register with track_external (the batches the workload
# holds) land in "Other"; buffers (BatchNorm statistics) and the backward's temporaries go to "other".
_CATEGORY_TO_PART = {
    "Parameter": "parameters",
    "Gradient": "gradients",
    "Optstate": "optimizer_state",
    "Activation": "activations",
    "Other": "inputs",
    "Buffer": "other",
    "Temp": "other",
}


def unavailable_reason() -> Optional[str]:
    """None when this torch has MemTracker, else why the breakdown is null."""
    try:
        from torch.distributed._tools.mem_tracker import MemTracker  # noqa: F401
    except ImportError as exc:
        return f"needs torch >= 2.5 (torch.distributed._tools.mem_tracker); this is torch {torch.__version__} ({exc})"
    return None


def _held_objects(root: Any, depth: int = 3) -> Iterator[Any]:
    """Modules, optimizers and tensors an object holds in its attributes, lists, tuples and dicts (a few levels)."""
    seen = set()

    def walk(obj: Any, level: int) -> Iterator[Any]:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, (torch.Tensor, torch.nn.Module, torch.optim.Optimizer)):
            yield obj
            return
        if level <= 0:
            return
        if isinstance(obj, dict):
            children: List[Any] = list(obj.values())
        elif isinstance(obj, (list, tuple)):
            children = list(obj)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            children = list(vars(obj).values())
        else:
            return
        for child in children:
            yield from walk(child, level - 1)

    yield from walk(root, depth)


@contextlib.contextmanager
def _multi_grad_hooks_removed_after() -> Iterator[None]:
    """Remove the backward hooks MemTracker's ModTracker puts on the step's tensors once the step is done.

    An "all"-mode multi-grad hook (torch.autograd.graph.register_multi_grad_hook) keeps the graph node of the tensor
    it hooks in its own closure: a cycle through C++ that Python's collector cannot see, which keeps the graph and
    with it the model's first layers alive after the job (torch 2.14; found when a job's memory was not returned).
    """
    from torch.distributed._tools import mod_tracker

    handles: List[Any] = []
    original = getattr(mod_tracker, "register_multi_grad_hook", None)
    if original is None:  # another torch: nothing to patch
        yield
        return

    def recording(*args: Any, **kwargs: Any) -> Any:
        handle = original(*args, **kwargs)
        handles.append(handle)
        return handle

    mod_tracker.register_multi_grad_hook = recording
    try:
        yield
    finally:
        mod_tracker.register_multi_grad_hook = original
        for handle in handles:
            handle.remove()


def breakdown_bytes(workload: Any, device: torch.device, step: Optional[Callable[[], None]] = None,
                    enabled: bool = True) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """Run ONE more training step under MemTracker; return (breakdown, None) or (None, reason).
    `enabled=False` (memory.breakdown=false) runs nothing and gives the reason.

    The breakdown holds the six PARTS at the tracked peak of that step, `tracked_peak` (their sum), `tool`, and on
    CUDA `allocator_peak` and `allocator_reserved_peak` of the same step. Call it after the measured steps (and
    after their peak was read): the tracker intercepts every op and would slow timed steps many times over.
    """
    reason = unavailable_reason() if enabled else "memory.breakdown=false: the untimed tracked step was not run"
    if reason is not None:
        return None, reason
    step = step or workload.step
    tracker = torch_internals.step_tracker_class()()
    held = list(_held_objects(workload))
    # order matters: a later registration re-labels a storage, so parameters and optimizer state win over
    # the plain tensors (the prepared input batches) we register as inputs
    tensors = [t for t in held if isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter)]
    modules = [m for m in held if isinstance(m, torch.nn.Module)] + list(workload.modules())
    optimizers = [o for o in held if isinstance(o, torch.optim.Optimizer)]
    try:
        tracker.track_external(*tensors)
        tracker.track_external(*modules)
        tracker.track_external(*optimizers)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        with _multi_grad_hooks_removed_after():
            with tracker:
                step()
        snapshot = tracker.get_tracker_snapshot("peak")
        peaks = {torch.device(dev): total for dev, total in tracker._peak_mem.items()}  # the tracker's own running peak
    except Exception as exc:  # the timed results stand without the breakdown; say why it is missing
        return None, f"MemTracker failed on this workload: {describe_error(exc)}"
    dev_snapshot = _for_device(snapshot, device)
    if dev_snapshot is None:
        return None, f"MemTracker saw no tensor on {device} during the step"
    out: Dict[str, Any] = {part: 0 for part in PARTS}
    for category, part in _CATEGORY_TO_PART.items():
        out[part] += int(dev_snapshot.get(category, 0))
    # MemTracker labels everything allocated inside optimizer.step() "Optstate", the temporaries of a foreach
    # update (weight decay, momentum arithmetic) included; what exceeds the state the optimizers hold is "other"
    held_state = _optimizer_state_bytes(optimizers, device)
    excess = max(0, out["optimizer_state"] - held_state)
    out["optimizer_state"] -= excess
    out["other"] += excess
    # the tracker's running peak, kept apart from the snapshot of its categories (the parts must add up to it)
    out["tracked_peak"] = int(_for_device(peaks, device) or dev_snapshot.get("Total", 0))
    out["tool"] = f"{TOOL} (torch {torch.__version__}), one extra unmeasured step"
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        out["allocator_peak"] = int(torch.cuda.max_memory_allocated(device))
        out["allocator_reserved_peak"] = int(torch.cuda.max_memory_reserved(device))
    return out, None


def _optimizer_state_bytes(optimizers: List[torch.optim.Optimizer], device: torch.device) -> int:
    storages = {}
    for optimizer in optimizers:
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.device.type == device.type:
                    storage = value.untyped_storage()
                    storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _for_device(per_device: Dict[Any, Any], device: torch.device) -> Any:
    """The entry of `device` in a {device: value} dict (a category snapshot gets plain string keys)."""
    for dev, value in per_device.items():
        dev = torch.device(dev)
        if dev.type == device.type and (device.index is None or dev.index in (None, device.index)):
            if isinstance(value, dict):
                return {str(getattr(k, "value", k)): v for k, v in value.items()}
            return value
    return None


def fragmentation_bytes(mem: Dict[str, Any]) -> Optional[int]:
    """The caching allocator's reserved peak minus its allocated peak (CUDA only; None elsewhere)."""
    reserved, allocated = mem.get("mem_peak_reserved_bytes"), mem.get("mem_peak_bytes")
    if mem.get("mem_peak_source") != "cuda_allocator" or reserved is None or allocated is None:
        return None
    return int(reserved) - int(allocated)
