"""The sampler in a small process of its own, so that no lock of the training process (its GIL) can stall it.

The sampling process is a fresh Python interpreter (started before the job builds its model, not forked: a fork
would share the training's pages copy-on-write) that imports mtbench.sampling and numpy only. It opens the
sensors itself (jtop's client thread and NVML's handles belong to the process that opened them), runs the
`Sampler` loop, and at `stop()` decodes the samples and hands them back in bulk through a socket pair. Step marks
stay in the training process: CLOCK_MONOTONIC is one clock for every process of the machine.

The live line's watts (`latest_power_w()`) never make the training process wait: each call reads the answer
already there (`poll(0)`), sends one ("power",) request if none is outstanding, and returns the newest answer (so
the watts lag by one call). The sampling process's command thread answers at once with
`Sampler.latest_power_w()`, decoding only the samples of the sensors that give the total power.

Its sampling thread asks for the lowest real-time priority (SCHED_FIFO 1), else for nice -10, else runs as it is;
what it got is in `stats()["priority"]`. The loop does little (the sensors' reads, no parsing, no garbage
collection while it samples); decoding at `stop()` runs at normal priority. Why, with the figures:
docs/measurement.md "Why the sampler runs in a process of its own".

A sampling process that dies or stops answering raises `SamplerError`, never a hang and never an empty result.
"""
from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import subprocess
import time
from multiprocessing.connection import Connection
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from mtbench import interpreter
from mtbench.sampling.sampler import LIVE_POWER_MAX_AGE_S, Samples, StepMark
from mtbench.sampling.sensor import SensorUnavailable

READY_TIMEOUT_S = 60.0  # the interpreter's start and the sensors' opening (jtop's first connection takes seconds)
START_TIMEOUT_S = 10.0  # from "start" to the first sample taken
STOP_TIMEOUT_S = 30.0  # from "stop" to the samples sent back: the loop's last read, closing the sensors...
DECODE_S_PER_SAMPLE = 0.001  # ...plus decoding each sample (tens of microseconds; generous under load)
PARENT_CHECK_S = 1.0  # how often an idle sampling process checks that the training process still lives
REALTIME_PRIORITY = 1  # SCHED_FIFO's lowest: above every normal thread, below every real-time one
NICE = -10  # the fallback where real-time is refused (a container's cgroup without real-time bandwidth)
PROCESS_TITLE = "mtbench.sampling.process"  # in the sampling process's command line


class SamplerError(RuntimeError):
    """The sampling process died or stopped answering; the message says which and when."""


