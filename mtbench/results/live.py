"""The live line of a running job: phase, step k of n, elapsed and ETA, the last step's time, the job's CPU and memory.

Two halves. `ProgressSender` runs in the job's process: the job calls it between steps (never inside a step's
timed window); it sends a `Progress` at each new phase and, within a phase, at most every REFRESH_S, so a step
costs a clock read and an append. `LiveLine` runs in the parent that forked the job: it draws the line on a
terminal (rich, redrawn at most every REFRESH_S from the parent's own poll loop, so that the elapsed time moves
during a long step) or, when stdout is not a terminal, prints one plain line per phase (logs stay clean). The
job's CPU and resident memory come from /proc/<pid> of the job's process, read by the parent: the job does no
work for them. Power (W) is shown where a sensor gives the total power rails: the sender asks the sampler for
the latest total power when it sends, between steps and at most every REFRESH_S. With `sampler.mode=thread` the
sampler decodes the samples taken since it was last asked and answers at once; with `sampler.mode=process` (the
default) the job never waits for the sampling process: it takes the answer to its previous request and sends a
new one, so the watts lag by one refresh (one step where steps are longer) (docs/commands.md, "The live line").
"""
from __future__ import annotations

import atexit
import os
import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Deque, Optional, TextIO

from rich.console import Console
from rich.live import Live
from rich.text import Text

REFRESH_S = 0.25  # the line is redrawn (and a step's progress sent) at most 4 times a second
RECENT_STEPS = 5  # the ETA uses the median of the last steps (the first warm-up step is the slow one)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass
class Progress:
    """Where a job is, as its process sends it (pickled through the job's pipe)."""

    phase: str  # build, warm-up, reference (profile=true's unprofiled steps), measure, breakdown, write
    done: int = 0  # steps done in this phase
    steps: Optional[int] = None  # steps in this phase (None: not a phase of steps)
    last_step_s: Optional[float] = None  # the last step's time (warm-up steps too)
    eta_s: Optional[float] = None  # seconds of steps left in the whole job at `sent_s` (None: not known yet)
    sent_s: float = 0.0  # time.monotonic() when sent (one clock for every process of the machine)
    power_w: Optional[float] = None  # total power now, W (None: no total power rail, or not known yet)


class ProgressSender:
    """The job's side: `phase(name, steps)` at each phase, `step(seconds)` after each step's window closed.
    `power_w` (optional) gives the total power now in W or None; it is asked at most every REFRESH_S."""

    def __init__(self, send: Callable[[Progress], None], total_steps: int, clock: Callable[[], float] = time.monotonic,
                 power_w: Optional[Callable[[], Optional[float]]] = None):
        self._send = send
        self._clock = clock
        self.power_w = power_w
        self._power: Optional[float] = None  # the last answer of power_w ...
        self._power_read = -float("inf")  # ... and when it was asked
        self.total_steps = total_steps  # warm-up + measured (+ reference) steps of the job
        self.steps_done = 0
        self.recent: Deque[float] = deque(maxlen=RECENT_STEPS)
        self.current = Progress("start")
        self._last_sent = -float("inf")

    def phase(self, name: str, steps: Optional[int] = None) -> None:
        self.current = Progress(name, 0, steps, self.current.last_step_s)
        self._emit(self._clock())

    def step(self, seconds: float) -> None:
        self.steps_done += 1
        self.recent.append(seconds)
        self.current.done += 1
        self.current.last_step_s = seconds
        now = self._clock()
        if self.current.done == self.current.steps or now - self._last_sent >= REFRESH_S:
            self._emit(now)

    def _emit(self, now: float) -> None:
        p = self.current
        p.sent_s = now
        p.eta_s = (max(0, self.total_steps - self.steps_done) * statistics.median(self.recent)) if self.recent else None
        self._last_sent = now
        try:
            self._send(Progress(p.phase, p.done, p.steps, p.last_step_s, p.eta_s, p.sent_s, self._power_now(now)))
        except (OSError, EOFError, ValueError):  # the parent is gone: the job's results do not depend on the line
            self._send = lambda progress: None

    def _power_now(self, now: float) -> Optional[float]:
        """The watts to send: asked anew at most every REFRESH_S (a phase's first send may follow a step's)."""
        if self.power_w is not None and now - self._power_read >= REFRESH_S:
            self._power_read = now
            try:
                self._power = self.power_w()
            except Exception:  # noqa: BLE001 - the job's results do not depend on the line
                self._power = None
        return self._power


