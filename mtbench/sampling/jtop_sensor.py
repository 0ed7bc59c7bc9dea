"""Jetson telemetry through jetson-stats (`jtop`, the `jetson` extra), when its service is running.

jtop talks to a root service over /run/jtop.sock; without it `jtop()` raises JtopException, and this
sensor is unavailable with the service's message. jtop refreshes at its own interval (its maintainer calls
intervals under 500 ms unstable), and its `ok()` blocks until the next refresh: called from the sampling
loop it would throttle every sensor to jtop's 2 Hz. So this sensor never calls it: an observer attached
to jtop (`attach`, called on jtop's own thread at each refresh) publishes the values, and `read_raw` takes
them without waiting, once per refresh (None between refreshes: the samples carry each value at the time
it arrived, and the gap rule follows jtop's own period). Prefer the `jetson` sensor (direct sysfs) for
per-step energy; this one is for machines where sysfs is not visible.
"""
from __future__ import annotations

import threading
from typing import Any, List, Optional

from mtbench.sampling.jetson import INPUT_RAILS, _rail_key
from mtbench.sampling.sensor import GAUGE, GPU_UTIL, POWER, Field, Sensor, SensorUnavailable


def _rails(client: Any) -> dict:
    power = client.power
    if isinstance(power, tuple):  # jetson-stats 3.x: (total, {rail: {...}})
        power = {"rail": power[1]}
    return (power or {}).get("rail", {}) or {}


def _rail_mw(rail: dict) -> Any:
    """A rail's power now, mW: jetson-stats 4.x names it `power`, 3.x `cur` (both beside the smoothed `avg`,
    which is never used: jtop's avg is (power + old avg) // 2)."""
    value = rail.get("power")
    return rail.get("cur") if value is None else value


class JtopSensor(Sensor):
    name = "jtop"

    def __init__(self, interval_s: float = 0.5) -> None:
        try:
            from jtop import JtopException, jtop
        except ImportError:
            raise SensorUnavailable("jetson-stats is not installed (pip install 'mtbench[jetson]')") from None
        self._lock = threading.Lock()
        self._latest: Optional[List[Optional[float]]] = None  # the last refresh's values
        self._serial = 0  # refreshes published so far
        self._taken = 0  # the serial read_raw last returned
        self.rails: List[str] = []
        try:
            self.client: Any = jtop(interval=interval_s)
            self.client.start()  # connects and takes the first refresh (raises without the service)
        except JtopException as exc:
            raise SensorUnavailable(f"jtop service did not answer: {exc}") from None
        self.rails = sorted(_rails(self.client))
        has_input = any(r in INPUT_RAILS for r in self.rails)
        self._fields = [Field(f"jtop_{_rail_key(r)}_power_mw", GAUGE, POWER, r, 1e-3,
                              total=(r in INPUT_RAILS) if has_input else True) for r in self.rails]
        self._fields.append(Field("jtop_gpu_util_pct", GAUGE, GPU_UTIL, "0"))
        self._publish(self.client)  # the values jtop has now, then every refresh on jtop's thread
        self.client.attach(self._publish)

    def _publish(self, client: Any) -> None:
        """jtop's observer: runs on jtop's thread at each refresh; never blocks the sampler."""
        try:
            rails = _rails(client)
            out: List[Optional[float]] = []
            for r in self.rails:
                value = _rail_mw(rails.get(r) or {})
                out.append(None if value is None else float(value))
            gpu = (client.stats or {}).get("GPU")
            out.append(None if gpu is None or isinstance(gpu, str) else float(gpu))
        except Exception:  # a malformed refresh is a gap, never an exception on jtop's thread
            return
        with self._lock:
            self._latest = out
            self._serial += 1

    def fields(self) -> List[Field]:
        return list(self._fields)

    def read_raw(self) -> Optional[List[Optional[float]]]:
        """The values of a refresh not yet returned, else None (nothing new since the last sample)."""
        with self._lock:
            if self._serial == self._taken or self._latest is None:
                return None
            self._taken = self._serial
            return list(self._latest)

    def close(self) -> None:
        try:
            self.client.detach(self._publish)
        except Exception:
            pass
        self.client.close()