class ProcessSampler:
    """Runs a `Sampler` over the sensors `open_sensors(names, options)` opens, in a process of its own, with
    the surface of `Sampler`; procfs watches `pid` (default: this process, the training one).

    The constructor starts the process and opens the sensors there (a sensor named explicitly that is not
    available raises SensorUnavailable here, as `open_sensors` does; `sensor_status` lists each one tried);
    sampling runs between `start()` and `stop()`. `sensors` is empty in this process: the sensors live, and
    are closed, in the sampling process.
    """

    def __init__(self, names: Sequence[str], options: Optional[Dict[str, Dict[str, Any]]] = None,
                 interval_ms: float = 5.0, pid: Optional[int] = None) -> None:
        if not interval_ms > 0:
            raise ValueError(f"interval_ms={interval_ms!r}; allowed: a number > 0")
        self.interval_ms = float(interval_ms)
        self.sensors: list = []
        self.sensor_status: List[dict] = []
        self.marks: List[StepMark] = []
        self.dropped = 0
        self.cpu_time_s: Optional[float] = None  # the sampling process's CPU time while it sampled
        self._samples: Optional[Samples] = None
        self._stats: Optional[dict] = None
        self._error: Optional[SamplerError] = None
        self._started_at: Optional[float] = None
        self._gives_power = False  # the sampling process has a total power rail (told at start)
        self._power: Optional[Tuple[float, Optional[float]]] = None  # the newest answer: (when asked, W or None)
        self._power_asked_s: Optional[float] = None  # when the outstanding ("power",) request was sent (None: none)
        options = {k: dict(v or {}) for k, v in (options or {}).items()}
        options.setdefault("procfs", {}).setdefault("pid", os.getpid() if pid is None else pid)
        self._conn, child_conn = multiprocessing.Pipe(duplex=True)  # a socket pair
        # isolated, with the mtbench this process runs first on its path: never a package in the current folder
        code = f"from {PROCESS_TITLE} import serve; serve({child_conn.fileno()}, {os.getpid()})"
        try:
            self._process = subprocess.Popen(interpreter.python_c(code), pass_fds=[child_conn.fileno()],
                                             stdin=subprocess.DEVNULL)
        finally:
            child_conn.close()  # only the child holds its end now: its death reads as EOF here
        self._send(("open", list(names), options, self.interval_ms), "when asked to open the sensors")
        kind, payload = self._receive(READY_TIMEOUT_S, "while opening the sensors")
        if kind == "unavailable":
            self._finish()
            raise SensorUnavailable(payload)
        if kind != "ready":
            self._fail(f"the sampling process could not open the sensors: {payload}")
        self.sensor_status = payload

    @property
    def pid(self) -> int:
        return self._process.pid

    def start(self) -> "ProcessSampler":
        """Begin sampling; returns once the first sample has been taken."""
        self._send(("start",), "when asked to start")
        kind, payload = self._receive(START_TIMEOUT_S, "while starting")
        if kind != "started":
            self._fail(f"the sampling process did not start: {payload}")
        self._started_at = time.monotonic()
        self._gives_power = bool(payload)
        return self

    def latest_power_w(self) -> Optional[float]:
        """The total power in W as the sampling process's `Sampler.latest_power_w()` gave it, never waiting: reads
        the answers already on the socket, sends a new request if none is outstanding, returns the newest answer.
        It lags by one call: the answer to the request of the previous call (None at the first call). An answer
        is dropped once older than LIVE_POWER_MAX_AGE_S unless it answers the latest request (steps longer than
        that: the watts at the previous step's end); None before start(), after stop(), without a total power
        rail, and once the sampling process is gone (mark_step or stop() says so)."""
        if not self._gives_power or self._started_at is None or self._samples is not None or self._error is not None:
            return None
        now = time.monotonic()
        try:
            while self._conn.poll(0):  # an answer is one small write: whole once any of it is there
                self._keep_power(self._conn.recv())
            latest = self._power_asked_s is None  # nothing outstanding: the newest answer is the latest request's
            if self._power_asked_s is None:
                self._conn.send(("power",))
                self._power_asked_s = now
        except (OSError, EOFError):
            return None
        if self._power is None or not (latest or now - self._power[0] <= LIVE_POWER_MAX_AGE_S):
            return None
        return self._power[1]

    def stop(self) -> Samples:
        """End sampling and return every sample, decoded; SamplerError if the sampling process is gone."""
        if self._samples is not None:
            return self._samples
        self._send(("stop",), "when asked to stop")
        expected = (time.monotonic() - self._started_at) * 1000.0 / self.interval_ms if self._started_at else 0.0
        kind, payload = self._receive(STOP_TIMEOUT_S + DECODE_S_PER_SAMPLE * expected, "while stopping")
        if kind != "samples":
            self._fail(f"the sampling process failed while stopping: {payload}")
        self._samples, self._stats = payload
        self.dropped = self._stats["dropped"]
        self.cpu_time_s = self._stats["cpu_time_s"]
        self._finish()
        return self._samples

    def __enter__(self) -> "ProcessSampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.stop()
        else:
            self._finish()

    def mark_step(self, index: int, start_s: float, end_s: float, warmup: bool = False) -> None:
        # a sampling process that died mid-run ends the job at this step rather than at its end (waitpid: ~µs)
        if self._samples is None and self._process.poll() is not None:
            self._fail("the sampling process died while the job ran")
        self.marks.append(StepMark(index, start_s, end_s, warmup))

    def stats(self) -> dict:
        """As `Sampler.stats()`, the CPU time being the whole sampling process's, plus `mode` and `priority`;
        before the samples came back (the sampling process died) the counts are unknown, the reason in `error`."""
        if self._stats is not None:
            return dict(self._stats, mode="process")
        return {"interval_ms": self.interval_ms, "achieved_interval_ms": {"median": None, "p99": None},
                "samples": 0, "dropped": None, "cpu_time_s": None, "cpu_pct_of_one_core": None, "mode": "process",
                "error": str(self._error) if self._error else "the sampler was not stopped"}

    def close(self) -> None:
        """End the sampling process without its samples (stop() is the way to get them)."""
        self._finish()

    # -- the training process's side of the socket

    def _send(self, message: tuple, when: str) -> None:
        if self._error is not None:
            raise self._error
        try:
            self._conn.send(message)
        except (OSError, EOFError):
            self._fail(f"the sampling process is gone {when}")

    def _receive(self, timeout_s: float, when: str) -> Tuple[str, Any]:
        """The next message but the answers to ("power",) requests (one sent before "stop" is answered first)."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                if self._conn.poll(max(0.0, min(left, 0.2))):  # data, or EOF once the process is gone
                    message = self._conn.recv()
                    if not self._keep_power(message):
                        return message
                    continue
            except (OSError, EOFError):  # it died, perhaps halfway through sending
                self._fail(f"the sampling process died {when}")
            if self._process.poll() is not None:
                self._fail(f"the sampling process died {when}")
            if left <= 0:
                self._fail(f"the sampling process did not answer within {timeout_s:.0f} s {when}")

    def _keep_power(self, message: tuple) -> bool:
        """Keep the answer to the outstanding ("power",) request; False for a message that is no answer."""
        if message[0] != "power":
            return False
        if self._power_asked_s is not None:
            self._power = (self._power_asked_s, message[1])
            self._power_asked_s = None
        return True

    def _fail(self, message: str) -> None:
        try:  # a process that closed its socket by dying is a zombie a moment later: its exit code says how
            code: Optional[int] = self._process.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            code = None
        if code is not None and code < 0:
            message += f" (killed by signal {-code}, {_signal_name(-code)})"
        elif code is not None:
            message += f" (exit code {code})"
        self._error = SamplerError(message)
        self._finish()
        raise self._error

    def _finish(self) -> None:
        """Close the socket and end the sampling process; never raises: a process slow to end on a loaded machine
        (its exit after SIGKILL too) must not turn the job's result into an error."""
        try:
            self._conn.close()  # a sampling process still waiting reads EOF and ends
        except OSError:
            pass
        try:
            self._process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self._process.kill()
            try:
                self._process.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                pass  # killed: the kernel ends it; Popen reaps it at its next poll or when collected


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# -- the sampling process's side

