"""One job: build the workload, warm up, time the measured steps under the sampler, write the results.

The runner owns measurement. Per step: synchronize, read the clock, run the workload's step, synchronize
again (a CPU-GPU sync point: the step's kernels must finish inside its window), read the clock.
"""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from omegaconf import DictConfig, OmegaConf

from mtbench.config import JobSpec, instantiate, setting
from mtbench.data.base import DataSource
from mtbench.data.pipeline import Pipeline, open_pipeline
from mtbench.device import env, peak as memory
from mtbench.device.oom import is_oom, oom_message
from mtbench.device.power import PowerControl
from mtbench.device.select import resolve_device
from mtbench.device.timing import timed_step
from mtbench.errors import UsageError, describe_error, print_error
from mtbench.job import signals
from mtbench.job.lock import DeviceLock
from mtbench.job.messages import Message
from mtbench.job.until import TargetRun
from mtbench.planning.planner import Planner
from mtbench.results import files as results, loggers, record, step_columns
from mtbench.results.live import ProgressSender
from mtbench.results.summary import build_summary
from mtbench.sampling import Sampler, SensorUnavailable, open_sensors, windows
from mtbench.sampling.process import ProcessSampler, SamplerError
from mtbench.workload.base import MAX_PREPARED_BATCHES, SetupContext, StepLoss, Workload, step_losses
from mtbench.workload.breakdown import breakdown_bytes, fragmentation_bytes

log = logging.getLogger("mtbench")
PRELOADED = "data.loader=preloaded: every batch is made before timing, no step waits for its data"


