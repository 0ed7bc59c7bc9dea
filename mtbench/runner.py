"""One job: build the workload, warm up, time the measured steps under the sampler, write the results.

The runner owns measurement. Per step: synchronize, read the clock, run the workload's step, synchronize
again (a CPU-GPU sync point: the step's kernels must finish inside its window), read the clock.
"""
from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from mtbench import env, memory, results
from mtbench.config import JobSpec, instantiate, positive_float
from mtbench.data import DataSource
from mtbench.errors import UsageError
from mtbench.sampling import Sampler, SensorUnavailable, open_sensors, windows
from mtbench.workload import SetupContext, Workload

log = logging.getLogger("mtbench")

MAX_PREPARED_BATCHES = 8  # distinct input batches made before timing; steps cycle through them


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("device=cuda but no CUDA GPU is visible to torch; allowed here: device=cpu or device=auto")
        return torch.device("cuda", torch.cuda.current_device())  # recorded as "cuda:0", not a bare "cuda"
    return torch.device(name)


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Job:
    """State of one job while it runs; `summary()` turns it into the contract's dict."""

    def __init__(self, cfg: DictConfig, out_dir: Path) -> None:
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.spec = JobSpec.from_cfg(cfg)
        self.interval_ms = positive_float("sampler.interval_ms", cfg.sampler.interval_ms)
        self.device = resolve_device(self.spec.device)
        self.failure: Optional[Dict[str, str]] = None
        self.durations: List[float] = []
        self.mem: Dict[str, Any] = {"mem_peak_bytes": None, "mem_peak_source": None}
        self.workload: Optional[Workload] = None
        self.data_label = "unknown"
        self.parameters: Optional[int] = None
        self.sampler: Optional[Sampler] = None
        self.sensor_status: List[dict] = []
        self.last_summary: Dict[str, Any] = {}
        self.profile = cfg.get("profile", False)
        if not isinstance(self.profile, bool):
            raise UsageError(f"profile={self.profile!r} is not known; allowed: true, false")
        self.profiler = None  # a profiling.Profiler once the profiled steps ran
        self.reference: List[float] = []  # unprofiled step times, for the profiler's overhead

    def open_sampler(self) -> None:
        options = OmegaConf.to_container(self.cfg.sampler.get("options", {}) or {}, resolve=True)
        try:
            sensors, self.sensor_status = open_sensors(list(self.cfg.sampler.sensors), options)
        except SensorUnavailable as exc:
            raise UsageError(f"sampler: {exc}") from None
        self.sampler = Sampler(sensors, self.interval_ms)

    def run(self) -> None:
        spec = self.spec
        torch.manual_seed(spec.seed)
        data: DataSource = instantiate(self.cfg.data)
        self.data_label = data.label
        self.workload = instantiate(self.cfg.model.workload)
        ctx = SetupContext(
            device=self.device,
            batch_size=spec.batch_size,
            data=data,
            seed=spec.seed,
            batches=min(MAX_PREPARED_BATCHES, spec.warmup + spec.steps),
        )
        self.workload.setup(ctx)
        self.parameters = self.workload.parameter_count()
        peak = memory.PeakMemory(self.device)
        assert self.sampler is not None
        self.sampler.start()
        # skip `warmup` steps: the allocator, cuDNN autotuner and caches settle in them
        for i in range(spec.warmup):
            self._timed_step(i, warmup=True)
        first = spec.warmup
        if self.profile:
            from mtbench.profiling import Profiler

            # as many unprofiled steps first (marked warm-up: not measured), to measure the profiler's overhead
            for i in range(first, first + spec.steps):
                self.reference.append(self._timed_step(i, warmup=True))
            first += spec.steps
            self.profiler = Profiler(self.device, self.workload.modules())
        peak.reset()
        with self.profiler if self.profiler is not None else contextlib.nullcontext():
            for i in range(first, first + spec.steps):
                self.durations.append(self._timed_step(i, warmup=False))
        self.mem = peak.read()

    def _timed_step(self, index: int, warmup: bool) -> float:
        assert self.workload is not None and self.sampler is not None
        _sync(self.device)
        start = time.monotonic()
        self.workload.step()
        _sync(self.device)
        end = time.monotonic()
        self.sampler.mark_step(index, start, end, warmup)
        return end - start

    def summary(self, samples) -> Dict[str, Any]:
        spec = self.spec
        total_time = sum(self.durations)
        units = self.workload.units_per_sample() if self.workload is not None else {}
        throughput = spec.batch_size * len(self.durations) / total_time if total_time > 0 else None
        telemetry = windows.summarize(samples, self.sampler.marks, self.interval_ms) if samples is not None else {
            "unavailable": {k: "the job ended before sampling" for k in ("cpu_util_pct", "gpu_util_pct", "power_w", "energy_j")}}
        summary: Dict[str, Any] = {
            "schema": results.SCHEMA,
            "model": spec.model,
            "batch_size": spec.batch_size,
            "device": str(self.device),
            "data": self.data_label,
            "success": self.failure is None,
            "failure": self.failure,
            "warmup_steps": spec.warmup,
            "measured_steps": len(self.durations),
            "step_time_s": results.stats(self.durations),
            "throughput_samples_per_s": throughput,
            "throughput_units_per_s": {k: v * throughput for k, v in units.items()} if throughput else {},
            "cpu_util_pct": telemetry.get("cpu_util_pct"),
            "process_cpu_pct": telemetry.get("process_cpu_pct"),
            "gpu_util_pct": telemetry.get("gpu_util_pct"),
            "power_w": telemetry.get("power_w"),
            "energy_j": telemetry.get("energy_j"),
            "unavailable": telemetry["unavailable"],
            **self.mem,
            "parameters": self.parameters,
            "sampler": {**(self.sampler.stats() if self.sampler else {}), "sensors": self.sensor_status},
            "env": env.describe(self.device),
            "config": OmegaConf.to_container(self.cfg, resolve=True),
        }
        if self.workload is not None:
            summary.update(self.workload.extra_metrics(len(self.durations)))
        return summary


