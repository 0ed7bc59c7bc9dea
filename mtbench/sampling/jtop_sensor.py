"""Jetson telemetry through jetson-stats (`jtop`, the `jetson` extra), when its service is running.

jtop talks to a root service over /run/jtop.sock; without it `jtop()` raises JtopException, and this
sensor is unavailable with the service's message. jtop refreshes at its own interval (its maintainer calls
intervals under 500 ms unstable), so at 5 ms sampling consecutive samples repeat one value: prefer the
`jetson` sensor (direct sysfs) for per-step energy; this one is for machines where sysfs is not visible.
"""
from __future__ import annotations

from typing import Any, List, Optional

from mtbench.sampling.sensor import GAUGE, GPU_UTIL, POWER, Field, Sensor, SensorUnavailable
from mtbench.sampling.jetson import INPUT_RAILS, _rail_key


class JtopSensor(Sensor):
    name = "jtop"

    def __init__(self, interval_s: float = 0.5) -> None:
        try:
            from jtop import JtopException, jtop
        except ImportError:
            raise SensorUnavailable("jetson-stats is not installed (pip install 'mtbench[jetson]')") from None
        try:
            self.client: Any = jtop(interval=interval_s)
            self.client.start()
        except JtopException as exc:
            raise SensorUnavailable(f"jtop service did not answer: {exc}") from None
        rails = (self.client.power or {}).get("rail", {})
        self.rails = sorted(rails)
        has_input = any(r in INPUT_RAILS for r in self.rails)
        self._fields = [Field(f"jtop_{_rail_key(r)}_power_mw", GAUGE, POWER, r, 1e-3,
                              total=(r in INPUT_RAILS) if has_input else True) for r in self.rails]
        self._fields.append(Field("jtop_gpu_util_pct", GAUGE, GPU_UTIL, "0"))

    def fields(self) -> List[Field]:
        return list(self._fields)

    def read_raw(self) -> List[Optional[float]]:
        if not self.client.ok():
            return [None] * len(self._fields)
        rails = (self.client.power or {}).get("rail", {})
        out: List[Optional[float]] = []
        for r in self.rails:
            value = rails.get(r, {}).get("power")
            out.append(None if value is None else float(value))
        gpu = (self.client.stats or {}).get("GPU")
        out.append(None if gpu is None else float(gpu))
        return out

    def close(self) -> None:
        self.client.close()
