"""The one interface every telemetry source implements.

A sensor is opened once (its constructor is the availability probe: it raises SensorUnavailable with the
reason), then read many times from the sampler thread. `read()` must be cheap (it runs every few ms) and
returns one value per field, None where the hardware did not answer this time, never a made-up 0.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import List, Optional, Sequence

GAUGE = "gauge"  # an instantaneous value (watts, percent, bytes): averaged / integrated over time
COUNTER = "counter"  # a cumulative count (ticks, joules): differenced between the edges of a window


class SensorUnavailable(Exception):
    """This source cannot be read on this machine; the message says why."""


@dataclass(frozen=True)
class Field:
    name: str  # column in samples.csv, ending in its unit (`_mw`, `_bytes`, `_ticks`, `_pct`, `_uj`)
    kind: str  # GAUGE or COUNTER
    group: str = ""  # what the field measures, for aggregation: "cpu_busy", "power", "gpu_util", ...
    key: str = ""  # which instance within the group: a core index, a rail name, a GPU index


class Sensor(abc.ABC):
    name: str = "sensor"

    @abc.abstractmethod
    def fields(self) -> List[Field]:
        """The fields `read` returns, in order."""

    @abc.abstractmethod
    def read(self) -> Sequence[Optional[float]]:
        """One value per field; None where the source gave nothing this time."""

    def close(self) -> None:
        """Release files or handles."""
