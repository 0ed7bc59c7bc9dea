"""Memory: the peak of the measured steps, where it goes, board targets and their budgets, the largest batch that fits."""
from __future__ import annotations

from mtbench.memory.peak import PeakMemory, release_memory

__all__ = ["PeakMemory", "release_memory"]
