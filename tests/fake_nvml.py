"""A stand-in for nvidia-ml-py's `pynvml` that behaves like the driver, not like our code expects.

What it copies from real NVML: the total-energy counter (mJ since the driver loaded, so it starts far from 0)
moves only every `update_s` (~100 ms on real GPUs: 20 reads at 5 ms return the same value); the power
reading is the average over the last second (Ampere and newer), refreshed at the same period; UUIDs read
"GPU-<hex>" (torch prints the same hex without the prefix); errors are NVMLError subclasses whose text is
NVML's (`NVMLError_NoPermission`: "Insufficient Permissions"); a Jetson answers NOT_SUPPORTED everywhere.
Each GPU idles at `idle_w` until `busy_from_s` after the fake's start, then draws `busy_w`.
"""
from __future__ import annotations

import time
import types
from dataclasses import dataclass
from typing import Callable, List, Optional


class NVMLError(Exception):
    text = "Unknown Error"

    def __str__(self) -> str:
        return self.text


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's names
    text = "Not Supported"


class NVMLError_NoPermission(NVMLError):  # noqa: N801
    text = "Insufficient Permissions"


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801
    text = "GPU is lost"


@dataclass
class FakeGpu:
    uuid: str = "GPU-8f3c2d1e-0000-4a5b-9c7d-000000000000"
    busy_w: float = 300.0
    idle_w: Optional[float] = None  # None: busy_w (a GPU already at work when the fake starts)
    busy_from_s: float = 0.0  # seconds after the fake's start
    util_pct: int = 75
    mem_used_bytes: int = 2 ** 30
    handle_error: Optional[type] = None  # nvmlDeviceGetHandleByIndex raises this


def fake_pynvml(gpus: Optional[List[FakeGpu]] = None, clock: Callable[[], float] = time.monotonic,
                update_s: float = 0.1, power_window_s: float = 1.0, energy_supported: bool = True,
                everything_unsupported: bool = False, boot_energy_mj: int = 987_654_321) -> types.ModuleType:
    gpus = list(gpus) if gpus is not None else [FakeGpu()]
    nv = types.ModuleType("pynvml")
    nv.NVMLError = NVMLError
    nv.NVMLError_NotSupported, nv.NVMLError_NoPermission = NVMLError_NotSupported, NVMLError_NoPermission
    nv.NVMLError_GpuIsLost = NVMLError_GpuIsLost
    t0 = clock()

    def energy_j(g: FakeGpu, t: float) -> float:
        """Truth: joules drawn from t0 to t (t may be before t0: the GPU idled)."""
        edge = t0 + g.busy_from_s
        idle = g.busy_w if g.idle_w is None else g.idle_w
        return idle * (min(t, edge) - t0) + g.busy_w * max(0.0, t - edge)

    def last_update(t: float) -> float:
        return t0 + (t - t0) // update_s * update_s

    def unsupported(*_):
        raise NVMLError_NotSupported()

    def handle(i):
        if not 0 <= i < len(gpus):
            raise NVMLError("Invalid Argument")
        if gpus[i].handle_error is not None:
            raise gpus[i].handle_error()
        return gpus[i]

    def power_mw(g: FakeGpu) -> int:
        u = last_update(clock())
        return int(round((energy_j(g, u) - energy_j(g, u - power_window_s)) / power_window_s * 1000))

    def energy_mj(g: FakeGpu) -> int:
        return boot_energy_mj + int(energy_j(g, last_update(clock())) * 1000)

    nv.nvmlInit = lambda: None
    nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: len(gpus)
    nv.nvmlDeviceGetHandleByIndex = handle
    nv.nvmlDeviceGetUUID = lambda g: g.uuid
    if everything_unsupported:
        nv.nvmlDeviceGetUtilizationRates = nv.nvmlDeviceGetPowerUsage = unsupported
        nv.nvmlDeviceGetTotalEnergyConsumption = nv.nvmlDeviceGetMemoryInfo = unsupported
        return nv
    nv.nvmlDeviceGetUtilizationRates = lambda g: types.SimpleNamespace(gpu=g.util_pct, memory=30)
    nv.nvmlDeviceGetPowerUsage = power_mw
    nv.nvmlDeviceGetTotalEnergyConsumption = energy_mj if energy_supported else unsupported
    nv.nvmlDeviceGetMemoryInfo = lambda g: types.SimpleNamespace(used=g.mem_used_bytes, total=2 ** 34)
    return nv
