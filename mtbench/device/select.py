"""Which torch device a job runs on, its synchronization, and the key that names it across processes."""
from __future__ import annotations

import torch

from mtbench.errors import UsageError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("device=cuda but no CUDA GPU is visible to torch; allowed here: device=cpu or device=auto")
        return torch.device("cuda", torch.cuda.current_device())  # recorded as "cuda:0", not a bare "cuda"
    return torch.device(name)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)



def device_uuid(device: torch.device) -> str:
    try:
        return str(torch.cuda.get_device_properties(device).uuid)
    except (AttributeError, RuntimeError):  # torch builds without the uuid property
        return str(device.index or 0)


def lock_key(device: torch.device) -> str:
    """The name a device's lock file carries: `cpu`, or the GPU's type and UUID (the same GPU under any index)."""
    return "cpu" if device.type == "cpu" else f"{device.type}-{device_uuid(device)}"
