"""Each job in a process of its own: fork, typed messages from the job, and the summary of a job that died."""
from __future__ import annotations

import ctypes
import logging
import math
import multiprocessing
import os
import re
import signal
import stat
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from omegaconf import DictConfig, OmegaConf

from mtbench.config import JobSpec
from mtbench.device import env, power
from mtbench.device.budget import job_budget
from mtbench.device.oom import is_oom_text
from mtbench.errors import UsageError, describe_error, print_error
from mtbench.job import signals
from mtbench.job.messages import Message
from mtbench.job.run import run_job
from mtbench.results import files as results, live, record
from mtbench.results.reader import UnreadableSummary, read_summary
from mtbench.results.summary import build_summary

log = logging.getLogger("mtbench")

# ---------------------------------------------------------------------------------------------------------
# Each job in a process of its own. The parent holds the sweep: it imports torch but never runs a torch op nor
# touches CUDA (neither CUDA nor GNU OpenMP's thread pool survives a fork), so forking a job is cheap and safe.
# A job that the kernel kills (the OOM killer on a Jetson, whose GPU shares the DRAM), that segfaults or that
# leaves a sticky CUDA error ends only its own process; the parent writes its summary and the sweep goes on.

DIED = "the job's process died before it wrote its results"


def run_isolated(cfg: DictConfig, out_dir: Path, timing: Optional[Dict[str, float]] = None) -> Dict[str, Any]:
    """Run one job in a forked child process and return its summary (the parent writes it if the child died).

    Raises UsageError for a bad value the user gave (nothing written) and KeyboardInterrupt, once the child
    has written its "interrupted" summary, when the user pressed Ctrl-C; signals.Terminated (a KeyboardInterrupt)
    likewise, after its "terminated" summary, when this process got SIGTERM or SIGHUP. A job whose own process
    alone got SIGTERM records "terminated" and returns its summary (a sweep goes on). `timing`, if given, receives
    `wall_s` (this call) and `child_s` (the child's own run, from fork to its last message): their difference
    is what isolation costs a job.
    """
    import torchvision  # noqa: F401 - imported once here rather than in every job's process (no torch op runs)

    wall_start, started_at = time.monotonic(), record.utc_now()
    signals.install_terminate_handlers()  # SIGTERM and SIGHUP raise signals.Terminated here, as Ctrl-C does
    out_dir = Path(out_dir)
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    oom_before = OomKills()
    child = context.Process(target=_child_main, args=(cfg, out_dir, sender, os.getpid()), name="mtbench-job")
    child.start()
    sender.close()
    line = live.LiveLine(f"{cfg.model.name} batch {cfg.batch}", started_s=wall_start)  # progress: a line
    line.watch(child.pid)
    messages: Dict[str, Any] = {}
    interrupted: Optional[KeyboardInterrupt] = None  # what stopped this process, if anything
    alive = True
    while True:
        try:
            line.tick()
            if receiver.poll(0.1):
                with signals.stop_signals_deferred():  # a message is read whole, or the pipe would lose its framing
                    kind, payload = receiver.recv()
                if kind == Message.PROGRESS:
                    line.update(payload)
                    continue
                messages[kind] = payload
            elif not alive:
                break  # it exited and everything it sent has been read
            else:
                alive = child.is_alive()  # one more poll after this, for what it sent just before exiting
        except EOFError:  # the child closed its end: it is about to exit
            child.join()
            break
        except KeyboardInterrupt as exc:
            # Ctrl-C on a terminal (SIGTERM from a scheduler to the job's process group) reaches the child too; a
            # signal sent to this process alone is passed on. The child records "interrupted" ("terminated"),
            # writes its results and exits; this process waits for that (a SIGKILL after a grace time ends both).
            interrupted = exc
            if child.is_alive():
                os.kill(child.pid, signals.stop_signal(exc))
    child.join()
    line.close(None if Message.USAGE in messages else live.outcome(messages.get(Message.SUMMARY)))
    restore_power(cfg, out_dir)
    receiver.close()
    if timing is not None:
        timing.update(wall_s=time.monotonic() - wall_start, child_s=messages.get(Message.CHILD_SECONDS, math.nan))
    if Message.USAGE in messages:
        raise UsageError(messages[Message.USAGE])
    summary = messages.get(Message.SUMMARY)
    if summary is None:
        if isinstance(interrupted, signals.Terminated):
            messages[Message.TERMINATED] = interrupted.signum
        elif interrupted is not None:
            messages[Message.INTERRUPTED] = True
        summary = _summary_of_dead_job(cfg, out_dir, child.exitcode, messages, oom_before.since(child.pid),
                                       started_at)
    if interrupted is not None:
        raise interrupted
    if messages.get(Message.INTERRUPTED):
        raise KeyboardInterrupt
    return summary


