"""Tracer processes forked before any trace: they predict peaks beside this process, one batch each at a time."""
from __future__ import annotations

import multiprocessing
import signal
from typing import Any, Callable, List, Optional, Tuple, Union

from mtbench.errors import UsageError


# a tracer answers at once that it is ready (it runs one small backward first); one that does not is stuck, e.g. on a
# lock another thread held when it was forked
READY_TIMEOUT_S = 120.0


class TraceFailed(Exception):
    """A trace that raised in a tracer process (its type and first line)."""


class TracerDied(Exception):
    """A tracer process that ended before it answered (the OOM killer, a signal)."""


def warm_imports() -> None:
    """Import what a trace imports on first use (torch._dynamo through FakeTensorMode: about a second), so that each
    process forked after it does not import it again. Runs no autograd, so forking stays possible."""
    import importlib

    from mtbench.workload import torch_internals

    for name in ("torch.distributed._tools.mem_tracker", "torch.utils.flop_counter"):  # the trace's counters
        importlib.import_module(name)
    torch_internals.fake_mode()


class Tracers:
    """`count` processes forked now, each with the Predictor `make()` returns in it, that trace (model, batch) peaks.

    Fork them before this process traces anything: a trace runs autograd, after which torch refuses autograd in every
    process that process forks ("Unable to handle autograd's threading in combination with fork-based
    multiprocessing"); where that happened, TracerDied says so. Each tracer is one busy Python thread. `budget` is
    the memory budget of the tracers' target (None: none). A tracer ignores SIGINT (the process that forked it says
    what stopped) and ends when this process closes it or ends. An answer never collected (the caller stopped
    between `send` and `collect`) is read and dropped before the next request: answers never shift to later ones."""

    def __init__(self, make: Callable[[], Any], count: int) -> None:
        self._procs: List[Tuple[Any, Any]] = []
        self._unread: List[int] = [0] * count  # each tracer's answers to requests not collected yet
        self.budget: Optional[int] = None
        context = multiprocessing.get_context("fork")
        try:
            for i in range(count):
                here, there = context.Pipe()
                proc = context.Process(target=_serve, args=(here, there, make), name=f"mtbench-tracer-{i}",
                                       daemon=True)
                proc.start()
                there.close()
                self._procs.append((proc, here))
            answers = [self._receive(i, READY_TIMEOUT_S) for i in range(count)]  # each: its budget, once ready
        except BaseException:
            self.close()
            raise
        for kind, value in answers:
            if kind in ("usage", "died"):
                self.close()
                raise UsageError(value) if kind == "usage" else TracerDied(value)
        self.budget = answers[0][1] if answers else None

    def __len__(self) -> int:
        return len(self._procs)

    def __enter__(self) -> "Tracers":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def send(self, model: str, batches: List[int]) -> None:
        """Ask for the peaks of `batches` (at most one per tracer); `collect` answers them, in the same order."""
        if len(batches) > len(self._procs):
            raise ValueError(f"{len(batches)} batches for {len(self._procs)} tracers")
        for i, batch in enumerate(batches):
            while self._unread[i]:  # an answer the caller did not collect (it stopped between send and collect)
                self._unread[i] -= 1
                self._receive(i)
            try:
                self._procs[i][1].send((model, batch))
            except OSError:  # its end closed: the process has ended
                self._receive(i)  # raises TracerDied with its exit code
            self._unread[i] += 1

    def collect(self, count: int) -> List[Union[int, BaseException]]:
        """The answers to the last `send` of `count` batches: a peak, or TraceFailed where the trace raised.
        Raises UsageError (a bad override the config meets at the first trace) and TracerDied."""
        answers = []
        for i in range(count):
            self._unread[i] -= 1
            answers.append(self._receive(i))
        usage = next((value for kind, value in answers if kind == "usage"), None)
        if usage is not None:
            raise UsageError(usage)
        return [int(value) if kind == "ok" else TraceFailed(value) for kind, value in answers]

    def peaks(self, model: str, batches: List[int]) -> List[Union[int, BaseException]]:
        """The peaks of any number of batches, traced side by side, a tracer's share at a time."""
        out: List[Union[int, BaseException]] = []
        for start in range(0, len(batches), len(self._procs)):
            part = batches[start:start + len(self._procs)]
            self.send(model, part)
            out.extend(self.collect(len(part)))
        return out

    def _receive(self, i: int, timeout_s: Optional[float] = None) -> Tuple[str, Any]:
        proc, conn = self._procs[i]
        if timeout_s is not None and not conn.poll(timeout_s):
            proc.kill()
            raise TracerDied(f"it did not start within {timeout_s:g} s")
        try:
            return conn.recv()
        except EOFError:
            proc.join(10)
            if proc.is_alive():  # its end closed, itself stopped or stuck at its exit
                proc.kill()
                proc.join()
            raise TracerDied(f"its process ended with exit code {proc.exitcode}") from None

    def close(self) -> None:
        for _, conn in self._procs:
            try:
                conn.send(None)  # done
            except OSError:
                pass
            conn.close()
        for proc, _ in self._procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self._procs = []


def side_by_side(here: Callable[[int], Union[int, Exception]], model: str,
                 beside: Optional[Tracers]) -> Callable[[List[int]], List[Union[int, BaseException]]]:
    """maxsearch's peaks of `model`'s batches: the first of each tracer's share traced here (`here(batch)`) while
    the tracers `beside` (None: none) trace the others; a tracer that died (the OOM killer) has its batches traced
    here instead."""
    dead: List[TracerDied] = []

    def peaks(batches: List[int]) -> List[Union[int, BaseException]]:
        if beside is None or dead or len(batches) < 2:
            return [here(b) for b in batches]
        there = batches[1:1 + len(beside)]
        try:
            beside.send(model, there)
            mine: List[Union[int, BaseException]] = [here(batches[0])]
            answers = beside.collect(len(there))
        except TracerDied as exc:
            dead.append(exc)
            return peaks(batches)
        return mine + answers + peaks(batches[1 + len(there):])

    return peaks


def _serve(here: Any, conn: Any, make: Callable[[], Any]) -> None:
    """A tracer process: its budget first ("ready"), then a peak (or why not) for each (model, batch) it is sent;
    None or the other end closed ends it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    here.close()  # this process's copy of the other end: with it open, this one would not see the other end close
    import torch

    try:
        _answer_requests(conn, make, torch)
    except OSError:  # the other process closed its end (it stopped, or gave up on this answer): nothing to tell
        pass
    conn.close()


def _answer_requests(conn: Any, make: Callable[[], Any], torch: Any) -> None:
    try:  # forked after autograd ran in the process that forked it, torch refuses autograd here: say so at once
        x = torch.ones(1, requires_grad=True)
        (x * 2).sum().backward()
    except RuntimeError as exc:
        conn.send(("died", f"torch refuses autograd here ({str(exc).splitlines()[0][:120]})"))
        return
    try:
        predictor = make()
    except UsageError as exc:
        conn.send(("usage", str(exc)))
        return
    conn.send(("ready", predictor.target.memory_budget_bytes))
    while True:
        try:
            request = conn.recv()
        except EOFError:
            break
        if request is None:
            break
        model, batch = request
        try:
            peak = predictor.peak_or_error(model, batch)
        except UsageError as exc:
            conn.send(("usage", str(exc)))
            continue
        if isinstance(peak, Exception):
            msg = str(peak).splitlines()[0] if str(peak) else ""
            conn.send(("error", f"{type(peak).__name__}: {msg}"))
        else:
            conn.send(("ok", peak))
