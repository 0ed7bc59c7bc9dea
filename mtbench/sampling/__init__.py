"""Telemetry: sensors, the sampling thread and per-window aggregation. Imports no torch."""
from __future__ import annotations

import importlib
from typing import Any, Dict, List, Sequence, Tuple

from mtbench.sampling.sampler import Samples, Sampler, StepMark
from mtbench.sampling.sensor import Field, Sensor, SensorUnavailable

# name -> "module:Class"; `auto` probes them in this order.
SENSORS: Dict[str, str] = {
    "procfs": "mtbench.sampling.procfs:ProcfsSensor",
    "jetson": "mtbench.sampling.jetson:JetsonSensor",
    "jtop": "mtbench.sampling.jtop_sensor:JtopSensor",
    "nvml": "mtbench.sampling.nvml:NvmlSensor",
    "rapl": "mtbench.sampling.rapl:RaplSensor",
    "thermal": "mtbench.sampling.thermal:ThermalSensor",
}

# under `auto`, a sensor that would read the same hardware as one already open is skipped
AUTO_SKIP_IF = {"jtop": "jetson"}


def open_sensors(names: Sequence[str], options: Dict[str, Dict[str, Any]]) -> Tuple[List[Sensor], List[dict]]:
    """Open the named sensors ("auto" = every known one that is available).

    Returns the open sensors and one status entry per sensor tried: {name, available, reason, fields}.
    A sensor named explicitly that is unavailable raises SensorUnavailable (the user asked for it);
    under "auto" it is only listed with its reason.
    """
    auto = list(names) == ["auto"]
    wanted = list(SENSORS) if auto else list(names)
    opened: List[Sensor] = []
    status: List[dict] = []
    for name in wanted:
        if name not in SENSORS:
            raise SensorUnavailable(f"sensor {name!r} is not known; allowed: auto, {', '.join(SENSORS)}")
        if auto and AUTO_SKIP_IF.get(name) in {s.name for s in opened}:
            status.append({"name": name, "available": False, "fields": [],
                           "reason": f"skipped: {AUTO_SKIP_IF[name]} already reads the same hardware"})
            continue
        module, cls = SENSORS[name].split(":")
        try:
            sensor = getattr(importlib.import_module(module), cls)(**options.get(name, {}))
        except SensorUnavailable as exc:
            if not auto:
                raise SensorUnavailable(f"sensor {name}: {exc}") from None
            status.append({"name": name, "available": False, "reason": str(exc), "fields": []})
            continue
        opened.append(sensor)
        status.append({"name": name, "available": True, "reason": None, "fields": [f.name for f in sensor.fields()]})
    return opened, status


__all__ = ["Field", "Sampler", "Samples", "Sensor", "SensorUnavailable", "StepMark", "SENSORS", "open_sensors"]
