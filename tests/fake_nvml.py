"""A stand-in for nvidia-ml-py's `pynvml` that behaves like the driver, not like our code expects.

What it copies from real NVML: the total-energy counter (mJ since the driver loaded, so it starts far from 0)
moves only every `update_s` (~100 ms on real GPUs: 20 reads at 5 ms return the same value);
`nvmlDeviceGetPowerUsage` is the average over the last second (Ampere and newer but GA100), refreshed at the
same period; the instantaneous power is the field NVML_FI_DEV_POWER_INSTANT of `nvmlDeviceGetFieldValues`
(each returned value carries its own `nvmlReturn`: a driver or GPU without it answers NOT_SUPPORTED there,
not by raising), refreshed every `instant_update_s` (100 ms) with the mean power over the last `instant_window_s`
(25 ms) before the refresh, as A100/H100 drivers do (Yang et al., SC'24: 25 ms sampled in every 100 ms); its
timestamp is the refresh's; its last digit moves at every refresh, as a real sensor's noise does; UUIDs read
"GPU-<hex>" (torch prints the same hex without the prefix); errors are NVMLError subclasses whose text is
NVML's (`NVMLError_NoPermission`: "Insufficient Permissions"); a Jetson answers NOT_SUPPORTED everywhere.
A MIG-enabled GPU (`mig` = its instances' UUIDs) answers `nvmlDeviceGetMigMode` (1, 1), gives its instances
through `nvmlDeviceGetMigDeviceHandleByIndex` (NOT_FOUND for an empty slot) with "MIG-<hex>" UUIDs; an
instance answers memory but NOT_SUPPORTED for power, energy and utilization, and the parent answers
NOT_SUPPORTED for utilization (NVML's documented behaviour under MIG). Power is `power_w(t)` (W at t seconds
after the fake's start), or idles at `idle_w` until `busy_from_s`, then draws `busy_w`.
"""
from __future__ import annotations

import time
import types
from dataclasses import dataclass
from typing import Callable, List, Optional

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_FI_DEV_POWER_INSTANT = 186
NVML_DEVICE_ARCH_VOLTA, NVML_DEVICE_ARCH_AMPERE, NVML_DEVICE_ARCH_HOPPER = 5, 7, 9


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


class NVMLError_NotFound(NVMLError):  # noqa: N801
    text = "Not Found"


class NVMLError_InvalidArgument(NVMLError):  # noqa: N801
    text = "Invalid Argument"


@dataclass
class FakeGpu:
    uuid: str = "GPU-8f3c2d1e-0000-4a5b-9c7d-000000000000"
    busy_w: float = 300.0
    idle_w: Optional[float] = None  # None: busy_w (a GPU already at work when the fake starts)
    busy_from_s: float = 0.0  # seconds after the fake's start
    power_w: Optional[Callable[[float], float]] = None  # W at t s after the fake's start (replaces busy/idle)
    util_pct: int = 75
    # busy % at t s after the fake's start (replaces util_pct): NVML answers the share of the last sample period
    # (util_period_s: 1/6 s to 1 s by product) in which a kernel ran, renewed once per period, a point of jitter
    # between periods
    util_of: Optional[Callable[[float], float]] = None
    mem_used_bytes: int = 2 ** 30
    handle_error: Optional[type] = None  # nvmlDeviceGetHandleByIndex raises this
    name: str = "NVIDIA H100 80GB HBM3"
    architecture: int = NVML_DEVICE_ARCH_HOPPER
    instant_supported: bool = True  # the driver gives NVML_FI_DEV_POWER_INSTANT
    mig: Optional[List[str]] = None  # MIG enabled with these instances' UUIDs ("MIG-...")
    # the set calls (issue 22): as NVML, NO_PERMISSION unless root, INVALID_ARGUMENT out of range, NOT_SUPPORTED
    # for locked clocks before Volta; the state is the driver's (here: this object's)
    root: bool = True
    power_limit_mw: int = 700_000
    power_limit_range_mw: tuple = (200_000, 700_000)
    graphics_clocks_mhz: tuple = (345, 1980)  # the supported range of locked clocks
    locked_clocks_mhz: Optional[tuple] = None


@dataclass
class _MigHandle:
    parent: FakeGpu
    uuid: str


