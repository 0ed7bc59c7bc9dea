"""`profile=true`: operator intervals from torch.profiler and layer intervals from module hooks, put on the
sampler's clock and joined with the telemetry (ops.csv, layers.csv), and a Perfetto-readable trace with
power, CPU and GPU load as counter tracks beside the ops (trace.json.gz).

Clock calibration: the profiler stamps events on its own clock. Just before the profiled steps and just
after them the runner opens an empty `record_function("mtbench::clock_sync")` between two reads of
time.monotonic(); the event's midpoint is matched to the midpoint of the two reads, which gives the offset
(error below half the bracket, a few microseconds), and the second sync measures the drift between them.

Steps: the profiler runs under a schedule that records throughout, so torch marks each step with a
`ProfilerStep#N` span (N: the step's index in steps.csv), which HolisticTraceAnalysis and TensorBoard's profiler
read as steps; the job calls `step_to(index)` between steps, as torch's `prof.step()` is meant to be called.
Kineto's own lines (`USDT: ... profiler_start`, `STAGE: ...`), which it writes to the process's stderr when the
profiler starts and stops, go to profiler.log in the job's folder instead of the console.
"""
from __future__ import annotations

import contextlib
import functools
import gzip
import inspect
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.profiler import ProfilerAction, ProfilerActivity, profile, record_function

from mtbench.job import kernel_ops
from mtbench.results.files import atomic_write, atomic_write_bytes, csv_text
from mtbench.sampling import Samples
from mtbench.sampling.attribution import Interval, attribute
from mtbench.sampling.sensor import GPU_UTIL, POWER
from mtbench.sampling.windows import cpu_utilization

SYNC = "mtbench::clock_sync"
HOST_CATS = ("cpu_op", "user_annotation")
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
# Kineto's log lines: "USDT:2026-12-01 22:44:29 7981:7981 ...] profiler_start" (torch 2.x), "STAGE:... Completed Stage:
# Warm Up" and "ERROR:... CudaDeviceProperties.cpp:26] cudaGetDeviceCount failed with code 35" (torch 1.13, no driver)
KINETO_LINE = re.compile(r"^(USDT|STAGE|ERROR|WARNING|INFO):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ [\w.]+:\d+\] ")


def _record_always(step: int) -> ProfilerAction:
    """The schedule: every step recorded (a schedule is what makes torch write its ProfilerStep#N spans)."""
    return ProfilerAction.RECORD


@functools.lru_cache(maxsize=None)
def _names_the_step_before() -> bool:
    """Whether this torch's profile.step() names the span it opens by the step number before its increment
    ("ProfilerStep#" + str(cur_step): torch 1.13) rather than after it (torch 2.x)."""
    try:
        return "str(cur_step)" in inspect.getsource(profile.step)
    except (OSError, TypeError):  # no source: the current naming
        return False