class Job:
    """State of one job while it runs; `summary()` turns it into the contract's dict."""

    def __init__(self, cfg: DictConfig, out_dir: Path, notify: Optional[Callable[[str, Any], None]] = None) -> None:
        self.cfg = cfg
        # memory.* (checked here); sets the CUDA allocator's expandable_segments before CUDA starts in this process
        self.planner = Planner(cfg)
        self.notify = notify or (lambda kind, payload: None)  # what a parent needs should this process die
        self.out_dir = Path(out_dir)
        self.spec = JobSpec.from_cfg(cfg)
        self.interval_ms = setting(cfg, "sampler.interval_ms")
        self.device = resolve_device(self.spec.device)
        self.power = PowerControl(cfg, self.out_dir, self.device)  # power.*: checked here, applied in run()
        self.started_at = record.utc_now()  # summary.json's started_at (UTC); finished_at is stamped when written
        self.until = TargetRun(cfg, self.spec.batch_size)  # until.*: checked here; the checks run between steps
        instantiate(cfg.data, "data")  # a source that cannot be made (no data.root) is said before any device wait
        self.failure: Optional[Dict[str, str]] = None
        self.durations: List[float] = []
        self.losses: Dict[int, Dict[str, float]] = {}  # step index -> the losses its step returned, by name
        self.measured_losses: List[Dict[str, float]] = []  # those of the measured steps, in order
        self.mem: Dict[str, Any] = {"mem_peak_bytes": None, "mem_peak_source": None}
        self.workload: Optional[Workload] = None
        self.data_label, self.parameters = "unknown", None  # type: Tuple[str, Optional[int]]
        self.sampler: Optional[Sampler | ProcessSampler] = None
        self.sampler_mode = setting(cfg, "sampler.mode", "process")
        self.sensor_status: List[dict] = []
        self.no_samples_reason = "the job ended before sampling"
        self.last_summary: Dict[str, Any] = {}
        self.profile = setting(cfg, "profile", False)
        self.cudnn_benchmark = setting(cfg, "cudnn_benchmark", True)
        # a profiling.Profiler once the profiled steps ran; the unprofiled step times, for the profiler's overhead
        self.profiler, self.reference = None, []  # type: ignore[var-annotated]
        self.unprofiled_mem = self.profiled_mem = None  # profile=true: the peaks without and under the profiler
        self.runtime_bytes: Optional[int] = None  # resident memory before the model was built (CPU)
        self.breakdown: Optional[Dict[str, Any]] = None
        self.extra: Optional[Dict[str, Any]] = None  # the workload's extra_metrics over the measured steps
        self.breakdown_reason: Optional[str] = "the job ended before its measured steps"
        self.pipeline: Optional[Pipeline] = None  # data.loader=dataloader: where each step gets its batch
        self.data_wait_s: Dict[int, float] = {}  # step index -> seconds it blocked on its batch (steps.csv)
        self.core_types: Optional[List[Dict[str, Any]]] = None  # a Jetson's cores and their types (env.jetson)
        self.progress = ProgressSender(lambda p: self.notify(Message.PROGRESS, p),  # the parent's live line
                                       self.spec.warmup + self.spec.steps * (2 if self.profile else 1))

    @property
    def target(self) -> Any:
        """The board whose memory budget the job must fit (target=none: no budget): the planner's."""
        return self.planner.target

    @property
    def budget(self) -> Dict[str, Any]:
        """How the budget is held, for summary.json (the planner owns the budget; this reads it)."""
        return self.planner.held

    def open_sampler(self) -> None:
        """Open the sensors and the sampler, before the model is built (in `process` mode this starts the
        sampling process: a fresh interpreter, ~0.2 s, that opens the sensors itself)."""
        options = OmegaConf.to_container(self.cfg.sampler.get("options", {}) or {}, resolve=True)
        nvml = options.setdefault("nvml", {}) or {}
        if self.device.type == "cuda" and not nvml.get("job_uuids"):
            # the job's energy and GPU utilization are those of the GPU it trains on, matched by UUID; other GPUs
            # are recorded beside it, never added (torch without the uuid property: every GPU counts, as said)
            uuid = getattr(torch.cuda.get_device_properties(self.device), "uuid", None)
            nvml["job_uuids"] = [str(uuid)] if uuid is not None else None
            options["nvml"] = nvml
        names = list(self.cfg.sampler.sensors)
        try:
            if self.sampler_mode == "process":  # no lock of this process (its GIL in a long C call) stalls it
                self.sampler = ProcessSampler(names, options, self.interval_ms)
                self.sensor_status = self.sampler.sensor_status
            else:
                sensors, self.sensor_status = open_sensors(names, options)
                self.sampler = Sampler(sensors, self.interval_ms)
            self.progress.power_w = self.sampler.latest_power_w  # the live line's watts, read between steps
        except SensorUnavailable as exc:
            raise UsageError(f"sampler: {exc}") from None

    def run(self) -> None:
        spec = self.spec
        torch.manual_seed(spec.seed)
        self.progress.phase("build")
        self.power.apply()  # power modes, clocks, cores: before anything of the model exists; restored in _release
        # cuDNN tries every convolution algorithm on each new shape and keeps the fastest (TensorFlow, which the
        # paper used, does so by default); the warm-up steps absorb the trials
        torch.backends.cudnn.benchmark = self.cudnn_benchmark
        # memory.*: before the runtime's memory is read (auto's predictor leaves imports and caches behind)
        self.planner.before_build(self.device)
        # before anything of the model exists: what the runtime holds (CPU), and the allocator's cap (CUDA)
        self.runtime_bytes = memory.current_rss_bytes() if self.device.type == "cpu" else None
        self.planner.hold_budget()  # caps the CUDA allocator, or sets how the CPU peak is held and checked
        data: DataSource = instantiate(self.cfg.data, "data")
        self.data_label = data.label
        self.notify(Message.DATA, self.data_label)
        self.workload = instantiate(self.cfg.model.workload, "model.workload")
        ctx = SetupContext(
            device=self.device,
            batch_size=spec.batch_size,
            data=data,
            seed=spec.seed,
            batches=min(MAX_PREPARED_BATCHES, spec.warmup + spec.steps),
        )
        self.workload.setup(ctx)
        self.until.prepare(data, self.workload)  # until.accuracy: the held-out batches, before timing
        # None for data.loader=preloaded
        self.pipeline = open_pipeline(data, spec.batch_size, spec.seed, self.device, self.workload.batch_recipe())
        # memory.plan: fixed, or (auto) the fastest predicted or probed plan that fits the budget
        self.planner.start(self.workload, is_oom)
        self.parameters = self.workload.parameter_count()
        peak = memory.PeakMemory(self.device)
        assert self.sampler is not None
        self.sampler.start()
        # skip `warmup` steps: the allocator, cuDNN autotuner and caches settle in them
        self.progress.phase("warm-up", spec.warmup)
        for i in range(spec.warmup):
            self._timed_step(i, warmup=True)
        first = spec.warmup
        if self.profile:  # as many unprofiled steps first (marked warm-up): the profiler's overhead, the peak without it
            from mtbench.job.profile import Profiler

            self.progress.phase("reference (unprofiled)", spec.steps)
            peak.reset()
            self.reference = [self._timed_step(i, warmup=True) for i in range(first, first + spec.steps)]
            first, self.unprofiled_mem = first + spec.steps, self._training_memory(peak.read(), then_glibc=True)
            self.profiler = Profiler(self.device, self.workload.modules(), first_step=first)
        peak.reset(trim=(self.planner.held.get("cpu_malloc") or {}).get("setting") == "live")
        self.progress.phase("measure" + (" (profiled)" if self.profiler else ""), spec.steps)
        with self.profiler if self.profiler is not None else contextlib.nullcontext():
            for i in range(first, first + spec.steps):
                if self.profiler is not None:  # between steps: ProfilerStep#i begins (torch's prof.step())
                    self.profiler.step_to(i)
                self.durations.append(self._timed_step(i, warmup=False))
                if self.until.reached(self, i, last=i == first + spec.steps - 1):
                    break
        # profile=true: the peak is the unprofiled steps' (the profiler's own buffers are not training's); the
        # profiled steps' is summary.json's profile.mem_peak_bytes
        self.mem, self.profiled_mem = (peak.read(), None) if self.unprofiled_mem is None else (self.unprofiled_mem,
                                                                                               peak.read())
        self.progress.phase("breakdown")
        self.failure = self.planner.budget_failure(self.mem)
        self.extra = self.workload.extra_metrics(len(self.durations))  # before the untimed steps below add theirs
        self.mem = self.mem if self.profiler is not None else self._training_memory(self.mem, then_glibc=False)
        # where the peak went: one more step under torch's MemTracker after the measured steps (memory.breakdown)
        self.breakdown, self.breakdown_reason = breakdown_bytes(self.workload, self.device,
                                                                enabled=setting(self.cfg, "memory.breakdown", True))

    def _training_memory(self, mem: Dict[str, Any], then_glibc: bool) -> Dict[str, Any]:
        """auto without a budget (glibc's own malloc): training memory from two untimed steps more (device/peak.py)."""
        if self.planner.held.get("cpu_malloc"):
            return mem
        self.workload.step_next_on_largest(range(self.spec.warmup, self.spec.warmup + self.spec.steps))
        return {**mem, **memory.measure_training_step(self.device, self.workload.step, then_glibc)}

    def _timed_step(self, index: int, warmup: bool) -> float:
        assert self.workload is not None and self.sampler is not None
        self.planner.before_step(index)  # a new budget in memory.budget_file: re-plan before this step, untimed
        if self.pipeline is not None:  # the wait for the batch stays outside the step's window, a column of its own
            batch, self.data_wait_s[index] = self.pipeline.next_batch()
            # the copy to the device is neither: timed_step synchronizes before its start
            self.workload.take_batch(tuple(t.to(self.device, non_blocking=self.pipeline.pin_memory) for t in batch))
        returned: List[StepLoss] = []
        start, end = timed_step(self.device, lambda: returned.append(self.workload.step()))
        self.sampler.mark_step(index, start, end, warmup)
        if self.pipeline is not None:  # the loader workers' and this process's CPU, read at each step's end
            self.pipeline.step_ended(warmup)
        self.progress.step(end - start)  # between steps: the live line's data, sent a few times a second at most
        # read back after the step's closing synchronization: no CPU-GPU sync point enters the timed window
        self.losses[index] = step_losses(returned[0])
        if not warmup:
            self.measured_losses.append(self.losses[index])
        return end - start

    def summary(self, samples) -> Dict[str, Any]:
        spec = self.spec
        units = self.workload.units_per_sample() if self.workload is not None else {}
        telemetry = windows.summarize(samples, self.sampler.marks, self.interval_ms) if samples is not None else {}
        described = env.describe(self.device, root=str(self.cfg.sampler.get("sysfs_root", "/")))
        cores = (described.get("jetson") or {}).get("cpu_cores") if isinstance(described.get("jetson"), dict) else None
        self.core_types = cores  # steps.csv groups each step's CPU figures by them too
        if isinstance(telemetry.get("cpu_util_pct"), dict) and cores:
            # a TX2's 2 Denver2 and 4 Cortex-A57 cores, which the paper reports apart: tick-exact per type
            spans = [(m.start_s, m.end_s) for m in self.sampler.marks if not m.warmup]
            by_type = windows.cpu_util_by_core_type(samples, spans, cores)
            if by_type is not None:
                telemetry["cpu_util_pct"] = {**telemetry["cpu_util_pct"], "by_core_type": by_type}
        reasons = dict(telemetry.get("unavailable") or {})
        if self.breakdown is None:
            reasons["mem_breakdown_bytes"] = self.breakdown_reason
        if self.pipeline is None:
            reasons["data_wait_s"] = reasons["data_wait_share"] = PRELOADED
        if self.extra is not None:
            extra = self.extra
        elif self.workload is not None:  # the job ended before its breakdown step: its steps are the last ones
            extra = self.workload.extra_metrics(len(self.durations))
        else:
            extra = None
        return build_summary(
            model=spec.model, batch_size=spec.batch_size, device=str(self.device), data=self.data_label,
            failure=self.failure, durations_s=self.durations,  # warm-up: the steps that ran (a signal may cut it)
            warmup_steps=min(spec.warmup, sum(m.warmup for m in self.sampler.marks) if self.sampler else 0),
            # mem_system_peak_bytes: memory in use on the whole machine (MemTotal - MemAvailable); on a Jetson,
            # whose GPU shares the DRAM, the figure the paper reports (tegrastats "RAM")
            figures={**telemetry, "mem_peak_bytes": self.mem.get("mem_peak_bytes"),
                     "mem_breakdown_bytes": self.breakdown},
            reasons=reasons,
            null_reason=self.no_samples_reason if samples is None else "the job ended before its measured steps",
            units_per_sample=units, losses=self.measured_losses,
            target_run=self.until.figures(samples, self.sampler, self.interval_ms),
            job={
                **self.mem,
                "mem_runtime_bytes": self.runtime_bytes,
                "mem_fragmentation_bytes": fragmentation_bytes(self.mem),
                "target": self.target.name,
                **self.budget,
                "parameters": self.parameters,
                "cudnn_benchmark": self.cudnn_benchmark,
                "data_pipeline": self.pipeline.describe() if self.pipeline is not None else {"loader": "preloaded"},
                "power_mode": self.power.summary(),
                "memory_plan": self.planner.summary(self.mem),
                "sampler": {**(self.sampler.stats() if self.sampler else {}), "sensors": self.sensor_status,
                            "resolution": telemetry.get("resolution")},  # each source's (sampling/resolution.py)
                "env": described,
                "config": OmegaConf.to_container(self.cfg, resolve=True),
            },
            extra=extra,
            data_wait_s=None if self.pipeline is None else [self.data_wait_s[m.index] for m in (
                self.sampler.marks if self.sampler else []) if not m.warmup and m.index in self.data_wait_s])


