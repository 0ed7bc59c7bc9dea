"""Mark training-step boundaries for `mtbench-sample`, from any program, without torch or mtbench's runner.

`mtbench-sample` sets MTBENCH_STEP_FILE to a file in its output folder. A Python program marks steps with

    from mtbench.marker import step
    for batch in batches:
        with step():
            train_step(batch)

and any other program appends one line per step to that file: `<start> <end>` in seconds on
CLOCK_MONOTONIC (Python's time.monotonic(), C's clock_gettime(CLOCK_MONOTONIC), ...). Without the variable
(the program runs on its own) marking does nothing. This module imports only the standard library; it can
be copied next to a script that cannot install mtbench.
"""
from __future__ import annotations

import os
import sys
import time

ENV = "MTBENCH_STEP_FILE"


_warned = False  # the one warning of a step file that cannot be written has been printed


def mark(start_s: float, end_s: float) -> None:
    """Record one step [start_s, end_s] (monotonic seconds). Never raises into the caller's program: a step
    file that cannot be written (its folder gone after an old run, a read-only file) is warned about once on
    stderr and the mark is dropped."""
    global _warned
    path = os.environ.get(ENV)
    if not path:
        return
    try:
        # one write() of one short line in append mode: lines from several processes do not interleave
        # O_NOFOLLOW: a link planted in a shared folder in place of the step file is refused, not appended through
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            os.write(fd, f"{start_s:.9f} {end_s:.9f}\n".encode())
        finally:
            os.close(fd)
    except Exception as exc:  # noqa: BLE001 - the user's training must go on whatever happens to the marks
        if not _warned:
            _warned = True
            try:
                print(f"mtbench.marker: warning: cannot write step marks to {ENV}={path!r} "
                      f"({type(exc).__name__}: {exc}); steps are not marked", file=sys.stderr)
            except Exception:  # noqa: BLE001 - a closed stderr must not raise either
                pass


class step:  # noqa: N801 - used as `with step():`
    """Context manager that marks the code inside it as one step."""

    def __enter__(self) -> "step":
        self.start = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        mark(self.start, time.monotonic())