@contextlib.contextmanager
def kineto_lines_captured(lines: List[str]):
    """Inside the block, the process's stderr (fd 2, where Kineto's C++ code writes) goes to a temporary file; after
    it, Kineto's lines are appended to `lines` and anything else is written to stderr as it came. Used only around
    the profiler's start and stop, never around a step."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read().decode("utf-8", "replace")
            other = []
            for line in text.splitlines(keepends=True):
                (lines if KINETO_LINE.match(line) else other).append(line)
            if other:
                sys.stderr.write("".join(other))
                sys.stderr.flush()


class Profiler:
    """Wraps the profiled steps: `with prof:` around them, then `finish(...)` writes the files."""

    def __init__(self, device: torch.device, modules: Sequence[torch.nn.Module], first_step: int = 0) -> None:
        os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # quiet Kineto's start/stop lines
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self.prof = profile(activities=activities, schedule=_record_always)
        self.prof.step_num = first_step  # ProfilerStep#N numbered as the job's steps (steps.csv's index)
        self._step = first_step  # the step whose ProfilerStep span is open
        self.kineto_lines: List[str] = []
        self.syncs: List[Tuple[float, float, int]] = []  # (bracket midpoint, width, which sync point)
        self.layers: List[Interval] = []
        self._hooks: List[Any] = []
        self._modules = modules

    def _sync_mark(self, tries: int = 5) -> None:
        """A few empty marks in a row; the one whose bracket is narrowest is used (a preemption inside a
        bracket, on a loaded machine, would shift its midpoint by half the time lost)."""
        group = len(self.syncs) // tries if self.syncs else 0
        for _ in range(tries):
            before = time.monotonic()
            with record_function(SYNC):
                pass
            after = time.monotonic()
            self.syncs.append(((before + after) / 2, after - before, group))

    def _hook_layers(self) -> None:
        """Forward intervals of every leaf module (host time: on CUDA they show launch, not kernel, time)."""
        open_at: Dict[int, float] = {}
        for k, net in enumerate(self._modules):
            for name, module in net.named_modules():
                if any(True for _ in module.children()):
                    continue
                label = f"{name or type(module).__name__} ({type(module).__name__})"
                if len(self._modules) > 1:
                    label = f"net{k}.{label}"

                def pre(mod, _inp, key=id(module)):
                    open_at[key] = time.monotonic()

                def post(mod, _inp, _out, key=id(module), label=label):
                    self.layers.append(Interval(label, open_at.pop(key, time.monotonic()), time.monotonic()))

                self._hooks.append(module.register_forward_pre_hook(pre))
                self._hooks.append(module.register_forward_hook(post))

    def __enter__(self) -> "Profiler":
        self._hook_layers()
        with kineto_lines_captured(self.kineto_lines):
            self.prof.__enter__()  # opens ProfilerStep#first_step
        self._sync_mark()
        return self

    def step_to(self, index: int) -> None:
        """Between steps, before step `index`: the previous ProfilerStep span ends and #index begins (torch's
        prof.step(); the first step's span opened with the profiler)."""
        while self._step < index:
            self._step += 1
            if _names_the_step_before():  # torch 1.13 names the new span by step_num before its increment
                self.prof.step_num = self._step
            self.prof.step()

    def __exit__(self, *exc: object) -> None:
        self._sync_mark()
        with kineto_lines_captured(self.kineto_lines):
            self.prof.__exit__(*exc)
        for h in self._hooks:
            h.remove()

    def events(self) -> Tuple[Dict[str, Any], float, Optional[float]]:
        """(the profiler's Chrome trace, offset s such that monotonic = ts_us / 1e6 + offset, drift in us)."""
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            with kineto_lines_captured(self.kineto_lines):  # torch 1.13 logs a "Completed Stage" line here
                self.prof.export_chrome_trace(path)
            with open(path) as f:
                trace = json.load(f)
        if not isinstance(trace, dict):
            trace = {"traceEvents": trace}
        events = trace["traceEvents"]
        syncs = sorted((e for e in events if e.get("name") == SYNC and e.get("ph") == "X"), key=lambda e: e["ts"])
        if not syncs:
            raise RuntimeError("the profiler trace lacks mtbench's clock-sync events")
        mids = [(e["ts"] + e.get("dur", 0) / 2) / 1e6 for e in syncs]
        best: Dict[int, Tuple[float, float]] = {}  # group -> (bracket width, offset)
        for (t, width, group), m in zip(self.syncs, mids):
            if group not in best or width < best[group][0]:
                best[group] = (width, t - m)
        offsets = [best[g][1] for g in sorted(best)]
        drift = (offsets[-1] - offsets[0]) * 1e6 if len(offsets) > 1 else None
        return trace, offsets[0], drift


def top_level(events: List[dict], offset: float) -> Tuple[List[Interval], List[Interval], List[list]]:
    """Host ops not nested in another host op of the same thread; device kernels, each named by the op that
    launched it (correlation ids: kernel_ops); and kernels.csv's rows (kernel, op, calls, total_s)."""
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") in HOST_CATS and e["name"] != SYNC
            and not e["name"].startswith("ProfilerStep")]
    tops = kernel_ops.top_ops(host)

    def op_name(name: str) -> str:
        return name[len(BACKWARD_PREFIX):] if name.startswith(BACKWARD_PREFIX) else name

    ops = [Interval(op_name(name), a / 1e6 + offset, b / 1e6 + offset, "cpu")
           for thread in tops.values() for a, b, name in thread]
    named, table = kernel_ops.device_events(events, tops)
    kernels = [Interval(op_name(name), e["ts"] / 1e6 + offset, (e["ts"] + e.get("dur", 0)) / 1e6 + offset, "cuda")
               for e, name in named]
    for row in table:
        row[1] = op_name(row[1])
    return ops, kernels, table


def counter_events(samples: Samples, offset: float, pid: Any, window_s: float = 0.05) -> List[dict]:
    """Power per rail, GPU load (per sample) and CPU busy % per core (per `window_s`, from tick deltas:
    one 5 ms sample of a core reads only 0 or 100) as Chrome-trace counter events."""
    out: List[dict] = []
    ts = (samples.time_s - offset) * 1e6
    power = samples.group(POWER)
    gpu = samples.group(GPU_UTIL)
    for i in range(len(samples)):
        if power:
            args = {f.key: samples.columns[f.name][i] * f.scale for f in power
                    if np.isfinite(samples.columns[f.name][i])}
            if args:
                out.append({"name": "power_w", "ph": "C", "ts": ts[i], "pid": pid, "args": args})
        if gpu:
            args = {f"gpu{f.key}": samples.columns[f.name][i] * f.scale for f in gpu
                    if np.isfinite(samples.columns[f.name][i])}
            if args:
                out.append({"name": "gpu_util_pct", "ph": "C", "ts": ts[i], "pid": pid, "args": args})
    cores = [f.key for f in samples.group("cpu_busy")]
    if cores and len(samples) > 1:
        grid = np.arange(samples.time_s[0], samples.time_s[-1], window_s)
        for a, b in zip(grid[:-1], grid[1:]):
            per_core = (cpu_utilization(samples, [(a, b)]) or {}).get("per_core", [])
            # JSON has no NaN: a core without figures in this window is left out, not written
            args = {f"cpu{c}": pct for c, pct in zip(cores, per_core) if pct is not None}
            if args:
                out.append({"name": "cpu_util_pct", "ph": "C", "ts": (a - offset) * 1e6, "pid": pid, "args": args})
    return out