def run_job(cfg: DictConfig, out_dir: Path, notify: Optional[Callable[[str, Any], None]] = None) -> Dict[str, Any]:
    """Run one job in this process and write its result files, whatever happens; return the summary.

    An out-of-memory error or any other error inside the job is recorded as its failure (kind "oom" or "error")
    and returned, so a sweep goes on; a bad value the user gave raises UsageError before any result is written;
    Ctrl-C is recorded as "interrupted" (SIGTERM and SIGHUP as "terminated": signals.Terminated) and re-raised.
    `run_isolated` runs this in a child process; call it directly only where a job that dies may take the caller.
    """
    job = Job(cfg, out_dir, notify)  # validates batch, steps, ... (UsageError)
    mode, lock_dir = str(cfg.get("device_lock", "wait")), str(cfg.get("lock_dir", "/tmp"))
    # two jobs measuring one device at once spoil both: wait for (or refuse) the other. A GPU job also holds the CPU's
    # lock (it reports CPU figures, a Jetson's GPU shares its DRAM and rails); cpu first: no two wait on each other
    devices = [torch.device("cpu")] + ([job.device] if job.device.type != "cpu" else [])
    locks = [DeviceLock(d, mode, lock_dir, cfg.get("lock_timeout_s")) for d in devices]
    try:
        for lock in locks:
            lock.acquire()
        return _run_locked(job)
    finally:
        for lock in reversed(locks):
            lock.release()
        # logger=...: after the files, the lock (a slow tracking server holds no board) and the signals' deferral
        loggers.log_job(job.cfg, job.out_dir, job.last_summary) if job.last_summary else None


