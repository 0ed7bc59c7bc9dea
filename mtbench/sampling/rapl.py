"""Intel / AMD RAPL energy counters from the powercap sysfs: package, DRAM and psys (platform) where present.

`sys/class/powercap/intel-rapl:N[:M]/energy_uj` counts microjoules and wraps to 0 past
`max_energy_range_uj`; this sensor unwraps it into a monotonic counter. Since Linux 5.10 the files are
readable by root only: without permission the sensor is unavailable with that reason.
"""
from __future__ import annotations

import glob
import os
import re
from typing import List, Optional

from mtbench.sampling.sensor import COUNTER, ENERGY, Field, Sensor, SensorUnavailable
from mtbench.sampling.sysfs import AttrFile, read_text

ZONE_GLOB = "sys/class/powercap/intel-rapl:*"


class _Zone:
    def __init__(self, path: str) -> None:
        self.depth = os.path.basename(path).count(":")  # intel-rapl:0 is a package, intel-rapl:0:1 inside it
        self.counter = AttrFile(os.path.join(path, "energy_uj"))
        self.name = read_text(os.path.join(path, "name")) or os.path.basename(path)
        self.range_uj = int(read_text(os.path.join(path, "max_energy_range_uj")) or 0)
        self.last: Optional[int] = None
        self.offset = 0

    def read_uj(self) -> Optional[float]:
        raw = self.counter.read_int()
        if raw is None:
            return None
        if self.last is not None and raw < self.last:  # wrapped past max_energy_range_uj
            self.offset += (self.range_uj + 1) if self.range_uj else self.last
        self.last = raw
        return float(raw + self.offset)


class RaplSensor(Sensor):
    name = "rapl"

    def __init__(self, sysfs_root: str = "/") -> None:
        paths = sorted(glob.glob(os.path.join(str(sysfs_root), ZONE_GLOB)))
        if not paths:
            raise SensorUnavailable(f"no RAPL zones under {os.path.join(str(sysfs_root), ZONE_GLOB)}")
        self.zones: List[_Zone] = []
        for p in paths:
            try:
                self.zones.append(_Zone(p))
            except OSError as exc:
                raise SensorUnavailable(f"cannot read {exc.filename}: {exc.strerror} "
                                        "(RAPL is root-only since Linux 5.10)") from None
        self._fields = []
        # psys (the platform, where the CPU supports it) contains the packages and the DRAM: it alone is the
        # total; else the packages and DRAM (outside the package) add up. Sub-zones (core, uncore) lie inside
        # a package and never add.
        has_psys = any(z.name == "psys" for z in self.zones)
        for z, p in zip(self.zones, paths):
            rail = f"rapl_{os.path.basename(p).split(':', 1)[1].replace(':', '_')}_{z.name}"
            if has_psys:
                total = z.name == "psys"
            else:
                total = z.depth == 1 or z.name == "dram"
            self._fields.append(Field(f"{re.sub(r'[^A-Za-z0-9_]', '_', rail)}_energy_uj", COUNTER, ENERGY, rail,
                                      1e-6, total=total))

    def fields(self) -> List[Field]:
        return list(self._fields)

    def read_raw(self) -> List[Optional[float]]:
        return [z.read_uj() for z in self.zones]

    def close(self) -> None:
        for z in self.zones:
            z.counter.close()
