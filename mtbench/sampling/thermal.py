"""Thermal zones' temperatures and cooling devices' states (throttling) from /sys/class/thermal, and per step.

`sys/class/thermal/thermal_zoneN/{type,temp}`: the zone's name and its temperature in millidegrees Celsius
(Jetson: CPU-therm, GPU-therm, SOC0-therm, ...; a PC: x86_pkg_temp, acpitz). `cooling_deviceN/{type,cur_state,
max_state}`: how hard each cooling device acts, 0 = not at all (a fan's speed level, or a clock cap such as
Jetson's gpu-balanced or cpu-balanced throttling, which lowers the clocks a job gets). Clocks change heat and heat
changes clocks, so a power sweep records both. A zone that cannot be read when the sensor opens (some answer EINVAL
or ENODATA) is left out and named in the sensor's reason list; none readable: the sensor is unavailable.

Reading a zone on a Jetson asks the BPMP firmware: the sensor reads every `every_ms` (100 ms by default), and the
samples in between hold None (not read), never a repeated value.
"""
from __future__ import annotations

import glob
import os
import re
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from mtbench.sampling.sensor import GAUGE, Field, Sensor, SensorUnavailable
from mtbench.sampling.sysfs import AttrFile, parse_int, read_text

ZONE_GLOB = "sys/class/thermal/thermal_zone[0-9]*"
COOLING_GLOB = "sys/class/thermal/cooling_device[0-9]*"
TEMP = "temp"  # gauge; raw millidegrees C, x scale = degrees C
THROTTLE = "throttle"  # gauge; a cooling device's cur_state (0 .. its max_state)


def _key(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_").lower() or "zone"


def _numbered(path: str) -> int:
    digits = re.search(r"(\d+)$", path)
    return int(digits.group(1)) if digits else 0


class ThermalSensor(Sensor):
    name = "thermal"

    def __init__(self, sysfs_root: str = "/", every_ms: float = 100.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        root = str(sysfs_root)
        if not every_ms >= 0:
            raise SensorUnavailable(f"every_ms={every_ms!r}; allowed: a number of milliseconds >= 0")
        self.every_s = float(every_ms) / 1000
        self.clock = clock
        self._next_s = -float("inf")
        self.files: List[AttrFile] = []
        self._fields: List[Field] = []
        self.skipped: List[str] = []  # zones present but unreadable, for the reason list
        seen: Dict[str, int] = {}
        for path in sorted(glob.glob(os.path.join(root, ZONE_GLOB)), key=_numbered):
            name = read_text(os.path.join(path, "type")) or os.path.basename(path)
            self._add(path, "temp", name, seen, lambda key: Field(f"temp_{key}_mc", GAUGE, TEMP, key, 1e-3))
        for path in sorted(glob.glob(os.path.join(root, COOLING_GLOB)), key=_numbered):
            name = read_text(os.path.join(path, "type")) or os.path.basename(path)
            self._add(path, "cur_state", name, seen,
                      lambda key: Field(f"cooling_{key}_state", GAUGE, THROTTLE, key,
                                        note=f"0 = not acting; up to {read_text(os.path.join(path, 'max_state'))}"))
        if not any(f.group == TEMP for f in self._fields):
            self.close()
            why = f" ({'; '.join(self.skipped)})" if self.skipped else ""
            raise SensorUnavailable(f"no readable thermal zone under {os.path.join(root, ZONE_GLOB)}{why}")

    def _add(self, path: str, attr: str, name: str, seen: Dict[str, int], field: Callable[[str], Field]) -> None:
        try:
            attr_file = AttrFile(os.path.join(path, attr))
        except OSError as exc:
            self.skipped.append(f"{os.path.basename(path)}: {exc}")
            return
        if attr_file.read_int() is None:  # a zone whose sensor is off answers EINVAL / ENODATA
            attr_file.close()
            self.skipped.append(f"{os.path.basename(path)} ({name}): {attr} gives no number")
            return
        key = _key(name)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:  # two zones of one type (several acpitz): the second gets its number
            key = f"{key}_{_numbered(path)}"
        self.files.append(attr_file)
        self._fields.append(field(key))

    def fields(self) -> List[Field]:
        return list(self._fields)

    def read_raw(self) -> List[Optional[bytes]]:
        now = self.clock()
        if now < self._next_s:
            return [None] * len(self.files)
        self._next_s = now + self.every_s
        return [f.read_bytes() for f in self.files]

    def decode(self, raw: Sequence[Optional[bytes]]) -> List[Optional[float]]:
        values = [parse_int(r) for r in raw]
        return [None if v is None else float(v) for v in values]

    def close(self) -> None:
        for f in self.files:
            f.close()


def step_columns(samples, marks) -> Tuple[List[str], List[list]]:
    """steps.csv's thermal columns, one list per mark: each zone's mean temperature in degrees C over the step
    (`temp_c_<zone>`) and each cooling device's highest state in it (`throttle_<device>`). A step shorter than the
    sensor's period holds no reading of its own: it gets the last reading before its end (the temperature then)."""
    fields = [f for f in samples.fields if f.group in (TEMP, THROTTLE)]
    header = [f"temp_c_{f.key}" if f.group == TEMP else f"throttle_{f.key}" for f in fields]
    rows: List[list] = []
    for m in marks:
        row: List[Optional[float]] = []
        for f in fields:
            column = samples.columns[f.name]
            known = ~np.isnan(column)
            inside = column[known & (samples.time_s >= m.start_s) & (samples.time_s <= m.end_s)]
            if len(inside):
                value = float(inside.mean() if f.group == TEMP else inside.max())
            else:
                before = column[known & (samples.time_s <= m.end_s)]
                value = float(before[-1]) if len(before) else None
            row.append(None if value is None else round(value * f.scale, 3))
        rows.append(row)
    return header, rows
