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
import time

ENV = "MTBENCH_STEP_FILE"


def mark(start_s: float, end_s: float) -> None:
    """Record one step [start_s, end_s] (monotonic seconds)."""
    path = os.environ.get(ENV)
    if not path:
        return
    # one write() of one short line in append mode: lines from several processes do not interleave
    with open(path, "a") as f:
        f.write(f"{start_s:.9f} {end_s:.9f}\n")


class step:  # noqa: N801 - used as `with step():`
    """Context manager that marks the code inside it as one step."""

    def __enter__(self) -> "step":
        self.start = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        mark(self.start, time.monotonic())