class _Energy:
    """Joules drawn since `t0` under an arbitrary power curve, integrated on a 0.1 ms grid (exact enough)."""

    DT = 1e-4

    def __init__(self, power: Callable[[float], float], start: float = -3.0) -> None:
        self.power, self.start = power, start
        self.cum = [0.0]

    def __call__(self, t: float) -> float:
        k, zero = (t - self.start) / self.DT, int(round(-self.start / self.DT))
        while len(self.cum) < max(int(k), zero) + 2:
            i = len(self.cum) - 1
            self.cum.append(self.cum[-1] + self.power(self.start + (i + 0.5) * self.DT) * self.DT)
        i = int(k)
        return self.cum[i] + (self.cum[i + 1] - self.cum[i]) * (k - i) - self.cum[zero]


def fake_pynvml(gpus: Optional[List[FakeGpu]] = None, clock: Callable[[], float] = time.monotonic,
                update_s: float = 0.1, power_window_s: float = 1.0, energy_supported: bool = True,
                everything_unsupported: bool = False, boot_energy_mj: int = 987_654_321,
                instant_update_s: float = 0.1, instant_window_s: float = 0.025,
                util_period_s: float = 1.0) -> types.ModuleType:
    gpus = list(gpus) if gpus is not None else [FakeGpu()]
    nv = types.ModuleType("pynvml")
    nv.NVMLError = NVMLError
    nv.NVMLError_NotSupported, nv.NVMLError_NoPermission = NVMLError_NotSupported, NVMLError_NoPermission
    nv.NVMLError_GpuIsLost, nv.NVMLError_NotFound = NVMLError_GpuIsLost, NVMLError_NotFound
    nv.NVML_SUCCESS, nv.NVML_ERROR_NOT_SUPPORTED = NVML_SUCCESS, NVML_ERROR_NOT_SUPPORTED
    nv.NVML_FI_DEV_POWER_INSTANT = NVML_FI_DEV_POWER_INSTANT
    nv.NVML_DEVICE_MIG_ENABLE = 1
    t0 = clock()
    curves = {}

    def energy_j(g: FakeGpu, t: float) -> float:
        """Truth: joules drawn from t0 to t (t may be before t0)."""
        if g.power_w is not None:
            if id(g) not in curves:
                curves[id(g)] = _Energy(g.power_w)
            return curves[id(g)](t - t0)
        edge = t0 + g.busy_from_s
        idle = g.busy_w if g.idle_w is None else g.idle_w
        return idle * (min(t, edge) - t0) + g.busy_w * max(0.0, t - edge)

    def last_update(t: float, period: float) -> float:
        return t0 + (t - t0) // period * period

    def unsupported(*_):
        raise NVMLError_NotSupported()

    def handle(i):
        if not 0 <= i < len(gpus):
            raise NVMLError("Invalid Argument")
        if gpus[i].handle_error is not None:
            raise gpus[i].handle_error()
        return gpus[i]

    def physical(h) -> FakeGpu:
        if isinstance(h, _MigHandle):  # an instance: NVML has no per-instance power, energy nor utilization
            raise NVMLError_NotSupported()
        return h

    def power_mw(h) -> int:
        g = physical(h)
        u = last_update(clock(), update_s)
        return int(round((energy_j(g, u) - energy_j(g, u - power_window_s)) / power_window_s * 1000))

    def energy_mj(h) -> int:
        return boot_energy_mj + int(energy_j(physical(h), last_update(clock(), update_s)) * 1000)

    def field_values(h, ids):
        out = []
        for fid in ids:
            value = types.SimpleNamespace(fieldId=fid, nvmlReturn=NVML_ERROR_NOT_SUPPORTED, timestamp=0,
                                          value=types.SimpleNamespace(uiVal=0))
            g = h.parent if isinstance(h, _MigHandle) else h
            if fid == NVML_FI_DEV_POWER_INSTANT and g.instant_supported and not isinstance(h, _MigHandle):
                u = last_update(clock(), instant_update_s)
                mw = (energy_j(g, u) - energy_j(g, u - instant_window_s)) / instant_window_s * 1000
                # a real reading's last digits move at every refresh (sensor noise): 1 mW of it here
                value.value.uiVal = int(round(mw)) + int(round((u - t0) / instant_update_s)) % 2
                value.nvmlReturn, value.timestamp = NVML_SUCCESS, int(u * 1e6)
            out.append(value)
        return out

    def utilization(h):
        g = physical(h)
        if g.mig:
            raise NVMLError_NotSupported()
        if g.util_of is None:
            return types.SimpleNamespace(gpu=g.util_pct, memory=30)
        end = last_update(clock(), util_period_s) - t0
        busy = sum(g.util_of(end - util_period_s * (k + 0.5) / 100) for k in range(100)) / 100
        # a measured share moves by a point from one period to the next (kernel launch jitter): 1 % here
        jitter = int(round(end / util_period_s)) % 2 if 0 < busy < 100 else 0
        return types.SimpleNamespace(gpu=int(round(busy)) - jitter, memory=30)

    def mig_mode(h):
        g = physical(h)
        if g.architecture < NVML_DEVICE_ARCH_AMPERE:
            raise NVMLError_NotSupported()
        return (1, 1) if g.mig else (0, 0)

    def mig_handle(h, j):
        g = physical(h)
        if not g.mig:
            raise NVMLError("Invalid Argument")
        if not 0 <= j < len(g.mig):
            raise NVMLError_NotFound()
        return _MigHandle(g, g.mig[j])

    nv.nvmlInit = lambda: None
    nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: len(gpus)
    nv.nvmlDeviceGetHandleByIndex = handle
    nv.nvmlDeviceGetUUID = lambda h: h.uuid
    nv.nvmlDeviceGetName = lambda h: physical(h).name
    if everything_unsupported:
        nv.nvmlDeviceGetUtilizationRates = nv.nvmlDeviceGetPowerUsage = unsupported
        nv.nvmlDeviceGetTotalEnergyConsumption = nv.nvmlDeviceGetMemoryInfo = unsupported
        nv.nvmlDeviceGetFieldValues = lambda h, ids: [types.SimpleNamespace(
            fieldId=f, nvmlReturn=NVML_ERROR_NOT_SUPPORTED, timestamp=0, value=None) for f in ids]
        nv.nvmlDeviceGetMigMode = nv.nvmlDeviceGetArchitecture = unsupported
        return nv
    nv.nvmlDeviceGetArchitecture = lambda h: physical(h).architecture

    def set_limit(h, mw):
        g = physical(h)
        if not g.root:
            raise NVMLError_NoPermission()
        if not g.power_limit_range_mw[0] <= mw <= g.power_limit_range_mw[1]:
            raise NVMLError_InvalidArgument()
        g.power_limit_mw = int(mw)

    def lock_clocks(h, low, high):
        g = physical(h)
        if g.architecture < NVML_DEVICE_ARCH_VOLTA:
            raise NVMLError_NotSupported()
        if not g.root:
            raise NVMLError_NoPermission()
        if not (g.graphics_clocks_mhz[0] <= low <= high <= g.graphics_clocks_mhz[1]):
            raise NVMLError_InvalidArgument()
        g.locked_clocks_mhz = (low, high)

    def reset_clocks(h):
        g = physical(h)
        if not g.root:
            raise NVMLError_NoPermission()
        g.locked_clocks_mhz = None

    nv.NVMLError_InvalidArgument = NVMLError_InvalidArgument
    nv.nvmlDeviceGetPowerManagementLimit = lambda h: physical(h).power_limit_mw
    nv.nvmlDeviceGetPowerManagementDefaultLimit = lambda h: physical(h).power_limit_range_mw[1]
    nv.nvmlDeviceGetPowerManagementLimitConstraints = lambda h: tuple(physical(h).power_limit_range_mw)
    nv.nvmlDeviceSetPowerManagementLimit = set_limit
    nv.nvmlDeviceSetGpuLockedClocks = lock_clocks
    nv.nvmlDeviceResetGpuLockedClocks = reset_clocks
    nv.nvmlDeviceGetMigMode = mig_mode
    nv.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7 if physical(h).mig else 0
    nv.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle
    nv.nvmlDeviceGetUtilizationRates = utilization
    nv.nvmlDeviceGetPowerUsage = power_mw
    nv.nvmlDeviceGetFieldValues = field_values
    nv.nvmlDeviceGetTotalEnergyConsumption = energy_mj if energy_supported else unsupported
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        used=h.parent.mem_used_bytes // 2 if isinstance(h, _MigHandle) else h.mem_used_bytes, total=2 ** 34)
    return nv
