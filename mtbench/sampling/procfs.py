"""CPU busy ticks per core, a process's (or process tree's) CPU ticks and RSS, and the system memory in use,
from procfs.

/proc/stat counts in USER_HZ ticks (100 per second): one 5 ms sample of one core reads 0 or 100 %, so
per-core utilization is only meaningful as a tick delta over a window (a step, or >= 50 ms); the sampler
keeps the cumulative counters and the aggregation differences them at the window edges.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Tuple

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


def parse_proc(stat: bytes, statm: bytes, children: bool = False) -> Tuple[int, int]:
    """(CPU ticks, RSS bytes) of one process from its /proc/<pid>/stat and statm; with `children`, the CPU
    ticks include those of every child it has waited for (and theirs, recursively)."""
    # the command name in field 2 may contain spaces: split after its closing parenthesis
    rest = stat.rsplit(b")", 1)[1].split()
    ticks = int(rest[11]) + int(rest[12])  # utime + stime: fields 14, 15
    if children:
        ticks += int(rest[13]) + int(rest[14])  # cutime + cstime: fields 16, 17
    return ticks, int(statm.split()[1]) * PAGE_SIZE


def parse_meminfo(text: bytes) -> Optional[int]:
    """MemTotal - MemAvailable in bytes (what `free` and tegrastats call used), None without MemAvailable."""
    values = {}
    for line in text.split(b"\n"):
        if line.startswith((b"MemTotal:", b"MemAvailable:")):
            values[line.split(b":")[0]] = int(line.split()[1]) * 1024  # kB
            if len(values) == 2:
                return values[b"MemTotal"] - values[b"MemAvailable"]
    return None


def parse_ppid(stat: bytes) -> int:
    return int(stat.rsplit(b")", 1)[1].split()[1])  # field 4


class _TreeLedger:
    """The CPU ticks of a process tree across samples, each counted once.

    Each live member counts its own time plus its waited-for children's (cutime, cstime). A member that
    vanishes was reaped: its time is now inside its parent's cutime, but only a later read of the parent
    shows it, and the parent may exit first (GNU time reaps its command, prints, exits). So a vanished
    member's last ticks stay counted as pending until its parent is read again (then the parent holds them);
    if the parent vanishes first, they move up to the grandparent with it; once the root (reaped by our
    caller) or a member whose parent is outside the tree vanishes, its ticks and those pending on it are
    kept for good.
    """

    def __init__(self, root_key: int) -> None:
        self.root_key = root_key
        self.gone = 0  # ticks no live member holds any more, kept for good
        self.last: Dict[int, Tuple[int, int]] = {}  # member -> (ticks, ppid) at its last read
        self.pending: Dict[int, Tuple[int, int]] = {}  # vanished member -> (ticks, the parent that reaped it)

    def add_sample(self, procs) -> List[Optional[float]]:
        read: Dict[int, Tuple[int, int]] = {}
        rss, vanished = 0, []
        for key, files in procs:
            if files is None:
                vanished.append(key)
                continue
            try:
                t, r = parse_proc(*files, children=True)
                ppid = parse_ppid(files[0])
            except (IndexError, ValueError):
                continue
            read[key] = (t, ppid)
            rss += r
        self.last.update(read)
        # a parent read after its child vanished (in an earlier sample) holds the child's time in its cutime
        self.pending = {k: v for k, v in self.pending.items() if v[1] not in read}
        for key in vanished:
            ticks, ppid = self.last.pop(key, (0, -1))
            for child, (t, parent) in list(self.pending.items()):
                if parent == key:  # inside this member's ticks once its parent reads them: they move up with it
                    self.pending[child] = (t, ppid)
            self.pending[key] = (ticks, ppid)
            if key == self.root_key or ppid not in self.last:
                for k in [k for k, (_, parent) in self.pending.items() if parent == ppid]:
                    self.gone += self.pending.pop(k)[0]
        live = sum(t for t, _ in read.values())
        total = self.gone + live + sum(t for t, _ in self.pending.values())
        return [float(total), float(rss) if read else None]


class ProcfsSensor(Sensor):
    """Per-core busy/total ticks (counters), the CPU ticks (counter) and RSS (gauge) of one process, and the
    system memory in use (gauge, MemTotal - MemAvailable from /proc/meminfo).

    With `tree=True`, of a process and all its descendants: the live ones are found again every
    `TREE_REFRESH` reads, and each member counts its own time plus its waited-for children's (cutime and
    cstime), so a child that lived and was reaped between two scans is counted in its parent. A member that
    is reaped is dropped without adding its time (its parent's cutime now holds it), except the root, whose
    last reading is kept (its parent is the caller, outside the tree).
    """

    name = "procfs"
    TREE_REFRESH = 20  # reads between scans for new child processes (a scan walks /proc)

    def __init__(self, proc_root: str = "/proc", pid: Optional[int] = None, tree: bool = False) -> None:
        self.proc_root = proc_root
        self._stat_path = os.path.join(proc_root, "stat")
        self.pid = pid
        self.tree = tree
        try:
            self._stat_fd = os.open(self._stat_path, os.O_RDONLY)
            self._procs: Dict[int, _ProcFiles] = {pid or 0: _ProcFiles(os.path.join(proc_root, str(pid) if pid else "self"))}
        except OSError as exc:
            raise SensorUnavailable(f"cannot open {exc.filename}: {exc.strerror}") from None
        self._ledger = _TreeLedger(pid or 0)  # decode's state in tree mode
        self._reads = 0
        self._cores = [c for c, _, _ in parse_proc_stat(_read(self._stat_fd))]
        if not self._cores:
            raise SensorUnavailable(f"{self._stat_path} lists no cpuN lines")
        try:  # kept open and pread like /proc/stat; parsed in decode, after the run
            self._meminfo_fd: Optional[int] = os.open(os.path.join(proc_root, "meminfo"), os.O_RDONLY)
            if parse_meminfo(_read(self._meminfo_fd)) is None:
                os.close(self._meminfo_fd)
                self._meminfo_fd = None
        except OSError:
            self._meminfo_fd = None
        self._fields = []
        for c in self._cores:
            self._fields.append(Field(f"cpu{c}_busy_ticks", COUNTER, "cpu_busy", str(c)))
            self._fields.append(Field(f"cpu{c}_total_ticks", COUNTER, "cpu_total", str(c)))
        self._fields.append(Field("proc_cpu_ticks", COUNTER, "proc_cpu"))
        self._fields.append(Field("proc_rss_bytes", GAUGE, "proc_rss"))
        if self._meminfo_fd is not None:
            self._fields.append(Field("sys_mem_used_bytes", GAUGE, "sys_mem"))

    @property
    def cores(self) -> List[int]:
        return list(self._cores)

    def fields(self) -> List[Field]:
        return list(self._fields)

    def _descendants(self) -> List[int]:
        """Every descendant of the root: from /proc/<pid>/task/*/children where the kernel has it
        (CONFIG_PROC_CHILDREN), else through psutil (which walks all of /proc)."""
        found, stack = [], [self.pid]
        while stack:
            task_dir = os.path.join(self.proc_root, str(stack.pop()), "task")
            try:
                for tid in os.listdir(task_dir):
                    with open(os.path.join(task_dir, tid, "children"), "rb") as f:
                        kids = [int(c) for c in f.read().split()]
                        found += kids
                        stack += kids
            except FileNotFoundError:
                if os.path.isdir(task_dir):  # the process lives but the kernel has no children files
                    return self._descendants_psutil()
            except (OSError, ValueError):
                continue
        return found

    def _descendants_psutil(self) -> List[int]:
        import psutil

        try:
            return [c.pid for c in psutil.Process(self.pid).children(recursive=True)]
        except psutil.Error:
            return []

    def _refresh_tree(self) -> None:
        for pid in self._descendants():
            if pid not in self._procs:
                try:
                    self._procs[pid] = _ProcFiles(os.path.join(self.proc_root, str(pid)))
                except OSError:  # already gone
                    pass

    def read_raw(self):
        """The cpuN lines of /proc/stat, each watched process's raw files (None: it has exited) and
        /proc/meminfo's bytes (None when not read)."""
        text = _read(self._stat_fd)
        end = text.find(b"\nintr")  # the cpu lines come first; the long interrupt line is not needed
        if self.tree and self._reads % self.TREE_REFRESH == 0:
            self._refresh_tree()
        self._reads += 1
        procs: List[Tuple[int, Optional[Tuple[bytes, bytes]]]] = []
        for key in list(self._procs):
            try:
                procs.append((key, self._procs[key].read_raw()))
            except OSError:
                procs.append((key, None))
                if self.tree:  # a tree member that exited is dropped; decode keeps the CPU time it used
                    self._procs.pop(key).close()
        meminfo = _read(self._meminfo_fd) if self._meminfo_fd is not None else None
        return (text if end < 0 else text[:end]), procs, meminfo

    def decode(self, raw) -> List[Optional[float]]:
        text, procs, meminfo = raw
        out: List[Optional[float]] = []
        by_core = {c: (b, t) for c, b, t in parse_proc_stat(text)}
        for c in self._cores:
            # a core taken offline (Jetson power modes do this) disappears from /proc/stat: None, not 0
            busy, total = by_core.get(c, (None, None))
            out += [busy, total]
        if not self.tree:
            ticks, rss, alive = 0, 0, 0
            for _, files in procs:
                try:
                    t, r = parse_proc(*files) if files is not None else (None, None)
                except (IndexError, ValueError):
                    t = None
                if t is not None:
                    ticks, rss, alive = ticks + t, rss + r, alive + 1
            out += [ticks, rss] if alive else [None, None]
        else:
            out += self._ledger.add_sample(procs)
        if self._meminfo_fd is not None:
            out.append(parse_meminfo(meminfo) if meminfo is not None else None)
        return out

    def close(self) -> None:
        for fd in (self._stat_fd, self._meminfo_fd):
            try:
                if fd is not None:
                    os.close(fd)
            except OSError:
                pass
        for files in self._procs.values():
            files.close()


USER_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