def _run_locked(job: Job) -> Dict[str, Any]:
    root = str(job.cfg.sampler.get("sysfs_root", "/"))
    job.notify(Message.STARTED, {"device": str(job.device), "env": env.describe(job.device, root=root)})
    job.open_sampler()
    memory.release_memory(job.device)
    samples = None
    user_error = False
    try:
        job.run()
    except UsageError:  # e.g. a data file that is missing: the user's to fix, not a result
        user_error = True
        raise
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM / SIGHUP (signals.Terminated): the steps so far are kept
        job.failure, job.breakdown_reason = signals.stopped(exc, job.failure, job.breakdown_reason,
                                                             job.extra is not None and job.breakdown is None)
        raise
    except BaseException as exc:  # noqa: B902 - every failure of the job is a result, not a crash
        kind = "oom" if is_oom(exc) else "error"
        job.failure = {"kind": kind, "message": oom_message(describe_error(exc), not job.durations)}
        log.debug("job failed", exc_info=True)
    finally:
        # a second Ctrl-C or SIGTERM (or the one a parent forwards) waits until the results are written, memory freed
        with signals.stop_signals_deferred():
            samples = _stop_sampler(job)
            if not user_error:
                job.progress.phase("write")
                _write_or_say(job, samples)
                job.notify(Message.SUMMARY, job.last_summary)  # before cleanup: a crash there must not lose it
            _release(job)
    return job.last_summary