def restore_power(cfg: DictConfig, out_dir: Path) -> None:
    """What a dead job's process changed on the device (power.*), put back from the record it wrote first; a job
    without power.* keys changed nothing, and whatever lies in its folder is not read."""
    if not power.asks_any(power.asked(cfg)):
        return
    if power.restore_left(out_dir, power.sysfs_root(cfg)):
        power.say(f"restored the settings the job's process left in place (from {out_dir / power.RECORD})")


def _die_with_parent(parent_pid: int) -> None:
    """A job whose sweep was killed must not train on as an orphan (Linux: PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _child_main(cfg: DictConfig, out_dir: Path, sender, parent_pid: int) -> None:
    _die_with_parent(parent_pid)

    def on_sigint(signum, frame):
        _ignore_stop_signals()  # the first Ctrl-C (or SIGTERM) ends the job; more change nothing
        raise KeyboardInterrupt

    def on_terminate(signum, frame):
        _ignore_stop_signals()
        raise signals.Terminated(signum)

    # a process started with SIGINT ignored (a script's `mtbench ... &` in a shell without job control) keeps
    # ignoring it, as the parent does
    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        signal.signal(signal.SIGINT, on_sigint)
    for signum in (signal.SIGTERM, signal.SIGHUP):  # nohup's ignored SIGHUP stays ignored
        if signal.getsignal(signum) != signal.SIG_IGN:
            signal.signal(signum, on_terminate)
    started = time.monotonic()
    try:
        summary = run_job(cfg, out_dir, notify=lambda kind, payload: sender.send((kind, payload)))
        sender.send((Message.SUMMARY, summary))
    except UsageError as exc:
        sender.send((Message.USAGE, str(exc)))
    except KeyboardInterrupt as exc:
        _ignore_stop_signals()  # its summary is on the way; more Ctrl-C or SIGTERM change nothing
        if isinstance(exc, signals.Terminated):
            sender.send((Message.TERMINATED, exc.signum))
        else:
            sender.send((Message.INTERRUPTED, True))
        try:
            sender.send((Message.SUMMARY, read_summary(out_dir)))
        except UnreadableSummary:
            pass
    except BaseException as exc:  # an error outside the job's own try (e.g. CUDA fails to start): a result too
        sender.send((Message.CRASHED, describe_error(exc)))
        log.debug("job process failed", exc_info=True)
    finally:
        sender.send((Message.CHILD_SECONDS, time.monotonic() - started))
        sender.close()


def _ignore_stop_signals() -> None:
    for signum in signals.STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


KMSG = "/dev/kmsg"  # the kernel log, one record a read (root, or CAP_SYSLOG)
KMSG_MAX_BYTES = 4 * 2**20  # the log's ring buffer is 128 KiB - 1 MiB on these kernels
# The OOM killer's lines naming its victim: 4.9 (L4T 32) says "Out of memory: Kill process 4242 (python3) score 873
# or sacrifice child" and then "Killed process 4242 (python3) total-vm:...", 5.x "Out of memory: Killed process
# 4242 (python3) total-vm:..." ("Memory cgroup out of memory: ..." inside a cgroup)
KMSG_KILL = re.compile(rb"\bKill(?:ed)? process (\d+) \(")
KMSG_KILLED_NAME = re.compile(rb"\bKilled process \d+ \(([^)]*)\)")
NOT_COUNTED = "the OOM killer is possible, this kernel does not count its kills"


def _own_comm() -> Optional[bytes]:
    """This process's name as the kernel gives it (/proc/self/comm, at most 15 bytes)."""
    try:
        with open("/proc/self/comm", "rb") as f:
            return f.read().strip() or None
    except OSError:
        return None


