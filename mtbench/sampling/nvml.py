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


class NvmlSensor(Sensor):
    name = "nvml"

    def __init__(self, indices: Optional[Sequence[int]] = None) -> None:
        nv = self.nv = _import_pynvml()
        try:
            nv.nvmlInit()
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            raise SensorUnavailable(f"NVML did not start: {exc}") from None
        wanted = list(range(count)) if indices is None else [int(i) for i in indices]
        self._fields: List[Field] = []
        self._readers: List[Tuple[Callable[[], Any], Callable[[Any], float]]] = []
        for i in wanted:
            if not 0 <= i < count:
                raise SensorUnavailable(f"GPU index {i} not present; NVML sees {count} GPU(s)")
            h = nv.nvmlDeviceGetHandleByIndex(i)
            rail = f"gpu{i}"
            candidates = [
                (Field(f"gpu{i}_util_pct", GAUGE, GPU_UTIL, str(i)),
                 lambda h=h: nv.nvmlDeviceGetUtilizationRates(h), lambda v: float(v.gpu)),
                (Field(f"gpu{i}_power_mw", GAUGE, POWER, rail, 1e-3, total=True),
                 lambda h=h: nv.nvmlDeviceGetPowerUsage(h), float),
                (Field(f"gpu{i}_energy_mj", COUNTER, ENERGY, rail, 1e-3, total=True),
                 lambda h=h: nv.nvmlDeviceGetTotalEnergyConsumption(h), float),
                (Field(f"gpu{i}_mem_used_bytes", GAUGE, "gpu_mem", str(i)),
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
            nv.nvmlShutdown()
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

    def close(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except self.nv.NVMLError:
            pass