def outcome(summary: Optional[dict]) -> str:
    """The last plain line's word for how the job ended."""
    if summary is None:
        return "ended without a summary"
    return "done" if summary.get("success") else f"failed ({(summary.get('failure') or {}).get('kind', '?')})"


def seconds_text(s: Optional[float]) -> str:
    if s is None:
        return "?"
    if s < 60:
        return f"{s:.1f} s"
    minutes, s = divmod(int(s), 60)
    return f"{minutes} min {s:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def step_text(s: Optional[float]) -> str:
    return "n/a" if s is None else (f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.3f} s")


def watts_text(w: float) -> str:
    return f"{w:.1f} W"


class ProcessStats:
    """CPU % and resident memory of one process, from /proc/<pid>/stat and statm (the reader's own work)."""

    def __init__(self, pid: int, proc_root: str = "/proc", clock: Callable[[], float] = time.monotonic) -> None:
        self.pid, self.proc_root, self._clock = pid, proc_root, clock
        self._last: Optional[tuple] = None  # (wall s, cpu ticks)
        self.cpu_pct: Optional[float] = None

    def read(self) -> tuple:
        """(CPU % of one core since the previous read or None, resident bytes or None)."""
        try:
            with open(f"{self.proc_root}/{self.pid}/stat", "rb") as f:
                # the command name (field 2) may hold spaces: the fields after its closing parenthesis
                fields = f.read().rsplit(b")", 1)[1].split()
            ticks = int(fields[11]) + int(fields[12])  # utime + stime (fields 14, 15)
            with open(f"{self.proc_root}/{self.pid}/statm", "rb") as f:
                rss_bytes: Optional[int] = int(f.read().split()[1]) * PAGE_BYTES
        except (OSError, IndexError, ValueError):  # the process has ended
            return None, None
        now = self._clock()
        if self._last is not None and now > self._last[0]:
            self.cpu_pct = 100.0 * (ticks - self._last[1]) / CLOCK_TICKS / (now - self._last[0])
        self._last = (now, ticks)
        return self.cpu_pct, rss_bytes


