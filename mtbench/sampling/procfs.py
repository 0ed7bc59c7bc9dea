"""CPU busy ticks per core, and a process's CPU ticks and RSS, from procfs.

/proc/stat counts in USER_HZ ticks (100 per second): one 5 ms sample of one core reads 0 or 100 %, so
per-core utilization is only meaningful as a tick delta over a window (a step, or >= 50 ms); the sampler
keeps the cumulative counters and the aggregation differences them at the window edges.
"""
from __future__ import annotations

import os
from typing import List, Optional, Sequence

from mtbench.sampling.sensor import COUNTER, GAUGE, Field, Sensor, SensorUnavailable

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _read(fd: int) -> bytes:
    # procfs files are regenerated on each read from offset 0; pread avoids a separate seek call.
    return os.pread(fd, 1 << 16, 0)


def parse_proc_stat(text: bytes) -> List[tuple]:
    """[(core_index, busy_ticks, total_ticks)] for each `cpuN` line of /proc/stat."""
    cores = []
    for line in text.split(b"\n"):
        if not line.startswith(b"cpu") or line.startswith(b"cpu "):
            continue
        parts = line.split()
        values = [int(v) for v in parts[1:9]]
        # user nice system idle iowait irq softirq steal (guest time is already inside user/nice)
        user, nice, system, idle, iowait, irq, softirq, steal = values + [0] * (8 - len(values))
        busy = user + nice + system + irq + softirq + steal
        cores.append((int(parts[0][3:]), busy, busy + idle + iowait))
    return cores


class ProcfsSensor(Sensor):
    """Per-core busy/total ticks (counters), and the CPU ticks (counter) and RSS (gauge) of one process."""

    name = "procfs"

    def __init__(self, proc_root: str = "/proc", pid: Optional[int] = None) -> None:
        self._stat_path = os.path.join(proc_root, "stat")
        pid_dir = os.path.join(proc_root, str(pid) if pid else "self")
        try:
            self._stat_fd = os.open(self._stat_path, os.O_RDONLY)
            self._pid_stat_fd = os.open(os.path.join(pid_dir, "stat"), os.O_RDONLY)
            self._statm_fd = os.open(os.path.join(pid_dir, "statm"), os.O_RDONLY)
        except OSError as exc:
            raise SensorUnavailable(f"cannot open {exc.filename}: {exc.strerror}") from None
        self._cores = [c for c, _, _ in parse_proc_stat(_read(self._stat_fd))]
        if not self._cores:
            raise SensorUnavailable(f"{self._stat_path} lists no cpuN lines")
        self._fields = []
        for c in self._cores:
            self._fields.append(Field(f"cpu{c}_busy_ticks", COUNTER, "cpu_busy", str(c)))
            self._fields.append(Field(f"cpu{c}_total_ticks", COUNTER, "cpu_total", str(c)))
        self._fields.append(Field("proc_cpu_ticks", COUNTER, "proc_cpu"))
        self._fields.append(Field("proc_rss_bytes", GAUGE, "proc_rss"))

    @property
    def cores(self) -> List[int]:
        return list(self._cores)

    def fields(self) -> List[Field]:
        return list(self._fields)

    def read(self) -> Sequence[Optional[float]]:
        out: List[Optional[float]] = []
        by_core = {c: (b, t) for c, b, t in parse_proc_stat(_read(self._stat_fd))}
        for c in self._cores:
            # a core taken offline (Jetson power modes do this) disappears from /proc/stat: None, not 0
            busy, total = by_core.get(c, (None, None))
            out += [busy, total]
        try:
            # the command name in field 2 may contain spaces: split after its closing parenthesis
            rest = _read(self._pid_stat_fd).rsplit(b")", 1)[1].split()
            out.append(int(rest[11]) + int(rest[12]))  # utime + stime, fields 14 and 15
            out.append(int(_read(self._statm_fd).split()[1]) * PAGE_SIZE)
        except (OSError, IndexError, ValueError):  # the process exited
            out += [None, None]
        return out

    def close(self) -> None:
        for fd in (self._stat_fd, self._pid_stat_fd, self._statm_fd):
            try:
                os.close(fd)
            except OSError:
                pass


USER_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
