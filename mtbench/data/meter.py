"""The input pipeline's cost over the measured steps: the loader workers' CPU beside the training process's, and
the bytes the job's processes read from storage.

Workers are the job's children: each one's CPU ticks come from its /proc/<pid>/stat (its own time and its waited-for
children's, parsed by the sampler's procfs reader), read at every batch and once more just before the loader ends
it, so a worker that an epoch's end retires keeps what it used. The training process's CPU is its CPU clock (all its
threads: pin-memory's too). Both over one window: from the end of the last warm-up step (or the first batch) to the
end of the last measured step.
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional, Sequence

from mtbench.data import storage
from mtbench.sampling.procfs import USER_HZ, parse_stat


def _worker_ticks(pid: int, proc_root: str) -> Optional[int]:
    try:
        with open(os.path.join(proc_root, str(pid), "stat"), "rb") as f:
            _, _, own, waited = parse_stat(f.read())
        return own + waited
    except (OSError, IndexError, ValueError):  # gone (reaped), or not a process's stat
        return None


class LoaderMeter:
    """Worker CPU ticks by worker slot, the training process's CPU time and the tree's bytes read, per window."""

    def __init__(self, workers: int, proc_root: str = "/proc") -> None:
        self.workers = workers
        self.proc_root = proc_root
        self.ticks: Dict[int, int] = {}  # worker pid -> its latest CPU ticks
        self.slot: Dict[int, int] = {}  # worker pid -> its worker id (0 .. workers-1)
        self.marks: List[Dict[str, Any]] = []  # readings at step ends: time, process CPU, ticks by slot, warm-up
        self.start_bytes = self._tree_bytes([])  # before the first epoch read anything

    def read_workers(self, pids: Sequence[int]) -> None:
        """Read each live worker's CPU ticks (`pids` by worker id); call it at each batch and before workers end."""
        for slot, pid in enumerate(pids):
            ticks = _worker_ticks(pid, self.proc_root)
            if ticks is not None:
                self.ticks[pid], self.slot[pid] = ticks, slot

    def _by_slot(self) -> List[float]:
        out = [0.0] * self.workers
        for pid, ticks in self.ticks.items():
            out[self.slot[pid]] += ticks / USER_HZ
        return out

    def mark(self, warmup: bool, pids: Sequence[int]) -> None:
        """A reading at the end of a step (or before the first batch)."""
        self.read_workers(pids)
        self.marks.append({"time_s": time.monotonic(), "process_cpu_s": time.process_time(),
                           "workers_cpu_s": self._by_slot(), "warmup": warmup})

    def _tree_bytes(self, pids: Sequence[int]) -> Optional[int]:
        counts = storage.read_bytes([None, *pids], self.proc_root)
        return None if counts[None] is None else sum(v or 0 for v in counts.values())

    def figures(self, pids: Sequence[int], set_bytes: int) -> Dict[str, Any]:
        """The CPU figures over the measured window and the bytes read since the pipeline opened."""
        out: Dict[str, Any] = {}
        measured = [i for i, m in enumerate(self.marks) if not m["warmup"]]
        if not measured or measured[0] == 0:
            out["cpu"] = None
            out["cpu_reason"] = "no measured step ended" if not measured else "no reading before the measured steps"
        else:
            a, b = self.marks[measured[0] - 1], self.marks[measured[-1]]
            window_s = b["time_s"] - a["time_s"]
            per_worker = [100.0 * (y - x) / window_s for x, y in zip(a["workers_cpu_s"], b["workers_cpu_s"])]
            out["cpu"] = {
                "window_s": window_s,
                "training_process_cpu_pct": 100.0 * (b["process_cpu_s"] - a["process_cpu_s"]) / window_s,
                "workers_cpu_pct": sum(per_worker) if self.workers else None,
                "per_worker_cpu_pct": per_worker if self.workers else None,
            }
            if not self.workers:
                out["cpu"]["workers_reason"] = ("data.workers=0: no worker processes; the training process loads "
                                                "and augments (in training_process_cpu_pct)")
        end = self._tree_bytes(pids)
        out["bytes_read"] = None if end is None or self.start_bytes is None else end - self.start_bytes
        out["set_bytes"] = set_bytes
        if out["bytes_read"] is None:
            out["bytes_read_reason"] = f"{self.proc_root}/self/io has no read_bytes (no task I/O accounting)"
        return out