def finish(profiler: Profiler, samples: Samples, steps: Sequence[Tuple[float, float]], interval_ms: float,
           out_dir: Path) -> Dict[str, Any]:
    """Write ops.csv, layers.csv and trace.json.gz; return the summary's `profile` figures and top rows."""
    trace, offset, drift = profiler.events()
    events = trace["traceEvents"]
    ops, kernels, kernel_table = top_level(events, offset)
    # energy is split along one timeline: the kernels where the GPU ran them, else the host ops
    primary, secondary = (kernels, ops) if kernels else (ops, [])
    header, rows, check = attribute(primary, steps, samples, interval_ms)
    if secondary:
        sec_header, sec_rows, _ = attribute(secondary, steps, samples, interval_ms)
        energy_cols = [i for i, h in enumerate(sec_header) if h.startswith(("power_w_", "energy_j"))]
        for r in sec_rows:
            if r[0] != "[no op]":
                rows.append([None if i in energy_cols else v for i, v in enumerate(r)])  # time only
    atomic_write(out_dir / "ops.csv", csv_text(header, rows))
    if kernel_table:  # which kernels each op's GPU row is made of
        atomic_write(out_dir / "kernels.csv", csv_text(kernel_ops.KERNELS_HEADER, kernel_table))
    if profiler.kineto_lines:  # kept off the console, kept here
        atomic_write(out_dir / "profiler.log", "".join(profiler.kineto_lines))
    layer_header, layer_rows, layer_check = attribute(profiler.layers, steps, samples, interval_ms)
    atomic_write(out_dir / "layers.csv", csv_text(layer_header, layer_rows))
    pid = next((e.get("pid") for e in events if e.get("ph") == "X"), 0)
    # the profiler's own metadata is kept; the telemetry joins its events as counter tracks
    trace["traceEvents"] = events + counter_events(samples, offset, pid)
    atomic_write_bytes(out_dir / "trace.json.gz", gzip.compress(json.dumps(trace, allow_nan=False).encode()))
    return {
        "clock_offset_s": offset,
        "clock_drift_us": drift,
        "timeline": "cuda kernels" if kernels else "host ops",
        "ops_coverage_of_step_time": check["coverage"],
        "layers_coverage_of_step_time": layer_check["coverage"],
        "steps_energy_j": check["steps_energy_j"],
        "ops_energy_j": check["rows_energy_j"],
        "files": ["ops.csv", "layers.csv", "trace.json.gz"] + (["kernels.csv"] if kernel_table else [])
        + (["profiler.log"] if profiler.kineto_lines else []),
        # the ProfilerStep#N spans in the trace (HolisticTraceAnalysis's and TensorBoard's steps)
        "steps_marked": sum(1 for e in events if e.get("ph") == "X" and str(e.get("name")).startswith("ProfilerStep#")),
        "_header": header,
        "_rows": rows,
    }


def job_figures(profiler: Profiler, samples: Samples, marks: Sequence[Any], interval_ms: float, out_dir: Path,
                reference: Sequence[float], durations: Sequence[float],
                profiled_mem: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """summary.json's `profile`: the files written by `finish`, the top ops printed, the profiler's overhead
    (profiled against the unprofiled `reference` steps' median) and the peak memory under the profiler."""
    from mtbench.results.console import print_top_ops
    from mtbench.results.files import stats

    steps = [(m.start_s, m.end_s) for m in marks if not m.warmup]
    figures = finish(profiler, samples, steps, interval_ms, out_dir)
    print_top_ops(figures.pop("_header"), figures.pop("_rows"))
    unprofiled, profiled = stats(list(reference)), stats(list(durations))
    return {
        "steps": len(durations),
        "unprofiled_step_time_s": unprofiled,
        "overhead_ratio": profiled["median"] / unprofiled["median"] if unprofiled and profiled else None,
        # the profiled steps' peak (the job's mem_peak_bytes is the unprofiled steps'): what the profiler adds
        "mem_peak_bytes": (profiled_mem or {}).get("mem_peak_bytes"),
        **figures,
    }


def of_job(job: Any, samples: Optional[Samples]) -> Optional[Dict[str, Any]]:
    """A job's (job/run.py's Job) profiled steps' ops and layers joined with the telemetry: `job_figures`; None
    when nothing was profiled or measured (no samples, a failed job)."""
    if job.profiler is None or samples is None or job.sampler is None or job.failure is not None:
        return None
    return job_figures(job.profiler, samples, job.sampler.marks, job.interval_ms, job.out_dir, job.reference,
                       job.durations, job.profiled_mem)
