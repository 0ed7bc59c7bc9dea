"""Which of a job's prepared input batches a trace takes, and a trace made with one batch held as the job holds all."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from mtbench.predict.trace import StepTrace
from mtbench.workload.base import batch_of_size


def trace_takes(workload: Any, batches: int, measured: range, stat: str = "max") -> None:
    """Make `workload.setup` prepare the job's `batches` batches and put second, where the trace's measured step (its
    second) takes it, the largest one its measured steps use (step i takes batch i % batches), or with `stat`
    "median" or "min" the one of that size (workload.base.batch_of_size)."""
    setup = workload.setup

    def prepared(ctx: Any) -> None:
        setup(replace(ctx, batches=batches))
        held = workload.batches
        if len(held) < 2:
            return
        chosen = batch_of_size(held, measured, stat)
        held[1], held[chosen] = held[chosen], held[1]

    workload.setup = prepared


def with_batches(trace: StepTrace, batches: int) -> StepTrace:
    """The trace of a workload that holds `batches` prepared input batches, from one traced with a single one."""
    extra = (batches - 1) * trace.inputs_bytes
    if extra <= 0:
        return trace
    trace.inputs_bytes += extra
    trace.breakdown_bytes["inputs"] += extra
    trace.peak_tensor_bytes += extra
    # held before the step, all the time: allocated first
    trace.events = [(-1 - i, trace.inputs_bytes // batches, "Other") for i in range(batches - 1)] + trace.events
    return trace
