"""procfs's files as the sampler reads them: the heads of /proc/stat and /proc/meminfo, a pid's stat and statm
(pread on descriptors kept open), a process's CPU clock, and their parsers (no torch)."""
from __future__ import annotations

import os
import time
from typing import List, Optional, Tuple

USER_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
DIGITS_GROWTH = 24  # characters a line of counters may gain over a run (10 numbers, each a digit or two)
PID_FILE_BYTES = 4096  # /proc/<pid>/stat (52 numbers and a name) and statm: pread returns only what is there


def _read(fd: int) -> bytes:
    # procfs files are regenerated on each read from offset 0; pread avoids a separate seek call.
    return os.pread(fd, 1 << 16, 0)


def _cpu_clock(proc_root: str, pid: Optional[int]) -> Optional[int]:
    """The clock that counts the process's CPU time (all its threads, in ns): one system call, against
    /proc/<pid>/stat's formatting of 52 fields. None where procfs is not this namespace's /proc (a host's
    procfs mounted elsewhere: its pids are not ours) or the clock cannot be read: then stat is read."""
    if os.path.realpath(proc_root) != "/proc" or not hasattr(time, "clock_gettime_ns"):
        return None
    # a process's CPU clock id, as clock_getcpuclockid(3) makes it: ~pid << 3 | CPUCLOCK_SCHED
    clock = time.CLOCK_PROCESS_CPUTIME_ID if pid is None else (~pid << 3) | 2
    try:
        time.clock_gettime_ns(clock)
    except OSError:
        return None
    return clock


def _line_end(text: bytes, prefix: bytes) -> int:
    """The offset just past the line of `text` that starts with `prefix` (its newline included)."""
    start = 0 if text.startswith(prefix) else text.find(b"\n" + prefix) + 1
    end = text.find(b"\n", start)
    return len(text) if end < 0 else end + 1


def _head_size(end: int, lines: int) -> int:
    """Bytes to read so that the first `end` bytes of a file, `lines` lines of counters, are still read whole
    after each line's numbers have grown by DIGITS_GROWTH characters (a counter that passes a power of ten)."""
    return end + lines * DIGITS_GROWTH


def _whole_lines(text: bytes, size: int) -> bytes:
    """`text` read with at most `size` bytes, without a last line that the size may have cut."""
    return text[: text.rfind(b"\n") + 1] if len(text) >= size else text


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


class _ProcFiles:
    """/proc/<pid>/stat and statm of one process, kept open."""

    def __init__(self, pid_dir: str) -> None:
        self.stat_fd = os.open(os.path.join(pid_dir, "stat"), os.O_RDONLY)
        try:
            self.statm_fd = os.open(os.path.join(pid_dir, "statm"), os.O_RDONLY)
        except OSError:
            os.close(self.stat_fd)
            raise

    def read_raw(self) -> Tuple[bytes, bytes]:
        """The two files' bytes; OSError once the process has exited."""
        return _read(self.stat_fd), _read(self.statm_fd)

    def close(self) -> None:
        for fd in (self.stat_fd, self.statm_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def parse_stat(stat: bytes) -> Tuple[bytes, int, int, int]:
    """(state, ppid, its own CPU ticks, the CPU ticks of every child it has waited for and theirs) of one process
    from its /proc/<pid>/stat."""
    # the command name in field 2 may contain spaces: split after its closing parenthesis
    rest = stat.rsplit(b")", 1)[1].split()
    # fields 3, 4; utime + stime: 14, 15; cutime + cstime: 16, 17
    return rest[0], int(rest[1]), int(rest[11]) + int(rest[12]), int(rest[13]) + int(rest[14])


def parse_rss(statm: bytes) -> int:
    """Resident bytes of one process from its /proc/<pid>/statm."""
    return int(statm.split()[1]) * PAGE_SIZE


def parse_anon(statm: bytes) -> int:
    """Anonymous resident bytes of one process (RssAnon) from its /proc/<pid>/statm: resident less shared (the
    file-backed and shmem pages), the memory a process owns whatever the page cache holds."""
    fields = statm.split()
    return (int(fields[1]) - int(fields[2])) * PAGE_SIZE


def parse_proc(stat: bytes, statm: bytes) -> Tuple[int, int]:
    """(CPU ticks, RSS bytes) of one process from its /proc/<pid>/stat and statm."""
    return parse_stat(stat)[2], parse_rss(statm)


def parse_meminfo(text: bytes) -> Optional[int]:
    """MemTotal - MemAvailable in bytes (what `free` and tegrastats call used), None without MemAvailable."""
    values = {}
    for line in text.split(b"\n"):
        if line.startswith((b"MemTotal:", b"MemAvailable:")):
            values[line.split(b":")[0]] = int(line.split()[1]) * 1024  # kB
            if len(values) == 2:
                return values[b"MemTotal"] - values[b"MemAvailable"]
    return None