def run_job(cfg: DictConfig, out_dir: Path) -> Dict[str, Any]:
    """Run one job and write its result files, whatever happens; return the summary.

    An out-of-memory error or any other error inside the job is recorded as its failure (kind "oom" or
    "error") and returned, so a sweep goes on; a bad value the user gave raises UsageError before any
    result is written; Ctrl-C is recorded as "interrupted" and re-raised.
    """
    job = Job(cfg, out_dir)  # validates batch, steps, ... (UsageError)
    job.open_sampler()
    memory.release_memory(job.device)
    samples = None
    user_error = False
    try:
        job.run()
    except UsageError:  # e.g. a data file that is missing: the user's to fix, not a result
        user_error = True
        raise
    except KeyboardInterrupt:
        job.failure = {"kind": "interrupted", "message": "interrupted by the user (Ctrl-C)"}
        raise
    except BaseException as exc:  # noqa: B902 - every failure of the job is a result, not a crash
        kind = "oom" if is_oom(exc) else "error"
        job.failure = {"kind": kind, "message": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        log.debug("job failed", exc_info=True)
    finally:
        if job.sampler is not None:
            samples = job.sampler.stop()
            for sensor in job.sampler.sensors:
                sensor.close()
        if not user_error:
            _write(job, samples)
        if job.workload is not None:
            job.workload.close()
        job.workload = None  # drop the model, optimizer state and batches before the next job
        memory.release_memory(job.device)
    return job.last_summary


def _profile(job: Job, samples) -> Optional[Dict[str, Any]]:
    """Join the profiled steps' ops and layers with the telemetry; None when nothing was profiled."""
    if job.profiler is None or samples is None or job.sampler is None or job.failure is not None:
        return None
    from mtbench import profiling
    from mtbench.console import print_top_ops

    steps = [(m.start_s, m.end_s) for m in job.sampler.marks if not m.warmup]
    figures = profiling.finish(job.profiler, samples, steps, job.interval_ms, job.out_dir)
    print_top_ops(figures.pop("_header"), figures.pop("_rows"))
    reference = results.stats(job.reference)
    profiled = results.stats(job.durations)
    return {
        "steps": len(job.durations),
        "unprofiled_step_time_s": reference,
        "overhead_ratio": profiled["median"] / reference["median"] if reference and profiled else None,
        **figures,
    }


def _write(job: Job, samples) -> None:
    summary = job.summary(samples)
    summary["profiled"] = job.profiler is not None
    if job.profiler is not None:
        try:
            summary["profile"] = _profile(job, samples)
        except Exception as exc:  # the measurements stand without the attribution; say why it is missing
            summary["profile"] = {"error": f"{type(exc).__name__}: {exc}"}
            log.warning("profile attribution failed", exc_info=True)
    if samples is not None and job.sampler is not None:
        header, rows = windows.step_rows(job.sampler.marks, samples, job.interval_ms)
        results.write_steps(job.out_dir, header, rows)
        results.write_samples(job.out_dir, samples)
    results.write_summary(job.out_dir, summary)
    job.last_summary = summary
