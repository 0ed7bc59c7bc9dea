"""Memory: the peak of the measured steps, where it goes, board targets and their budgets, the largest batch that fits."""
from __future__ import annotations

from mtbench.memory.peak import (PeakMemory, current_rss_bytes, hold_malloc_to_live_memory, release_memory,
                                 set_cpu_malloc)

__all__ = ["PeakMemory", "current_rss_bytes", "hold_malloc_to_live_memory", "release_memory", "set_cpu_malloc"]
