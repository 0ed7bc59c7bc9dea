"""CPU busy ticks per core, a process's (or process tree's) CPU ticks and RSS, and the system memory in use,
from procfs.

/proc/stat counts in USER_HZ ticks (100 per second): one 5 ms sample of one core reads 0 or 100 %, so
per-core utilization is only meaningful as a tick delta over a window (a step, or >= 50 ms); the sampler
keeps the cumulative counters and the aggregation differences them at the window edges.

What one sample costs is the training's loss (the sampler preempts it 200 times a second), and it is the
kernel's work more than Python's: each file read costs about as much as the wake-up itself (the figures:
docs/benchmarks.md "Figures behind design choices"). So a single process's CPU time comes from its
CPU clock (clock_gettime on the process's clock id: one call, ns, all threads) rather than from formatting the
52 fields of /proc/<pid>/stat, and only the heads of /proc/stat and /proc/meminfo that are parsed are kept.

The files and their parsers are procfs_files' (their names are read from here too); this module keeps the sensor
and the process-tree ledger (reaps, zombies, reparenting: each rule a tested kernel case).
"""
from __future__ import annotations

import os
import time
from typing import Dict, List, Optional, Tuple, Union

from mtbench.sampling.procfs_files import (PAGE_SIZE, PID_FILE_BYTES, USER_HZ, _cpu_clock, _head_size,  # noqa: F401
                                           _line_end, _ProcFiles, _read, _whole_lines, parse_anon, parse_meminfo,
                                           parse_proc, parse_proc_stat, parse_rss, parse_stat)
from mtbench.sampling.sensor import COUNTER, GAUGE, Field, Sensor, SensorUnavailable

class _Owed:
    """Ticks of a vanished tree member that an ancestor's waited-for ticks (cutime + cstime) show once it reaped it."""
    __slots__ = ("member", "anchor", "base", "ticks", "via")

    def __init__(self, member: int, anchor: int, base: Optional[int], ticks: int, via: Optional[int] = None) -> None:
        self.member = member  # the vanished member
        self.anchor = anchor  # the member whose waited-for ticks grow when the member's time reaches it
        self.base = base  # the anchor's waited-for ticks before that (None: unknown)
        self.ticks = ticks  # the member's last ticks: counted while no anchor's growth shows them
        self.via = via  # the anchor's child it moved up with (None: it is the anchor's own child)


