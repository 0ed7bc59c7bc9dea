"""NVIDIA GPUs through NVML (nvidia-ml-py, the `nvidia` extra): per GPU utilization, power, the total
energy counter and memory used.

NVML's facts that shape the numbers: utilization is averaged by the driver over 1/6 s to 1 s; power is a
1 s average on Ampere and newer; the total-energy counter (mJ, Volta and newer) updates about every 100 ms,
so energy over a step is taken from its deltas where it exists. Jetson GPUs answer NOT_SUPPORTED: a field
the GPU does not support is left out, and a GPU that supports none makes the sensor unavailable.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

from mtbench.sampling.sensor import COUNTER, ENERGY, GAUGE, GPU_UTIL, POWER, Field, Sensor, SensorUnavailable


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


class NvmlSensor(Sensor):
    """Every GPU NVML sees (or `indices`). With `job_uuids` (the UUIDs of the GPUs the job runs on, e.g.
    torch's `str(torch.cuda.get_device_properties(i).uuid)`) only those count toward the job's energy total
    and GPU utilization; the others are recorded beside them. Without it every GPU counts, and the summary
    says so."""

    name = "nvml"

    def __init__(self, indices: Optional[Sequence[int]] = None, job_uuids: Optional[List[str]] = None) -> None:
        nv = self.nv = _import_pynvml()
        try:
            nv.nvmlInit()
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            raise SensorUnavailable(f"NVML did not start: {exc}") from None
        try:
            self._open(count, indices, job_uuids)
        except BaseException:
            self._shutdown()
            raise

    def _open(self, count: int, indices: Optional[Sequence[int]], job_uuids: Optional[List[str]]) -> None:
        nv = self.nv
        wanted = list(range(count)) if indices is None else [int(i) for i in indices]
        job = None if job_uuids is None else {normalize_uuid(u) for u in job_uuids}
        handles = []
        for i in wanted:
            if not 0 <= i < count:
                raise SensorUnavailable(f"GPU index {i} not present; NVML sees {count} GPU(s)")
            try:  # no permission, a GPU fallen off the bus: the sensor is unavailable, the job goes on
                h = nv.nvmlDeviceGetHandleByIndex(i)
                uuid = normalize_uuid(nv.nvmlDeviceGetUUID(h)) if job is not None else None
            except nv.NVMLError as exc:
                raise SensorUnavailable(f"NVML cannot open GPU {i}: {type(exc).__name__}: {exc}") from None
            handles.append((i, h, uuid))
        matched = job is None or any(uuid in job for _, _, uuid in handles)
        self.job_gpus = [i for i, _, uuid in handles if job is None or uuid in job]
        self._fields: List[Field] = []
        self._readers: List[Tuple[Callable[[], Any], Callable[[Any], float]]] = []
        for i, h, uuid in handles:
            counted = job is None or uuid in job
            if job is None:
                note = f"every GPU NVML sees counts ({len(handles)}): no job_uuids given"
            elif counted:
                note = f"the job's GPU (uuid {uuid})"
            elif matched:
                note = f"gpu{i} (uuid {uuid}) is not the job's GPU"
            else:
                note = (f"no GPU NVML sees has a UUID in job_uuids ({', '.join(sorted(job))}); "
                        f"NVML sees {', '.join(u for _, _, u in handles if u)}")
            rail = f"gpu{i}"
            candidates = [
                (Field(f"gpu{i}_util_pct", GAUGE, GPU_UTIL, str(i), job=counted, note=note),
                 lambda h=h: nv.nvmlDeviceGetUtilizationRates(h), lambda v: float(v.gpu)),
                (Field(f"gpu{i}_power_mw", GAUGE, POWER, rail, 1e-3, total=counted, job=counted, note=note),
                 lambda h=h: nv.nvmlDeviceGetPowerUsage(h), float),
                (Field(f"gpu{i}_energy_mj", COUNTER, ENERGY, rail, 1e-3, total=counted, job=counted, note=note),
                 lambda h=h: nv.nvmlDeviceGetTotalEnergyConsumption(h), float),
                (Field(f"gpu{i}_mem_used_bytes", GAUGE, "gpu_mem", str(i), job=counted, note=note),
                 lambda h=h: nv.nvmlDeviceGetMemoryInfo(h), lambda v: float(v.used)),
            ]
            for field, call, convert in candidates:
                try:
                    convert(call())  # NOT_SUPPORTED (Jetson, older GPUs) leaves the field out
                except nv.NVMLError:
                    continue
                self._fields.append(field)
                self._readers.append((call, convert))
        if not self._fields:
            raise SensorUnavailable("NVML answers NOT_SUPPORTED for every field on every GPU (as on Jetson)")

    def fields(self) -> List[Field]:
        return list(self._fields)

    def read_raw(self) -> List[Optional[float]]:
        out: List[Optional[float]] = []
        for call, convert in self._readers:
            try:
                out.append(convert(call()))
            except self.nv.NVMLError:
                out.append(None)
        return out

    def _shutdown(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except self.nv.NVMLError:
            pass

    def close(self) -> None:
        self._shutdown()