def serve(fd: int, parent_pid: int) -> None:
    """The sampling process's main: open, start, stop as the training process asks through the socket `fd`."""
    # Ctrl-C (and a scheduler's SIGTERM, a closed terminal's SIGHUP) reaches the whole process group: the training
    # process handles it and then stops this one, whose samples the summary still needs
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    from mtbench.sampling import Sampler, open_sensors

    conn = Connection(fd)
    command = _next_command(conn, parent_pid)
    if command is None or command[0] != "open":
        return
    names, options, interval_ms = command[1:]
    try:
        sensors, status = open_sensors(names, options)
    except SensorUnavailable as exc:
        conn.send(("unavailable", str(exc)))
        return
    except Exception as exc:  # noqa: BLE001 - told to the training process, which raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    sampler = Sampler(sensors, interval_ms)
    try:
        conn.send(("ready", status))
        command = _next_command(conn, parent_pid)
        waited_cpu_s = time.thread_time()  # this thread waits (and answers the live line) while the loop samples
        priority = "normal"
        if command is not None and command[0] == "start":
            priority = _raise_priority()  # the loop thread, started next, inherits it
            # nothing here makes reference cycles while it samples: no collector passes over the growing
            # list of samples (each a pause of the loop, and CPU taken from training)
            gc.disable()
            sampler.start()  # returns after the first sample: the first step begins after it
            conn.send(("started", sampler.gives_power))  # without a total power rail nobody asks for it
            command = _next_command(conn, parent_pid, sampler.latest_power_w)
        waited_cpu_s = time.thread_time() - waited_cpu_s
        _normal_priority()  # the decoding (in this thread) need not preempt anyone
        gc.enable()
        samples = sampler.stop()  # joins the loop, then decodes (after the run: not counted as its cost)
        if command is not None and command[0] == "stop":
            stats = sampler.stats()
            # the process's cost while it sampled: the loop thread's CPU and this thread's (waits, answers)
            cpu_s = (sampler.cpu_time_s or 0.0) + waited_cpu_s
            span = float(samples.time_s[-1] - samples.time_s[0]) if len(samples) > 1 else None
            stats.update(cpu_time_s=cpu_s, cpu_pct_of_one_core=100.0 * cpu_s / span if span else None,
                         priority=priority)
            conn.send(("samples", (samples, stats)))
    finally:
        for sensor in sensors:
            try:
                sensor.close()
            except Exception:  # noqa: BLE001 - a sensor that cannot close changes none of the figures
                pass


def _raise_priority() -> str:
    """The calling thread at real-time priority, else at a lower nice; says what it got (and why not more)."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
        return f"SCHED_FIFO {REALTIME_PRIORITY}"
    except (OSError, AttributeError) as exc:  # AttributeError: a platform without the call
        refused = f"SCHED_FIFO refused: {getattr(exc, 'strerror', None) or exc}"
    try:
        os.setpriority(os.PRIO_PROCESS, 0, NICE)  # on Linux: this thread, inherited by the threads it starts
        return f"nice {NICE} ({refused})"
    except (OSError, AttributeError) as exc:
        return f"normal ({refused}; nice {NICE} refused: {getattr(exc, 'strerror', None) or exc})"


def _normal_priority() -> None:
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    except (OSError, AttributeError):
        pass


def _next_command(conn: Connection, parent_pid: int,
                  power_w: Optional[Callable[[], Optional[float]]] = None) -> Optional[tuple]:
    """The next command from the training process; None once it is gone (its end closed, or it died). With
    `power_w` (while sampling) each ("power",) request is answered with ("power", power_w()) and the wait goes on."""
    while True:
        try:
            if conn.poll(PARENT_CHECK_S):
                command = conn.recv()
                if power_w is None or command[:1] != ("power",):
                    return command
                conn.send(("power", _answer(power_w)))
                continue
        except (OSError, EOFError):
            return None
        if os.getppid() != parent_pid:  # orphaned (should another process hold the training process's end)
            return None


def _answer(power_w: Callable[[], Optional[float]]) -> Optional[float]:
    try:
        return power_w()
    except Exception:  # noqa: BLE001 - the line loses its watts; the samples and the sampling go on
        return None