class OomKills:
    """Kills by the kernel's OOM killer while a job ran, from the job's own memory cgroup (v2 memory.events,
    v1 memory.oom_control: each counts the kills of its processes, by the global OOM killer too); only the
    machine-wide count in /proc/vmstat where no cgroup file is readable (then it cannot say whose). Where the
    kernel counts no kills (4.9, L4T 32: oom_kill came in 4.13), the kernel log names the killed pid: its records
    after this object was made are searched for the job's pid (`kmsg_path`, else KMSG, for tests)."""

    def __init__(self, kmsg_path: Optional[str] = None) -> None:
        self.path = _memcg_oom_file()
        self.before = _read_oom_kill(self.path) if self.path else None
        self.machine_before = _read_oom_kill("/proc/vmstat")
        self.kmsg_path = kmsg_path or KMSG
        # the log's last record now (only where the kernel counts no kills): an older kill of a pid that the job's
        # process reuses does not count
        counted = self.before is not None or self.machine_before is not None
        records = None if counted else _read_kmsg(self.kmsg_path)
        self.kmsg_after: Optional[int] = max((seq for seq, _ in records), default=-1) if records is not None else None
        # the job's process name as the kernel logs it (a forked job keeps its parent's): in a container the log
        # names the host's pid, which the job never sees, so a kill of a process of this name logged while the job
        # ran is matched too, and said to be matched so
        self.comm = _own_comm()

    def since(self, pid: Optional[int] = None) -> Dict[str, Any]:
        """{"own": kills in the job's cgroup or None, "machine": kills on the machine or None, "file": ...,
        "counted": whether this kernel counts kills, "kmsg": the log's line naming `pid` as killed, "" where the
        log is read and names none, None where it is not read}"""
        own = _read_oom_kill(self.path) if self.path else None
        machine = _read_oom_kill("/proc/vmstat")
        kmsg: Optional[str] = None
        if pid is not None and self.kmsg_after is not None:
            records = _read_kmsg(self.kmsg_path)
            if records is not None:
                named = [text for seq, text in records
                         if seq > self.kmsg_after and any(int(m) == pid for m in KMSG_KILL.findall(text))]
                # 4.9's "Kill process" names the process chosen; its "Killed process" line the one killed
                named.sort(key=lambda text: b"Killed process" not in text)
                if not named and self.comm:
                    named = [text + b" [matched by the process name and the time: in a container the log names "
                                    b"the host's pid]" for seq, text in records
                             if seq > self.kmsg_after and b"Killed process" in text
                             and any(name == self.comm for name in KMSG_KILLED_NAME.findall(text))]
                kmsg = named[0].decode("utf-8", "replace") if named else ""
        return {"own": None if own is None or self.before is None else own - self.before,
                "machine": None if machine is None or self.machine_before is None else machine - self.machine_before,
                "file": self.path, "counted": self.before is not None or self.machine_before is not None,
                "kmsg": kmsg, "kmsg_file": self.kmsg_path}


def killed_failure(exitcode: int, oom_kills: Dict[str, Any]) -> Dict[str, Any]:
    """The failure of a job whose process a signal ended (`exitcode` < 0): "oom" where the job's cgroup counter
    or the kernel log says the OOM killer did it, else "killed" with what can be said."""
    name = signal_name(-exitcode)
    if exitcode == -signal.SIGKILL and oom_kills.get("own"):
        return {"kind": "oom", "message": f"the job's process was killed by the kernel's OOM killer ({name}; "
                                          f"oom_kill in {oom_kills['file']} rose by {oom_kills['own']} while it ran)"}
    if exitcode == -signal.SIGKILL and oom_kills.get("kmsg"):
        return {"kind": "oom", "message": f"the job's process was killed by the kernel's OOM killer ({name}; the "
                                          f"kernel log {oom_kills['kmsg_file']} says: {oom_kills['kmsg'][:200]})"}
    failure = {"kind": "killed", "message": f"the job's process was killed by signal {-exitcode} ({name})"}
    if exitcode != -signal.SIGKILL or oom_kills.get("own") is not None:
        return failure
    if oom_kills.get("machine"):
        failure["message"] += (f"; the OOM killer killed {oom_kills['machine']} process(es) on this machine "
                               "meanwhile (/proc/vmstat), possibly this one: no cgroup counter says whose")
    elif oom_kills.get("kmsg") == "":
        failure["message"] += f"; the kernel log {oom_kills['kmsg_file']} names no OOM kill of its pid"
    elif oom_kills.get("counted") is False:
        failure["message"] = (f"the job's process was killed by signal {-exitcode} ({name}; {NOT_COUNTED}, and "
                              f"its log {oom_kills.get('kmsg_file')} could not be read)")
    return failure


