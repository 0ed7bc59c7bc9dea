"""A CUDA GPU's power knobs through NVML: the power limit and locked graphics clocks, set, read back, restored."""
from __future__ import annotations

from typing import Any, Dict, Optional

from mtbench.errors import UsageError


def _nvml() -> Any:
    try:
        import pynvml
    except ImportError:
        raise UsageError("power.gpu_power_limit_w / power.gpu_locked_clocks_mhz need NVML: "
                         "pip install nvidia-ml-py") from None
    pynvml.nvmlInit()
    return pynvml


def _refused(key: str, value: Any, exc: Exception, allowed: str) -> UsageError:
    name = type(exc).__name__
    if "NoPermission" in name:
        return UsageError(f"{key}={value!r}: NVML refuses ({exc}): setting it needs root")
    if "NotSupported" in name:
        return UsageError(f"{key}={value!r}: this GPU or driver does not support it (NVML: {exc})")
    return UsageError(f"{key}={value!r} is not allowed by this GPU (NVML: {exc}); allowed: {allowed}")


def snapshot(index: int) -> Dict[str, Any]:
    """What the GPU has now (NVML index `index`), for the restore record."""
    nv = _nvml()
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    return {"index": index, "power_limit_mw": nv.nvmlDeviceGetPowerManagementLimit(handle)}


def apply(index: int, power_limit_w: Optional[float], locked_mhz: Optional[list]) -> Dict[str, Any]:
    """Set what is asked; return what NVML reports back. UsageError (one line) where NVML refuses."""
    nv = _nvml()
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    read_back: Dict[str, Any] = {}
    if power_limit_w is not None:
        try:
            low, high = nv.nvmlDeviceGetPowerManagementLimitConstraints(handle)
            allowed = f"{low / 1000:g}-{high / 1000:g} W"
        except Exception:  # noqa: BLE001 - the range is only for the message
            allowed = "within the GPU's power limit constraints"
        try:
            nv.nvmlDeviceSetPowerManagementLimit(handle, int(round(power_limit_w * 1000)))
        except nv.NVMLError as exc:
            raise _refused("power.gpu_power_limit_w", power_limit_w, exc, allowed) from None
        read_back["gpu_power_limit_w"] = nv.nvmlDeviceGetPowerManagementLimit(handle) / 1000
    if locked_mhz is not None:
        try:
            nv.nvmlDeviceSetGpuLockedClocks(handle, int(locked_mhz[0]), int(locked_mhz[1]))
        except nv.NVMLError as exc:
            raise _refused("power.gpu_locked_clocks_mhz", locked_mhz, exc,
                           "clocks within the GPU's supported graphics clocks") from None
        # NVML has no getter of the lock: what the accepted call set
        read_back["gpu_locked_clocks_mhz"] = list(locked_mhz)
    return read_back


def restore(record: Dict[str, Any], locked: bool) -> None:
    """Set the power limit back and (where it was locked) release the clocks. OSError-free: NVML errors raise."""
    nv = _nvml()
    handle = nv.nvmlDeviceGetHandleByIndex(int(record["index"]))
    if locked:
        nv.nvmlDeviceResetGpuLockedClocks(handle)
    if nv.nvmlDeviceGetPowerManagementLimit(handle) != record["power_limit_mw"]:
        nv.nvmlDeviceSetPowerManagementLimit(handle, int(record["power_limit_mw"]))
