"""The signals that stop a job (Ctrl-C's SIGINT; SIGTERM from SLURM, Kubernetes, `timeout`, `kill`; SIGHUP), each
turned into an exception that leaves a summary with every step measured so far."""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple

# systemd, SLURM's preemption and container runtimes send SIGTERM (then SIGKILL after a grace time); a closed
# terminal sends SIGHUP. Each is handled like Ctrl-C: the job stops, its results are written.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP reached the process: a KeyboardInterrupt for every `except KeyboardInterrupt` that keeps
    results, carrying the signal so the job records it and the command exits with 128 + its number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_signal(exc: BaseException) -> int:
    """The signal an interrupt stands for: SIGINT for Ctrl-C, else the one a Terminated carries."""
    return exc.signum if isinstance(exc, Terminated) else int(signal.SIGINT)


def failure_of(exc: BaseException) -> Dict[str, Any]:
    """The `failure` a job stopped by `exc` records."""
    if isinstance(exc, Terminated):
        name = signal.Signals(exc.signum).name
        return {"kind": "terminated", "signal": name,
                "message": f"terminated by {name} (a scheduler's stop or preemption, `timeout`, `kill`, or a closed "
                           "terminal); the steps measured before it are kept"}
    return {"kind": "interrupted", "message": "interrupted by the user (Ctrl-C)"}


def stopped(exc: BaseException, failure: Optional[Dict[str, Any]], breakdown_reason: Optional[str],
            measured_all: bool) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """(failure, breakdown reason) of a job `exc` stopped: its `failure_of`, unless every measured step had run and
    only the untimed steps after them were cut (training memory's, the breakdown's): then its result stands (a
    resumed sweep does not run it again) and the breakdown says why it is null."""
    if measured_all:
        return failure, f"{failure_of(exc)['kind']} during the untimed steps after the measured ones"
    return failure_of(exc), breakdown_reason


def exit_code(exc: BaseException) -> int:
    """What a command stopped by `exc` exits with, as a shell reports a process a signal ended: 128 + number."""
    return 128 + stop_signal(exc)


def raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated(signum)


def install_terminate_handlers() -> None:
    """SIGTERM and SIGHUP raise Terminated in this process's main thread (where not ignored on purpose: `nohup`
    ignores SIGHUP, and its children keep ignoring it)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) != signal.SIG_IGN:
            signal.signal(signum, raise_terminated)


@contextlib.contextmanager
def stop_signals_deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP back while the block runs (a message read whole, results written), then give
    the first held one to the handler that was there before (which raises)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: List[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if pending:
        signum = pending[0]
        handler = previous[signum]
        if callable(handler):
            handler(signum, None)
        elif handler == signal.SIG_DFL:
            raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signum)


def stop_descendants(signum: int, grace_s: float = 30.0) -> int:
    """Pass `signum` to every process this one started that still runs (a launcher's workers and the jobs they
    run: submitit_local, joblib), sampling processes left out (each job stops its own and keeps its samples); wait
    up to `grace_s` for them to record their stop and end, then SIGKILL what remains (submitit's workers ignore
    SIGTERM; a job dies with its worker). Returns how many had to be killed."""
    import psutil

    from mtbench.sampling.process import PROCESS_TITLE

    def running() -> List[Any]:
        try:
            return psutil.Process().children(recursive=True)
        except psutil.Error:
            return []

    def is_sampler(proc: Any) -> bool:
        try:
            return any(PROCESS_TITLE in part for part in proc.cmdline())
        except psutil.Error:
            return False

    targets = [p for p in running() if not is_sampler(p)]
    for proc in targets:
        try:
            proc.send_signal(signum)
        except psutil.Error:
            pass
    psutil.wait_procs(targets, timeout=grace_s)
    left = running()
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=5.0)
    return len(left)