def _read_kmsg(path: str) -> Optional[List[Tuple[int, bytes]]]:
    """The kernel log's records as (sequence number, text); None where it cannot be read (not root, a container
    without it, a link). /dev/kmsg gives one record a read and EAGAIN at its end; a regular file (tests) its
    lines, in the same "priority,sequence,microseconds,flags;text" form."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    chunks: List[bytes] = []
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISCHR(mode) or stat.S_ISREG(mode)):
            return None
        total = 0
        while total < KMSG_MAX_BYTES:
            try:
                chunk = os.read(fd, 8192)  # a record is at most ~1 KiB: one read, one record
            except BlockingIOError:  # the end of the log
                break
            except BrokenPipeError:  # a record was overwritten while being read: the next one follows
                continue
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    records = []
    for line in b"".join(chunks).split(b"\n"):
        head, sep, text = line.partition(b";")
        fields = head.split(b",")
        if sep and len(fields) >= 3 and fields[1].isdigit():  # continuation lines (" KEY=value") have no ";"-head
            records.append((int(fields[1]), text))
    return records


def _memcg_oom_file() -> Optional[str]:
    """This process's memory cgroup counter file (a forked job stays in its parent's cgroup)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    for _, controllers, path in lines:
        if controllers == "":  # cgroup v2
            candidate = os.path.join("/sys/fs/cgroup", path.lstrip("/"), "memory.events")
        elif "memory" in controllers.split(","):  # cgroup v1
            candidate = os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"), "memory.oom_control")
        else:
            continue
        if _read_oom_kill(candidate) is not None:
            return candidate
    return None


def _read_oom_kill(path: str) -> Optional[int]:
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(b"oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _summary_of_dead_job(cfg: DictConfig, out_dir: Path, exitcode: Optional[int], messages: Dict[str, Any],
                         oom_kills: Dict[str, Any], started_at: Optional[str] = None) -> Dict[str, Any]:
    """The summary of a job whose process ended without sending one, written by the parent."""
    if Message.INTERRUPTED in messages:  # Ctrl-C before the job had anything to write
        failure = signals.failure_of(KeyboardInterrupt())
    elif Message.TERMINATED in messages:  # SIGTERM or SIGHUP before the job had anything to write
        failure = signals.failure_of(signals.Terminated(messages[Message.TERMINATED]))
    elif Message.CRASHED in messages:
        failure = {"kind": "oom" if is_oom_text(messages[Message.CRASHED]) else "error",
                   "message": messages[Message.CRASHED]}
    elif exitcode is not None and exitcode < 0:
        failure = killed_failure(exitcode, oom_kills)
    else:
        failure = {"kind": "error", "message": f"the job's process exited with code {exitcode} before writing its results"}
    spec = JobSpec.from_cfg(cfg)
    started = messages.get(Message.STARTED) or {}
    summary = build_summary(
        model=spec.model, batch_size=spec.batch_size, device=started.get("device", spec.device),
        data=messages.get(Message.DATA, "unknown"), failure=failure, warmup_steps=spec.warmup, durations_s=[],
        figures={}, reasons={}, null_reason=DIED,
        job={
            "target": cfg.get("target", {}).get("name", "none"),
            "budget_bytes": job_budget(cfg)[0],  # as a finished job records it: memory.budget_gb wins
            "sampler": {"interval_ms": cfg.sampler.interval_ms, "samples": 0},
            "env": started.get("env") or env.host(),
            "config": OmegaConf.to_container(cfg, resolve=True),
        })
    record.stamp(summary, started_at)
    try:
        results.write_summary(out_dir, summary)
    except OSError as exc:
        summary["write_error"] = f"{type(exc).__name__}: {exc}"
        print_error(f"the results of this job could not be written to {out_dir}: {exc}")
    return summary


