"""NVIDIA GPUs through NVML (nvidia-ml-py, the `nvidia` extra): per GPU utilization, power, the total
energy counter and memory used.

NVML's facts that shape the numbers: utilization is averaged by the driver over 1/6 s to 1 s;
`nvmlDeviceGetPowerUsage` is a 1 s moving average on Ampere and newer (but GA100), so it is recorded as
`gpuN_power_avg_mw` and never integrated over a step; the instantaneous power is the field
NVML_FI_DEV_POWER_INSTANT (`nvmlDeviceGetFieldValues`, as Zeus reads it), recorded as `gpuN_power_mw` where
the driver gives it; the total-energy counter (mJ, Volta and newer) updates about every 100 ms, so energy
over a step is taken from its deltas where it resolves the step (docs/measurement.md). Jetson GPUs answer
NOT_SUPPORTED: a field the GPU does not support is left out, and a GPU that supports none makes the sensor
unavailable.

Which GPUs: with `job_uuids` (the runner passes torch's UUID of the training device) only the job's GPU is
read; `other_gpus: true` records the others beside it (never counted). Under MIG torch's UUID is the
instance's: the instance is matched through `nvmlDeviceGetMigDeviceHandleByIndex`; NVML gives no
per-instance power or energy, so the whole GPU's is recorded but not counted, and the summary says why.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

from mtbench.sampling.sensor import (
    COUNTER, ENERGY, GAUGE, GPU_UTIL, POWER, POWER_AVG, Field, Sensor, SensorUnavailable)

NVML_FI_DEV_POWER_INSTANT = 186  # nvml.h; older nvidia-ml-py releases lack the constant
NVML_DEVICE_ARCH_AMPERE = 7
MAX_MIG_SLOTS = 7
# each reading's documented update period (Field resolution keywords; sampling/resolution.py)
UTIL_RESOLUTION = {"resolution_s": 1.0, "resolution_how": "documented",
                   "resolution_note": "nvmlDeviceGetUtilizationRates: the busy share of the last sample period, "
                                      "1/6 s to 1 s by product, the longest taken"}
INSTANT_RESOLUTION = {"resolution_s": 0.1, "resolution_how": "documented",
                      "resolution_note": "NVML_FI_DEV_POWER_INSTANT: the mean of 25 ms sampled in every 100 ms, "
                                         "refreshed every 100 ms (A100/H100, Yang et al. SC'24)"}
AVERAGE_RESOLUTION = {"resolution_s": 1.0, "resolution_how": "documented",
                      "resolution_note": "nvmlDeviceGetPowerUsage: a 1 s moving average"}
ENERGY_RESOLUTION = {"resolution_s": 0.1, "resolution_how": "documented",
                     "resolution_note": "nvmlDeviceGetTotalEnergyConsumption: refreshed about every 100 ms"}


class _NotGiven(Exception):
    """A field value whose own nvmlReturn is not NVML_SUCCESS (the call itself succeeded)."""


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError:
        raise SensorUnavailable("pynvml is not installed (pip install 'mtbench[nvidia]' adds nvidia-ml-py)") from None
    return pynvml


def normalize_uuid(uuid: Any) -> str:
    """NVML's "GPU-8f3c..." / "MIG-..." and torch's bare "8f3c..." as one form: no prefix, lower case."""
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    text = text.strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            return text[len(prefix):]
    return text


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSensor(Sensor):
    """The job's GPU (or every GPU NVML sees when no `job_uuids` are given, or `indices`)."""

    name = "nvml"

    def __init__(self, indices: Optional[Sequence[int]] = None, job_uuids: Optional[List[str]] = None,
                 other_gpus: bool = False) -> None:
        nv = self.nv = _import_pynvml()
        self.errors: Tuple[type, ...] = (nv.NVMLError, _NotGiven)
        try:
            nv.nvmlInit()
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            raise SensorUnavailable(f"NVML did not start: {exc}") from None
        try:
            self._open(count, indices, job_uuids, bool(other_gpus))
        except BaseException:
            self._shutdown()
            raise

    def _mig_instances(self, h: Any) -> List[Tuple[int, Any, str]]:
        """[(slot, handle, uuid)] of a MIG-enabled GPU's instances; [] when MIG is off or not supported."""
        nv = self.nv
        try:
            current = nv.nvmlDeviceGetMigMode(h)[0]
            if current != getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1):
                return []
            slots = nv.nvmlDeviceGetMaxMigDeviceCount(h)
        except (nv.NVMLError, AttributeError):
            return []
        out = []
        for j in range(min(int(slots), MAX_MIG_SLOTS)):
            try:  # an empty slot answers NOT_FOUND
                m = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                out.append((j, m, normalize_uuid(nv.nvmlDeviceGetUUID(m))))
            except nv.NVMLError:
                continue
        return out

    def _open(self, count: int, indices: Optional[Sequence[int]], job_uuids: Optional[List[str]],
              other_gpus: bool) -> None:
        nv = self.nv
        wanted = list(range(count)) if indices is None else [int(i) for i in indices]
        job = None if job_uuids is None else {normalize_uuid(u) for u in job_uuids}
        gpus = []  # (index, handle, uuid, MIG instances of the job on it)
        for i in wanted:
            if not 0 <= i < count:
                raise SensorUnavailable(f"GPU index {i} not present; NVML sees {count} GPU(s)")
            try:  # no permission, a GPU fallen off the bus: the sensor is unavailable, the job goes on
                h = nv.nvmlDeviceGetHandleByIndex(i)
                uuid = normalize_uuid(nv.nvmlDeviceGetUUID(h))
            except nv.NVMLError as exc:
                raise SensorUnavailable(f"NVML cannot open GPU {i}: {type(exc).__name__}: {exc}") from None
            migs = [m for m in self._mig_instances(h) if job is not None and m[2] in job] if job else []
            gpus.append((i, h, uuid, migs))
        matched = job is None or any(uuid in job or migs for _, _, uuid, migs in gpus)
        if job is not None and matched and not other_gpus:
            gpus = [g for g in gpus if g[2] in job or g[3]]
        if job is not None and not matched and not other_gpus:
            raise SensorUnavailable(
                f"no GPU NVML sees has a UUID in job_uuids ({', '.join(sorted(job))}); NVML sees "
                f"{', '.join(g[2] for g in gpus)} (sampler.options.nvml.other_gpus=true records them anyway)")
        self.job_gpus = [i for i, _, uuid, _ in gpus if job is None or uuid in job]
        self._fields: List[Field] = []
        self._readers: List[Tuple[Callable[[], Any], Callable[[Any], float]]] = []
        for i, h, uuid, migs in gpus:
            counted = job is None or uuid in job
            if job is None:
                note = f"every GPU NVML sees counts ({len(gpus)}): no job_uuids given"
            elif counted:
                note = f"the job's GPU (uuid {uuid})"
            elif migs:
                note = (f"gpu{i} is split into MIG instances and the job runs on instance "
                        f"{', '.join(m[2] for m in migs)}: NVML gives no per-instance power or energy, so the "
                        f"whole GPU's is recorded and not counted")
            elif matched:
                note = f"gpu{i} (uuid {uuid}) is not the job's GPU"
            else:
                note = (f"no GPU NVML sees has a UUID in job_uuids ({', '.join(sorted(job))}); "
                        f"NVML sees {', '.join(g[2] for g in gpus)}")
            self._add_gpu(i, h, counted, note)
            for j, m, m_uuid in migs:
                self._try(Field(f"gpu{i}_mig{j}_mem_used_bytes", GAUGE, "gpu_mem", f"{i}/mig{j}",
                                note=f"the job's MIG instance (uuid {m_uuid})"),
                          lambda m=m: nv.nvmlDeviceGetMemoryInfo(m), lambda v: float(v.used))
        if not self._fields:
            raise SensorUnavailable("NVML answers NOT_SUPPORTED for every field on every GPU (as on Jetson)")

    def _add_gpu(self, i: int, h: Any, counted: bool, note: str) -> None:
        nv, rail = self.nv, f"gpu{i}"
        # each value is the busy share of the sample period before its renewal: read back to the previous change
        self._try(Field(f"gpu{i}_util_pct", GAUGE, GPU_UTIL, str(i), job=counted, note=note, window_mean=True,
                        **UTIL_RESOLUTION),
                  lambda: nv.nvmlDeviceGetUtilizationRates(h), lambda v: float(v.gpu))
        average = self._power_usage_is_average(h)
        instant = self._try(Field(f"gpu{i}_power_mw", GAUGE, POWER, rail, 1e-3, total=counted, job=counted,
                                  window_mean=True, note=note, **INSTANT_RESOLUTION), lambda: self._instant_mw(h),
                            float)
        if average:
            self._try(Field(f"gpu{i}_power_avg_mw", GAUGE, POWER_AVG, rail, 1e-3, job=counted,
                            note="nvmlDeviceGetPowerUsage: a 1 s moving average on this GPU (Ampere and newer "
                                 "but GA100); recorded, never integrated over a step", **AVERAGE_RESOLUTION),
                      lambda: nv.nvmlDeviceGetPowerUsage(h), float)
        elif not instant:  # Volta, Turing, GA100: the reading is the power now
            self._try(Field(f"gpu{i}_power_mw", GAUGE, POWER, rail, 1e-3, total=counted, job=counted, note=note),
                      lambda: nv.nvmlDeviceGetPowerUsage(h), float)
        self._try(Field(f"gpu{i}_energy_mj", COUNTER, ENERGY, rail, 1e-3, total=counted, job=counted, note=note,
                        **ENERGY_RESOLUTION),
                  lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h), float)
        self._try(Field(f"gpu{i}_mem_used_bytes", GAUGE, "gpu_mem", str(i), job=counted, note=note),
                  lambda: nv.nvmlDeviceGetMemoryInfo(h), lambda v: float(v.used))

    def _try(self, field: Field, call: Callable[[], Any], convert: Callable[[Any], float]) -> bool:
        """Add the field when the GPU answers it now (NOT_SUPPORTED on Jetson and older GPUs leaves it out)."""
        try:
            convert(call())
        except self.errors:
            return False
        self._fields.append(field)
        self._readers.append((call, convert))
        return True

    def _instant_mw(self, h: Any) -> float:
        fid = getattr(self.nv, "NVML_FI_DEV_POWER_INSTANT", NVML_FI_DEV_POWER_INSTANT)
        value = self.nv.nvmlDeviceGetFieldValues(h, [fid])[0]
        if value.nvmlReturn != getattr(self.nv, "NVML_SUCCESS", 0):
            raise _NotGiven(value.nvmlReturn)
        return float(value.value.uiVal)

    def _power_usage_is_average(self, h: Any) -> bool:
        """nvmlDeviceGetPowerUsage is a 1 s average on Ampere and newer but GA100 (A100, A30); an unknown
        architecture counts as averaged (a null with its reason beats a smeared figure)."""
        try:
            arch = int(self.nv.nvmlDeviceGetArchitecture(h))
            name = _text(self.nv.nvmlDeviceGetName(h))
        except (self.nv.NVMLError, AttributeError, TypeError, ValueError):
            return True
        return arch >= NVML_DEVICE_ARCH_AMPERE and not any(chip in name for chip in ("A100", "A30"))

    def fields(self) -> List[Field]:
        return list(self._fields)

    def read_raw(self) -> List[Optional[float]]:
        out: List[Optional[float]] = []
        for call, convert in self._readers:
            try:
                out.append(convert(call()))
            except self.errors:
                out.append(None)
        return out

    def _shutdown(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except self.nv.NVMLError:
            pass

    def close(self) -> None:
        self._shutdown()
