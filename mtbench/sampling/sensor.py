"""The one interface every telemetry source implements.

A sensor is opened once (its constructor is the availability probe: it raises SensorUnavailable with the
reason), then read many times from the sampler thread. `read()` must be cheap (it runs every few ms) and
returns one value per field, None where the hardware did not answer this time, never a made-up 0.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

GAUGE = "gauge"  # an instantaneous value (watts, percent, bytes): averaged / integrated over time
COUNTER = "counter"  # a cumulative count (ticks, joules): differenced between the edges of a window


class SensorUnavailable(Exception):
    """This source cannot be read on this machine; the message says why."""


@dataclass(frozen=True)
class Field:
    name: str  # column in samples.csv, ending in its unit (`_mw`, `_bytes`, `_ticks`, `_pct`, `_uj`)
    kind: str  # GAUGE or COUNTER
    group: str = ""  # what it measures, for aggregation: "cpu_busy", "power", "energy", "gpu_util", ...
    key: str = ""  # which instance within the group: a core index, a rail name, a GPU index
    scale: float = 1.0  # raw value x scale = SI unit of the group (W for power, J for energy, % for util)
    total: bool = False  # a rail that counts toward total energy (a board's input rail, a whole GPU);
    # sub-rails that lie inside another rail (TX2's VDD_SYS_GPU inside VDD_IN) are False
    job: bool = True  # False: a device the job does not run on (another GPU): recorded, never in the job's figures
    window_mean: bool = False  # a gauge whose each new value is the mean since its previous update (a sensor
    # that averages over its refresh period, e.g. NVML's instantaneous power): the value seen first at a
    # change covers the time back to the change before it, not the time after it
    note: str = ""  # how this field enters the job's figures, said in the summary (e.g. "every GPU NVML sees")
    # the source's update period where the device says it ("device": hwmon's update_interval) or its documented
    # behaviour fixes it ("documented": NVML's 100 ms instant power); None: learned from the samples
    # (sampling/resolution.py)
    resolution_s: Optional[float] = None
    resolution_how: str = ""
    resolution_note: str = ""  # where the period comes from, in words


# the groups the summary aggregates, and their SI units after `scale`
POWER = "power"  # gauge, W
ENERGY = "energy"  # counter, J
GPU_UTIL = "gpu_util"  # gauge, %
# gauge, W: a reading the source averages over a window longer than a step (NVML's 1 s power average):
# recorded in samples.csv, never integrated into a step's energy
POWER_AVG = "power_avg"


class Sensor(abc.ABC):
    name: str = "sensor"

    @abc.abstractmethod
    def fields(self) -> List[Field]:
        """The fields `read` returns, in order."""

    # The sampler thread calls read_raw() every interval and decode() on each result, in order, once the
    # run is over. A sensor whose parsing is costly returns raw bytes from read_raw() and parses them in
    # decode(), so the parsing leaves the sampling loop; others return their values from read_raw() and
    # keep decode() as it is here.
    @abc.abstractmethod
    def read_raw(self) -> Any:
        """What the source gives now, raw or already as values."""

    def decode(self, raw: Any) -> Sequence[Optional[float]]:
        """One value per field from a read_raw() result; None where the source gave nothing."""
        return raw

    def read(self) -> Sequence[Optional[float]]:
        """One value per field now (read_raw and decode in one call)."""
        return self.decode(self.read_raw())

    def close(self) -> None:
        """Release files or handles."""