class _TreeLedger:
    """The CPU ticks of a process tree across reads, each counted once.

    Each live member counts its own time plus its waited-for children's (cutime + cstime). A member that vanishes
    (its files fail, or it reads as being released, state X) was reaped: by its parent, whose waited-for ticks
    grow by the member's whole time at once, or by someone outside the tree (its parent exited first and init or
    a subreaper took it; a parent that ignores SIGCHLD): then nobody's ticks show it. So which it was is read from
    the parent's waited-for ticks, not from when the reads happened: the member's last ticks stay counted until
    the parent's have grown by them (a parent is read before its children in each pass, so its reading in the
    pass of the member's last read is the base). A parent that vanishes too hands what it owes up with itself:
    once the grandparent's growth shows the parent, what the parent's final time did not bring along was never
    reaped by it and is kept. Ticks owed by the root's parent (our caller) are kept for good. Not told apart
    (rare): an orphan taken by a subreaper inside the tree, and growth from children never seen.
    """

    # No slack is needed: each field is floored from nanoseconds and a reap adds the child's exact time, so the
    # parent's growth is at least the child's last reading (floor(a + b) >= floor(a) + floor(b))
    SLACK = 0

    def __init__(self) -> None:
        self.gone = 0  # ticks no live member holds any more, kept for good
        self.last: Dict[int, Tuple[int, int, int, bytes]] = {}  # member -> (ticks, ppid, waited-for ticks, state)
        self.base: Dict[int, Optional[int]] = {}  # member -> its parent's waited-for ticks in that same pass
        self.owed: List[_Owed] = []

    @staticmethod
    def _parse(files) -> Optional[Tuple[int, int, int, bytes, int]]:
        """(ticks with the waited-for children's, ppid, the waited-for ticks, state, RSS) of one member."""
        try:
            state, ppid, own, waited = parse_stat(files[0])
            return own + waited, ppid, waited, state, parse_rss(files[1])
        except (IndexError, ValueError):
            return None

    def add_pass(self, procs) -> Optional[int]:
        """One read of the tree, parents first: (member, its files, or None where they failed). Returns the RSS."""
        rss: Optional[int] = None
        vanished: List[int] = []
        read: Dict[int, int] = {}  # member -> its waited-for ticks in this pass
        for key, files in procs:
            parsed = self._parse(files) if files is not None else None
            if files is None or (parsed is not None and parsed[3] in (b"X", b"x")):
                vanished.append(key)
                continue
            if parsed is None:
                continue
            ticks, ppid, waited, state, r = parsed
            self.last[key] = (ticks, ppid, waited, state)
            self.base[key] = read.get(ppid)  # the parent, read before it in this pass, had not reaped it yet
            read[key] = waited
            rss = (rss or 0) + r
        for key in reversed(vanished):  # children before their parents: what a child owes moves up with its parent
            if key not in self.last:
                continue  # never read alive, or already counted as vanished: its time is in its parent's
            ticks, ppid, _, state = self.last.pop(key)
            base = self.base.pop(key, None)
            below = [o for o in self.owed if o.anchor == key]
            self.owed = [o for o in self.owed if o.anchor != key]
            self.owed.append(_Owed(key, ppid, base, ticks))
            # it may have reaped them after its last read (even as a zombie: /proc shows a thread group whose
            # leader exited as Z while its other threads still run and wait): then they reach its parent with it
            self.owed += [_Owed(o.member, ppid, base, o.ticks, via=key) for o in below]
        self._settle(read)
        return rss

    def _settle(self, read: Dict[int, int]) -> None:
        """Drop what a parent read in this pass shows; keep for good what no member's ticks ever will."""
        by_anchor: Dict[int, List[_Owed]] = {}
        for o in self.owed:
            by_anchor.setdefault(o.anchor, []).append(o)
        self.owed = []
        for anchor, entries in by_anchor.items():
            now = read.get(anchor)
            if anchor not in self.last:  # owed outside the tree (the root's parent): for good
                self.gone += sum(o.ticks for o in entries)
                continue
            if now is None:  # its parent was not read in this pass
                self.owed += entries
                continue
            claimed, shown = 0, set()
            # its own children first, then what came up with them (largest first: one growth explains one entry)
            for o in sorted(entries, key=lambda o: (o.via is not None, -o.ticks)):
                if o.base is None:
                    self.gone += o.ticks  # no base to tell by: kept (never seen with its parent read first)
                elif (o.via is None or o.via in shown) and now - o.base - claimed >= o.ticks - self.SLACK:
                    claimed += o.ticks  # the anchor reaped it (or the member it came up with brought it along)
                    shown.add(o.member)
                elif o.via is not None and o.via in shown:
                    self.gone += o.ticks  # the member it came up with was reaped without it: it never reaped it
                else:
                    o.base = now  # a reap adds the whole at once: not reaped yet; from here on the growth shows it
                    self.owed.append(o)

    def add_sample(self, passes) -> List[Optional[float]]:
        """One sample: the sensor's passes over the tree (more than one where members vanished)."""
        rss: Optional[int] = None
        for procs in passes:
            rss = self.add_pass(procs)
        total = self.gone + sum(t for t, _, _, _ in self.last.values()) + sum(o.ticks for o in self.owed)
        return [float(total), float(rss) if rss is not None else None]


