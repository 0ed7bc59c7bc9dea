"""mtbench: measure deep-learning training (time, utilization, power, energy, peak memory)."""
from __future__ import annotations

__version__ = "0.1.0"