def _stop_sampler(job: Job):
    if job.sampler is None:
        return None
    try:
        samples = job.sampler.stop()
    except SamplerError as exc:  # the sampling process died: the job's figures are lost, and that is its failure
        if job.failure is None:
            job.failure = {"kind": "error", "message": f"{type(exc).__name__}: {exc}"}
        job.no_samples_reason = f"the sampler failed: {exc}"
        return None
    for sensor in job.sampler.sensors:
        try:
            sensor.close()
        except Exception:  # a sensor that cannot close cleanly changes none of the figures
            log.debug("closing sensor %s failed", sensor.name, exc_info=True)
    return samples


def _write_or_say(job: Job, samples) -> None:
    """Write the result files; a write that fails (a full disk) is said in one line, never raised."""
    try:
        _write(job, samples)
    except Exception as exc:
        job.last_summary = job.last_summary or job.summary(samples)
        job.last_summary["write_error"] = f"{type(exc).__name__}: {exc}"
        print_error(f"the results of this job could not be written to {job.out_dir}: {type(exc).__name__}: {exc}")


def _release(job: Job) -> None:
    """Drop the model, optimizer state and batches; an error here (a sticky CUDA error) is logged, and the
    failure recorded for the job stays the one that ended it."""
    try:
        if job.workload is not None:
            job.workload.close()
    except Exception:
        log.warning("closing the workload failed", exc_info=True)
    job.workload = None
    if job.pipeline is not None:  # its worker processes end with the job, whatever ended it
        try:
            job.pipeline.close()
        except Exception:
            log.warning("ending the data loader's workers failed", exc_info=True)
    try:
        memory.release_memory(job.device)
        job.planner.release_budget()
    except Exception:
        log.warning("releasing memory after the job failed", exc_info=True)
    job.power.restore()  # whatever ended the job


def _write(job: Job, samples) -> None:
    summary = job.summary(samples)
    summary["profiled"] = job.profiler is not None
    if job.profiler is not None:
        from mtbench.job import profile as profiling

        try:
            summary["profile"] = profiling.of_job(job, samples)
        except Exception as exc:  # the measurements stand without the attribution; say why it is missing
            summary["profile"] = {"error": f"{type(exc).__name__}: {exc}"}
            log.warning("profile attribution failed", exc_info=True)
    if samples is not None and job.sampler is not None:
        header, rows = windows.step_rows(job.sampler.marks, samples, job.interval_ms, job.core_types)
        header, rows = header + ["plan"], [row + [job.planner.labels.get(row[0])] for row in rows]
        header, rows = step_columns.with_losses(header, rows, job.losses)
        if job.pipeline is not None:
            wait = job.data_wait_s.get
            header, rows = header + ["data_wait_s"], [row + [step_columns.seconds(wait(row[0]))] for row in rows]
        results.write_steps(job.out_dir, header, rows)
        results.write_samples(job.out_dir, samples)
        job.until.write_curve(job.out_dir, samples, job.sampler, job.interval_ms)
    results.write_summary(job.out_dir, record.stamp(summary, job.started_at))
    job.last_summary = summary