class LiveLine:
    """The parent's side: `update(progress)` for each Progress the job sends, `tick()` from the poll loop, `close()`."""

    def __init__(self, label: str, console: Optional[Console] = None, plain: Optional[TextIO] = None,
                 clock: Callable[[], float] = time.monotonic, started_s: Optional[float] = None) -> None:
        if console is None:
            from mtbench.results.console import console as default_console

            console = default_console
        self.label = label
        self.console = console
        self.terminal = console.is_terminal and plain is None
        self.plain = plain
        self._clock = clock
        self.started_s = clock() if started_s is None else started_s
        self.progress = Progress("start")
        self.stats: Optional[ProcessStats] = None
        self._drawn_s = -float("inf")
        self._live: Optional[Live] = None
        if self.terminal:
            self._live = Live(console=console, auto_refresh=False, transient=True, redirect_stdout=False,
                              redirect_stderr=False)
            self._live.start()
            # rich hides the cursor while the line is drawn: an error that escapes the parent's loop still shows it
            atexit.register(self.close)
            self.tick()

    def watch(self, pid: int) -> None:
        """The job's process, whose CPU and memory the line shows."""
        self.stats = ProcessStats(pid)

    def update(self, progress: Progress) -> None:
        new_phase = progress.phase != self.progress.phase
        self.progress = progress
        if self.terminal:
            self.tick(force=new_phase)
        elif new_phase:
            watts = "" if progress.power_w is None else f", {watts_text(progress.power_w)}"
            self._print_plain(f"{self.phase_text(progress, with_step=False)} ({self.elapsed_text()}{watts})")

    def tick(self, force: bool = False) -> None:
        """Redraw the terminal line when REFRESH_S has passed (or `force`); nothing off a terminal."""
        now = self._clock()
        if self._live is None or (not force and now - self._drawn_s < REFRESH_S):
            return
        self._drawn_s = now
        self._live.update(Text(self.line(now), no_wrap=True, overflow="ellipsis"), refresh=True)

    def close(self, ending: Optional[str] = None) -> None:
        """Erase the terminal line (the job's summary follows); off a terminal, one last line when `ending`."""
        if self._live is not None:
            self._live.stop()
            self._live = None
            atexit.unregister(self.close)
        elif ending and not self.terminal:
            self._print_plain(f"{ending} ({self.elapsed_text()})")

    def elapsed_text(self, now: Optional[float] = None) -> str:
        return f"{seconds_text((now if now is not None else self._clock()) - self.started_s)} elapsed"

    @staticmethod
    def phase_text(p: Progress, with_step: bool = True) -> str:
        if p.steps is None:
            return p.phase
        if not with_step:
            return f"{p.phase}, {p.steps} step{'s' if p.steps != 1 else ''}"
        return f"{p.phase}: step {min(p.done + 1, p.steps)} of {p.steps}" if p.done < p.steps else \
            f"{p.phase}: {p.steps} of {p.steps} steps"

    def line(self, now: float) -> str:
        p = self.progress
        parts = [self.label, self.phase_text(p)]
        time_part = self.elapsed_text(now)
        if p.eta_s is not None and p.steps is not None:  # steps left to run (build and breakdown are not steps)
            time_part += f", ETA {seconds_text(max(0.0, p.eta_s - (now - p.sent_s)))}"
        parts.append(time_part)
        if p.last_step_s is not None:
            parts.append(f"last step {step_text(p.last_step_s)}")
        if p.power_w is not None:
            parts.append(watts_text(p.power_w))
        if self.stats is not None:
            cpu_pct, rss_bytes = self.stats.read()
            if cpu_pct is not None:
                parts.append(f"job CPU {cpu_pct:.0f} %")
            if rss_bytes is not None:
                parts.append(f"RSS {rss_bytes / 2**30:.2f} GiB")
        return "  " + " | ".join(parts)

    def _print_plain(self, text: str) -> None:
        line = f"  {self.label}: {text}"
        if self.plain is not None:
            self.plain.write(line + "\n")
            self.plain.flush()
        else:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)


class WorkProgress:
    """Progress of a command's long work (`mtbench models`' FLOP counts, `mtbench predict`'s traces): a transient
    rich bar on a terminal, one plain line at the start otherwise. `item(label)` before each piece of work."""

    def __init__(self, what: str, total: int, console: Optional[Console] = None, plain: Optional[TextIO] = None):
        if console is None:
            from mtbench.results.console import console as default_console

            console = default_console
        self.what, self.total, self.console, self.plain = what, total, console, plain
        self.started = 0
        self._bar = None
        self._task = None

    def __enter__(self) -> "WorkProgress":
        if self.total <= 0:
            return self
        if self.console.is_terminal and self.plain is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn

            self._bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=self.console, transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.what, total=self.total)
        else:
            text = f"  {self.what}: {self.total} item{'s' if self.total != 1 else ''} ..."
            if self.plain is not None:
                self.plain.write(text + "\n")
                self.plain.flush()
            else:
                self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        return self

    def item(self, label: str) -> None:
        """The next piece of work begins (the previous one is done)."""
        if self._bar is not None:
            self._bar.update(self._task, completed=self.started, description=f"{self.what}: {label}")
        self.started += 1

    def note(self, label: str) -> None:
        """What the current piece of work is doing now (a terminal's bar only)."""
        if self._bar is not None:
            self._bar.update(self._task, description=f"{self.what}: {label}")

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