def descendants(pid: int, proc_root: str = "/proc") -> Optional[List[int]]:
    """Every descendant of `pid` (children, theirs, ...) from the kernel's lists, /proc/<pid>/task/*/children
    (CONFIG_PROC_CHILDREN); None where a living process has no such files (a kernel without them)."""
    found, stack = [], [pid]
    while stack:
        task_dir = os.path.join(proc_root, str(stack.pop()), "task")
        try:
            for tid in os.listdir(task_dir):
                with open(os.path.join(task_dir, tid, "children"), "rb") as f:
                    kids = [int(c) for c in f.read().split()]
                    found += kids
                    stack += kids
        except FileNotFoundError:
            if os.path.isdir(task_dir):  # the process lives but the kernel has no children files
                return None
        except (OSError, ValueError):
            continue
    return found


class ProcfsSensor(Sensor):
    """Per-core busy/total ticks (counters), the CPU ticks (counter) and RSS (gauge) of one process, and the
    system memory in use (gauge, MemTotal - MemAvailable from /proc/meminfo). One process's CPU ticks come
    from its CPU clock, so they carry the fraction of a tick (the same count /proc/<pid>/stat floors); where
    procfs is not this namespace's /proc, from <proc_root>/<pid>/stat.

    With `tree=True`, of a process and all its descendants: the live ones are found again every
    `TREE_REFRESH` reads, and each member counts its own time plus its waited-for children's (cutime and
    cstime), so a child that lived and was reaped between two scans is counted in its parent. A member that
    is reaped keeps its last ticks until its parent's cutime shows them (see _TreeLedger); the root's last
    reading is kept (its parent is the caller, outside the tree).
    """

    name = "procfs"
    TREE_REFRESH = 20  # reads between scans for new child processes (a scan walks /proc)
    TREE_PASSES = 3  # reads of the tree in one sample at most, while members keep vanishing

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
        self._ledger = _TreeLedger()  # decode's state in tree mode
        self._statm_fd = self._procs[pid or 0].statm_fd
        self._cpu_clock = None if tree else _cpu_clock(proc_root, pid)
        self._reads = 0
        text = _read(self._stat_fd)
        self._cores = [c for c, _, _ in parse_proc_stat(text)]
        if not self._cores:
            raise SensorUnavailable(f"{self._stat_path} lists no cpuN lines")
        # the samples keep the bytes read until the run ends: only the cpu lines of /proc/stat (not its interrupt
        # counts, kilobytes on a Jetson), with room for their numbers to grow a few digits
        end = text.find(b"\nintr")
        self._stat_size = _head_size(end if end >= 0 else len(text), len(self._cores) + 1)
        try:  # kept open and pread like /proc/stat; parsed in decode, after the run
            self._meminfo_fd: Optional[int] = os.open(os.path.join(proc_root, "meminfo"), os.O_RDONLY)
            meminfo = _read(self._meminfo_fd)
            if parse_meminfo(meminfo) is None:
                os.close(self._meminfo_fd)
                self._meminfo_fd = None
            else:  # MemTotal and MemAvailable are among its first lines: read up to the later of them
                end = max(_line_end(meminfo, b"MemTotal:"), _line_end(meminfo, b"MemAvailable:"))
                self._meminfo_size = _head_size(end, meminfo[:end].count(b"\n"))
        except OSError:
            self._meminfo_fd = None
        self._fields = []
        for c in self._cores:
            self._fields.append(Field(f"cpu{c}_busy_ticks", COUNTER, "cpu_busy", str(c)))
            self._fields.append(Field(f"cpu{c}_total_ticks", COUNTER, "cpu_total", str(c)))
        self._fields.append(Field("proc_cpu_ticks", COUNTER, "proc_cpu"))
        self._fields.append(Field("proc_rss_bytes", GAUGE, "proc_rss"))
        if not self.tree:  # the training process's own anonymous memory: training memory (docs/memory.md)
            self._fields.append(Field("proc_anon_bytes", GAUGE, "proc_anon"))
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
        found = descendants(self.pid, self.proc_root)
        return self._descendants_psutil() if found is None else found

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
        """Without `tree`: the head of /proc/stat, the process's CPU time (ns) and statm (None for both once it
        has exited) and the head of /proc/meminfo (None when not read); as few calls as can be, each cheap.
        With `tree`: the cpuN lines of /proc/stat, each watched process's raw files (None: it has exited) and
        /proc/meminfo's bytes (None when not read)."""
        if not self.tree:
            stat = os.pread(self._stat_fd, self._stat_size, 0)
            try:
                cpu = (time.clock_gettime_ns(self._cpu_clock) if self._cpu_clock is not None
                       else os.pread(self._procs[self.pid or 0].stat_fd, PID_FILE_BYTES, 0))
                statm: Optional[bytes] = os.pread(self._statm_fd, PID_FILE_BYTES, 0)
            except OSError:  # the process has exited (its clock is gone: EINVAL; its files: ESRCH)
                cpu = statm = None
            meminfo = os.pread(self._meminfo_fd, self._meminfo_size, 0) if self._meminfo_fd is not None else None
            return stat, cpu, statm, meminfo
        text = _read(self._stat_fd)
        end = text.find(b"\nintr")  # the cpu lines come first; the long interrupt line is not needed
        if self._reads % self.TREE_REFRESH == 0:
            self._refresh_tree()
        self._reads += 1
        # Parents first (the order they were found in). A member that cannot be read any more was reaped: the
        # others are read again, so that its parent's waited-for ticks are read after the reap (the ledger tells
        # from their growth whether the parent reaped it)
        passes: List[List[Tuple[int, Optional[Tuple[bytes, bytes]]]]] = []
        for _ in range(self.TREE_PASSES):
            procs: List[Tuple[int, Optional[Tuple[bytes, bytes]]]] = []
            for key in list(self._procs):
                try:
                    procs.append((key, self._procs[key].read_raw()))
                except OSError:
                    procs.append((key, None))
                    self._procs.pop(key).close()
            passes.append(procs)
            if all(files is not None for _, files in procs):
                break
        meminfo = _read(self._meminfo_fd) if self._meminfo_fd is not None else None
        return (text if end < 0 else text[:end]), passes, meminfo

    def decode(self, raw) -> List[Optional[float]]:
        if self.tree:
            text, passes, meminfo = raw
            process = self._ledger.add_sample(passes)
        else:
            text, cpu, statm, meminfo = raw
            text = _whole_lines(text, self._stat_size)
            meminfo = _whole_lines(meminfo, self._meminfo_size) if meminfo is not None else None
            process = self._process_figures(cpu, statm)
        by_core = {c: (b, t) for c, b, t in parse_proc_stat(text)}
        out: List[Optional[float]] = []
        for c in self._cores:
            # a core taken offline (Jetson power modes do this) disappears from /proc/stat: None, not 0
            out += list(by_core.get(c, (None, None)))
        out += process
        if self._meminfo_fd is not None:
            out.append(parse_meminfo(meminfo) if meminfo is not None else None)
        return out

    @staticmethod
    def _process_figures(cpu: Union[int, bytes, None], statm: Optional[bytes]) -> List[Optional[float]]:
        """[CPU ticks, RSS bytes, anonymous RSS bytes] of the one watched process, from its CPU clock (ns) or stat
        file, and statm."""
        # a zombie (exited, not yet waited for): its CPU time is final and still right, its statm all zeros
        zombie = statm is not None and statm.split()[:1] == [b"0"]
        anon: Optional[int] = None
        try:
            rss: Optional[int] = parse_rss(statm) if statm is not None and not zombie else None
            anon = parse_anon(statm) if statm is not None and not zombie else None
            if isinstance(cpu, bytes):
                ticks: Optional[float] = float(parse_proc(cpu, statm)[0]) if statm is not None else None
            else:  # the CPU clock counts nanoseconds: in ticks, as /proc/<pid>/stat says them, with the fraction
                ticks = cpu * USER_HZ / 1e9 if cpu is not None else None
        except (IndexError, ValueError):
            ticks = rss = anon = None
        return [ticks, rss, anon]

    def close(self) -> None:
        for fd in (self._stat_fd, self._meminfo_fd):
            try:
                if fd is not None:
                    os.close(fd)
            except OSError:
                pass
        for files in self._procs.values():
            files.close()

