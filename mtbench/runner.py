"""One job: build the workload, warm up, time the measured steps under the sampler, write the results.

The runner owns measurement. Per step: synchronize, read the clock, run the workload's step, synchronize
again (a CPU-GPU sync point: the step's kernels must finish inside its window), read the clock.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import math
import multiprocessing
import os
import signal
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from omegaconf import DictConfig, OmegaConf

from mtbench import env, memory, results
from mtbench.config import JobSpec, instantiate, positive_float
from mtbench.data import DataSource
from mtbench.errors import UsageError, describe_error
from mtbench.memory import budget
from mtbench.memory.breakdown import breakdown_bytes, fragmentation_bytes
from mtbench.memory.plan_run import Planner
from mtbench.sampling import Sampler, SensorUnavailable, open_sensors, windows
from mtbench.sampling.process import ProcessSampler, SamplerError
from mtbench.workload import SetupContext, Workload

log = logging.getLogger("mtbench")

MAX_PREPARED_BATCHES = 8  # distinct input batches made before timing; steps cycle through them
SAMPLER_MODES = ("process", "thread")  # sampler.mode: where the sampling loop runs (see conf/sampler/_base.yaml)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("device=cuda but no CUDA GPU is visible to torch; allowed here: device=cpu or device=auto")
        return torch.device("cuda", torch.cuda.current_device())  # recorded as "cuda:0", not a bare "cuda"
    return torch.device(name)


# What out-of-memory looks like from each allocator: the CPU allocator ("DefaultCPUAllocator: can't allocate
# memory: you tried to allocate N bytes"), CUDA's caching allocator ("CUDA out of memory"), a Jetson torch build
# whose failed cudaMalloc trips an NVML assert in the caching allocator, and cuBLAS / cuDNN workspaces.
OOM_MARKERS = (
    "out of memory",
    "can't allocate memory",
    "nvml_success == r internal assert failed",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
)


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and is_oom_text(str(exc))


def is_oom_text(text: str) -> bool:
    """An error's text says it ran out of memory (also for one that reached us only as text, from a child)."""
    return any(m in text.lower() for m in OOM_MARKERS)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Job:
    """State of one job while it runs; `summary()` turns it into the contract's dict."""

    def __init__(self, cfg: DictConfig, out_dir: Path, notify: Optional[Callable[[str, Any], None]] = None) -> None:
        self.cfg = cfg
        # memory.* (checked here); sets the CUDA allocator's expandable_segments before CUDA starts in this process
        self.planner = Planner(cfg)
        # tells a parent process what it needs to write this job's summary should the job's process die
        self.notify = notify or (lambda kind, payload: None)
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
        self.sampler: Optional[Sampler | ProcessSampler] = None
        self.sampler_mode = str(cfg.sampler.get("mode", "process"))
        if self.sampler_mode not in SAMPLER_MODES:
            raise UsageError(f"sampler.mode={self.sampler_mode!r} is not known; allowed: {', '.join(SAMPLER_MODES)}")
        self.sensor_status: List[dict] = []
        self.no_samples_reason = "the job ended before sampling"
        self.last_summary: Dict[str, Any] = {}
        self.profile = cfg.get("profile", False)
        if not isinstance(self.profile, bool):
            raise UsageError(f"profile={self.profile!r} is not known; allowed: true, false")
        self.cudnn_benchmark = cfg.get("cudnn_benchmark", True)
        if not isinstance(self.cudnn_benchmark, bool):
            raise UsageError(f"cudnn_benchmark={self.cudnn_benchmark!r} is not known; allowed: true, false")
        self.profiler = None  # a profiling.Profiler once the profiled steps ran
        self.reference: List[float] = []  # unprofiled step times, for the profiler's overhead
        # the board whose memory budget the job must fit (target=none: no budget)
        self.target = budget.target_from_cfg(cfg)
        self.budget: Dict[str, Any] = {"budget_bytes": self.target.memory_budget_bytes, "budget_enforced_by": None}
        self.target = self.planner.held_target(self.target)  # memory.budget_gb replaces the target's budget
        self.budget["budget_bytes"] = self.target.memory_budget_bytes
        self.runtime_bytes: Optional[int] = None  # resident memory before the model was built (CPU)
        self.breakdown: Optional[Dict[str, Any]] = None
        self.extra: Optional[Dict[str, Any]] = None  # the workload's extra_metrics over the measured steps
        self.breakdown_reason: Optional[str] = "the job ended before its measured steps"

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
            if self.sampler_mode == "process":
                # a process of its own: no lock of this one (the GIL held through a long C call) can stall it
                self.sampler = ProcessSampler(names, options, self.interval_ms)
                self.sensor_status = self.sampler.sensor_status
            else:
                sensors, self.sensor_status = open_sensors(names, options)
                self.sampler = Sampler(sensors, self.interval_ms)
        except SensorUnavailable as exc:
            raise UsageError(f"sampler: {exc}") from None

    def run(self) -> None:
        spec = self.spec
        torch.manual_seed(spec.seed)
        # cuDNN tries every convolution algorithm on each new shape and keeps the fastest (TensorFlow, which the
        # paper used, does so by default); the warm-up steps absorb the trials
        torch.backends.cudnn.benchmark = self.cudnn_benchmark
        # memory.*: before the runtime's memory is read (auto's predictor leaves imports and caches behind)
        self.planner.before_build(self.device)
        # before anything of the model exists: what the runtime holds (CPU), and the allocator's cap (CUDA)
        self.runtime_bytes = memory.current_rss_bytes() if self.device.type == "cpu" else None
        cpu_malloc = self.planner.settings.cpu_malloc
        self.budget = budget.apply_budget(self.target, self.device, cpu_malloc)
        if self.budget["budget_bytes"] is None and self.device.type == "cpu":
            # no peak check: memory.cpu_malloc as asked (auto: live where memory.budget_file alone steers the plan,
            # so that its probes measure as a budgeted job's; else glibc's own settings)
            chosen = memory.set_cpu_malloc(cpu_malloc, budgeted=self.planner.budget_bytes is not None)
            if chosen is not None:
                self.budget["cpu_malloc"] = chosen
        data: DataSource = instantiate(self.cfg.data, "data")
        self.data_label = data.label
        self.notify("data", self.data_label)
        self.workload = instantiate(self.cfg.model.workload, "model.workload")
        ctx = SetupContext(
            device=self.device,
            batch_size=spec.batch_size,
            data=data,
            seed=spec.seed,
            batches=min(MAX_PREPARED_BATCHES, spec.warmup + spec.steps),
        )
        self.workload.setup(ctx)
        # memory.plan: fixed, or (auto) the fastest predicted or probed plan that fits the budget
        self.planner.start(self.workload, is_oom, self.runtime_bytes)
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
        # the workload's own figures over the measured steps, taken before the untimed step below adds one more
        self.extra = self.workload.extra_metrics(len(self.durations))
        # where the peak went: one more step under torch's MemTracker, after the measured steps and their peak
        self.breakdown, self.breakdown_reason = breakdown_bytes(self.workload, self.device)
        self.failure = budget.budget_failure(self.target, self.mem, self.budget["budget_enforced_by"],
                                             self.runtime_bytes)

    def _timed_step(self, index: int, warmup: bool) -> float:
        assert self.workload is not None and self.sampler is not None
        self.planner.before_step(index)  # a new budget in memory.budget_file: re-plan before this step, untimed
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
            "unavailable": {k: self.no_samples_reason for k in ("cpu_util_pct", "gpu_util_pct", "power_w", "energy_j",
                                                                "mem_system_peak_bytes")}}
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
            "unavailable": {**telemetry["unavailable"],
                            **({"mem_breakdown_bytes": self.breakdown_reason} if self.breakdown is None else {})},
            **self.mem,
            # memory in use on the whole machine (MemTotal - MemAvailable): on a Jetson, whose GPU shares the
            # DRAM, the figure the paper reports (tegrastats "RAM")
            "mem_system_peak_bytes": telemetry.get("mem_system_peak_bytes"),
            "mem_runtime_bytes": self.runtime_bytes,
            "mem_breakdown_bytes": self.breakdown,
            "mem_fragmentation_bytes": fragmentation_bytes(self.mem),
            "target": self.target.name,
            **self.budget,
            "parameters": self.parameters,
            "cudnn_benchmark": self.cudnn_benchmark,
            "memory_plan": self.planner.summary(self.mem),
            "sampler": {**(self.sampler.stats() if self.sampler else {}), "sensors": self.sensor_status},
            "env": env.describe(self.device, root=str(self.cfg.sampler.get("sysfs_root", "/"))),
            "config": OmegaConf.to_container(self.cfg, resolve=True),
        }
        if self.extra is not None:
            summary.update(self.extra)
        elif self.workload is not None:  # the job ended before its breakdown step: its steps are the last ones
            summary.update(self.workload.extra_metrics(len(self.durations)))
        return summary


def run_job(cfg: DictConfig, out_dir: Path, notify: Optional[Callable[[str, Any], None]] = None) -> Dict[str, Any]:
    """Run one job in this process and write its result files, whatever happens; return the summary.

    An out-of-memory error or any other error inside the job is recorded as its failure (kind "oom" or
    "error") and returned, so a sweep goes on; a bad value the user gave raises UsageError before any
    result is written; Ctrl-C is recorded as "interrupted" and re-raised. `run_isolated` runs this in a
    child process; call this directly only where a job that kills its process may take the caller along.
    """
    job = Job(cfg, out_dir, notify)  # validates batch, steps, ... (UsageError)
    mode, lock_dir = str(cfg.get("device_lock", "wait")), str(cfg.get("lock_dir", "/tmp"))
    # two jobs measuring one device at once spoil both: wait for (or refuse) the other. A GPU job also holds the
    # CPU's lock (it reports CPU figures too, and a Jetson's GPU shares the CPU's DRAM and power rails); always
    # taken in the order cpu, then the GPU, so that two jobs never wait for each other
    devices = [torch.device("cpu")] + ([job.device] if job.device.type != "cpu" else [])
    locks = [DeviceLock(d, mode, lock_dir) for d in devices]
    try:
        for lock in locks:
            lock.acquire()
        return _run_locked(job)
    finally:
        for lock in reversed(locks):
            lock.release()


def _run_locked(job: Job) -> Dict[str, Any]:
    job.notify("started", {"device": str(job.device),
                           "env": env.describe(job.device, root=str(job.cfg.sampler.get("sysfs_root", "/")))})
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
        job.failure = {"kind": kind, "message": describe_error(exc)}
        log.debug("job failed", exc_info=True)
    finally:
        # a second Ctrl-C (or the one a parent forwards) waits until the results are written and memory freed
        with _sigint_deferred():
            samples = _stop_sampler(job)
            if not user_error:
                _write_or_say(job, samples)
                job.notify("summary", job.last_summary)  # before cleanup: a crash there must not lose it
            _release(job)
    return job.last_summary


LOCK_MODES = ("wait", "fail", "off")


class DeviceLock:
    """One measurement per device at a time, across processes: an flock on `<lock_dir>/mtbench-<device>.lock`
    (the kernel releases it when the holder exits, however it ends). The file holds the holder's pid.

    The folder may be shared by every user (/tmp): the file is opened without following a link, only a regular
    file with one name is used, its mode is changed only when this call created it, and it is written (the pid)
    only when it is the caller's own. Another user's lock file is locked read-only (flock needs no write).
    """

    def __init__(self, device: torch.device, mode: str, lock_dir: str) -> None:
        if mode not in LOCK_MODES:
            raise UsageError(f"device_lock={mode!r} is not known; allowed: {', '.join(LOCK_MODES)}")
        if mode != "off" and not os.path.isabs(lock_dir):
            # an empty MTBENCH_LOCK_DIR= meant the current folder: jobs started in two folders never met
            raise UsageError(f"lock_dir={lock_dir!r} (or MTBENCH_LOCK_DIR) is not an absolute folder; allowed: an "
                             "absolute path every mtbench user can write (default /tmp), or device_lock=off")
        self.mode = mode
        self.name = str(device)
        key = "cpu" if device.type == "cpu" else f"{device.type}-{_device_uuid(device)}"
        self.path = Path(lock_dir) / f"mtbench-{key}.lock"
        self.fd: Optional[int] = None
        self.writable = False

    def acquire(self) -> None:
        if self.mode == "off":
            return
        self.fd, self.writable = self._open()
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 32, 0).decode(errors="replace").strip() or "?"
            if self.mode == "fail":
                self.release()
                raise UsageError(f"{self.name} is being measured by another mtbench job (pid {holder}); "
                                 "device_lock=wait waits for it, device_lock=off measures anyway") from None
            print(f"mtbench: waiting for {self.name}: another mtbench job (pid {holder}) is measuring it",
                  file=sys.stderr, flush=True)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        if self.writable:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, str(os.getpid()).encode(), 0)

    def _open(self) -> Tuple[int, bool]:
        """(descriptor, whether this process may write its pid there); a UsageError where the file is refused."""
        folder, name = str(self.path.parent), self.path.name
        where = f"lock_dir={folder!r}: {name}"
        # O_NOFOLLOW: a link planted in a shared folder would point the open (and a chmod) at another file;
        # O_NONBLOCK: a planted FIFO must not block the open; O_EXCL: a file this call creates is its own
        flags = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(self.path, flags | os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
            os.fchmod(fd, 0o666)  # the umask took the others' write bit: every user shares this lock
            return fd, True
        except FileExistsError:
            pass  # another job's (or a planted) file: judged below
        except OSError as exc:
            raise UsageError(f"{where} cannot be created ({exc.strerror}); allowed: a writable folder, "
                             "or device_lock=off") from None
        try:
            try:
                fd, writable = os.open(self.path, flags | os.O_RDWR), True
            except PermissionError:  # another user's file (or fs.protected_regular in /tmp): flock needs no write
                fd, writable = os.open(self.path, flags | os.O_RDONLY), False
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UsageError(f"{where} is a symbolic link, refused (another user may have planted it); "
                                 "allowed: a regular file, or remove the link, or device_lock=off") from None
            raise UsageError(f"{where} cannot be opened ({exc.strerror}); allowed: a folder every mtbench user "
                             "can write, or device_lock=off") from None
        info = os.fstat(fd)
        problem = None
        if not stat.S_ISREG(info.st_mode):
            problem = "is not a regular file"
        elif info.st_nlink != 1:
            problem = f"has {info.st_nlink} hard links (it may be another file's name)"
        if problem is not None:
            os.close(fd)
            raise UsageError(f"{where} {problem}, refused; allowed: a regular lock file of one name, or remove it, "
                             "or device_lock=off")
        return fd, writable and info.st_uid == os.geteuid()  # never write into another user's file

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None


def _device_uuid(device: torch.device) -> str:
    try:
        return str(torch.cuda.get_device_properties(device).uuid)
    except (AttributeError, RuntimeError):  # torch builds without the uuid property
        return str(device.index or 0)


@contextlib.contextmanager
def _sigint_deferred():
    """Hold SIGINT back while the block runs, then give a held one to the handler that was there before
    (which raises KeyboardInterrupt; a job process's handler also ignores any later one)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: List[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending:
        if callable(previous):
            previous(signal.SIGINT, None)
        elif previous == signal.SIG_DFL:
            raise KeyboardInterrupt


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
        print(f"mtbench: error: the results of this job could not be written to {job.out_dir}: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def _release(job: Job) -> None:
    """Drop the model, optimizer state and batches; an error here (a sticky CUDA error) is logged, and the
    failure recorded for the job stays the one that ended it."""
    try:
        if job.workload is not None:
            job.workload.close()
    except Exception:
        log.warning("closing the workload failed", exc_info=True)
    job.workload = None
    try:
        memory.release_memory(job.device)
        budget.release_budget(job.device)
    except Exception:
        log.warning("releasing memory after the job failed", exc_info=True)


# ---------------------------------------------------------------------------------------------------------
# Each job in a process of its own. The parent holds the sweep: it imports torch but never runs a torch op nor
# touches CUDA (neither CUDA nor GNU OpenMP's thread pool survives a fork), so forking a job is cheap and safe.
# A job that the kernel kills (the OOM killer on a Jetson, whose GPU shares the DRAM), that segfaults or that
# leaves a sticky CUDA error ends only its own process; the parent writes its summary and the sweep goes on.

DIED = "the job's process died before it wrote its results"


def run_isolated(cfg: DictConfig, out_dir: Path, timing: Optional[Dict[str, float]] = None) -> Dict[str, Any]:
    """Run one job in a forked child process and return its summary (the parent writes it if the child died).

    Raises UsageError for a bad value the user gave (nothing written) and KeyboardInterrupt, once the child
    has written its "interrupted" summary, when the user pressed Ctrl-C. `timing`, if given, receives
    `wall_s` (this call) and `child_s` (the child's own run, from fork to its last message): their difference
    is what isolation costs a job.
    """
    import torchvision  # noqa: F401 - imported once here rather than in every job's process (no torch op runs)

    wall_start = time.monotonic()
    out_dir = Path(out_dir)
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    oom_before = OomKills()
    child = context.Process(target=_child_main, args=(cfg, out_dir, sender, os.getpid()), name="mtbench-job")
    child.start()
    sender.close()
    messages: Dict[str, Any] = {}
    interrupted = False
    alive = True
    while True:
        try:
            if receiver.poll(0.1):
                with _sigint_deferred():  # a message is read whole, or the pipe would lose its framing
                    kind, payload = receiver.recv()
                messages[kind] = payload
            elif not alive:
                break  # it exited and everything it sent has been read
            else:
                alive = child.is_alive()  # one more poll after this, for what it sent just before exiting
        except EOFError:  # the child closed its end: it is about to exit
            child.join()
            break
        except KeyboardInterrupt:
            # Ctrl-C on a terminal reaches the child too; a signal sent to this process alone is passed on.
            # The child records "interrupted", writes its results and exits; this process waits for that.
            interrupted = True
            if child.is_alive():
                os.kill(child.pid, signal.SIGINT)
    child.join()
    receiver.close()
    if timing is not None:
        timing.update(wall_s=time.monotonic() - wall_start, child_s=messages.get("child_seconds", math.nan))
    if "usage" in messages:
        raise UsageError(messages["usage"])
    summary = messages.get("summary")
    if summary is None:
        if interrupted:
            messages["interrupted"] = True
        summary = _summary_of_dead_job(cfg, out_dir, child.exitcode, messages, oom_before.since())
    if interrupted or messages.get("interrupted"):
        raise KeyboardInterrupt
    return summary


def _die_with_parent(parent_pid: int) -> None:
    """A job whose sweep was killed must not train on as an orphan (Linux: PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _child_main(cfg: DictConfig, out_dir: Path, sender, parent_pid: int) -> None:
    _die_with_parent(parent_pid)

    def on_sigint(signum, frame):
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the first Ctrl-C ends the job; more change nothing
        raise KeyboardInterrupt

    # a process started with SIGINT ignored (a script's `mtbench ... &` in a shell without job control) keeps
    # ignoring it, as the parent does
    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        signal.signal(signal.SIGINT, on_sigint)
    started = time.monotonic()
    try:
        summary = run_job(cfg, out_dir, notify=lambda kind, payload: sender.send((kind, payload)))
        sender.send(("summary", summary))
    except UsageError as exc:
        sender.send(("usage", str(exc)))
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # its summary is on the way; more Ctrl-C change nothing
        sender.send(("interrupted", True))
        try:
            sender.send(("summary", results.read_summary(out_dir)))
        except (OSError, ValueError):
            pass
    except BaseException as exc:  # an error outside the job's own try (e.g. CUDA fails to start): a result too
        sender.send(("crashed", describe_error(exc)))
        log.debug("job process failed", exc_info=True)
    finally:
        sender.send(("child_seconds", time.monotonic() - started))
        sender.close()


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class OomKills:
    """Kills by the kernel's OOM killer while a job ran, from the job's own memory cgroup (v2 memory.events,
    v1 memory.oom_control: each counts the kills of its processes, by the global OOM killer too); only the
    machine-wide count in /proc/vmstat where no cgroup file is readable (then it cannot say whose)."""

    def __init__(self) -> None:
        self.path = _memcg_oom_file()
        self.before = _read_oom_kill(self.path) if self.path else None
        self.machine_before = _read_oom_kill("/proc/vmstat")

    def since(self) -> Dict[str, Any]:
        """{"own": kills in the job's cgroup or None, "machine": kills on the machine or None, "file": ...}"""
        own = _read_oom_kill(self.path) if self.path else None
        machine = _read_oom_kill("/proc/vmstat")
        return {"own": None if own is None or self.before is None else own - self.before,
                "machine": None if machine is None or self.machine_before is None else machine - self.machine_before,
                "file": self.path}


def _memcg_oom_file() -> Optional[str]:
    """This process's memory cgroup counter file (a forked job stays in its parent's cgroup)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    for _, controllers, path in lines:
        if controllers == "":  # cgroup v2
            candidate = os.path.join("/sys/fs/cgroup", path.lstrip("/"), "memory.events")
        elif "memory" in controllers.split(","):  # cgroup v1
            candidate = os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"), "memory.oom_control")
        else:
            continue
        if _read_oom_kill(candidate) is not None:
            return candidate
    return None


def _read_oom_kill(path: str) -> Optional[int]:
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(b"oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _summary_of_dead_job(cfg: DictConfig, out_dir: Path, exitcode: Optional[int], messages: Dict[str, Any],
                         oom_kills: Dict[str, Any]) -> Dict[str, Any]:
    """The summary of a job whose process ended without sending one, written by the parent."""
    if "interrupted" in messages:  # Ctrl-C before the job had anything to write
        failure = {"kind": "interrupted", "message": "interrupted by the user (Ctrl-C)"}
    elif "crashed" in messages:
        failure = {"kind": "oom" if is_oom_text(messages["crashed"]) else "error",
                   "message": messages["crashed"]}
    elif exitcode is not None and exitcode < 0:
        name = signal_name(-exitcode)
        if exitcode == -signal.SIGKILL and oom_kills["own"]:
            failure = {"kind": "oom", "message": f"the job's process was killed by the kernel's OOM killer ({name}; "
                                                 f"oom_kill in {oom_kills['file']} rose by {oom_kills['own']} while it ran)"}
        else:
            failure = {"kind": "killed", "message": f"the job's process was killed by signal {-exitcode} ({name})"}
            if exitcode == -signal.SIGKILL and oom_kills["own"] is None and oom_kills["machine"]:
                failure["message"] += (f"; the OOM killer killed {oom_kills['machine']} process(es) on this machine "
                                       "meanwhile (/proc/vmstat), possibly this one: no cgroup counter says whose")
    else:
        failure = {"kind": "error", "message": f"the job's process exited with code {exitcode} before writing its results"}
    spec = JobSpec.from_cfg(cfg)
    started = messages.get("started") or {}
    unavailable = {k: DIED for k in ("cpu_util_pct", "gpu_util_pct", "power_w", "energy_j", "mem_peak_bytes")}
    summary: Dict[str, Any] = {
        "schema": results.SCHEMA,
        "model": spec.model,
        "batch_size": spec.batch_size,
        "device": started.get("device", spec.device),
        "data": messages.get("data", "unknown"),
        "success": False,
        "failure": failure,
        "warmup_steps": spec.warmup,
        "measured_steps": 0,
        "step_time_s": None,
        "throughput_samples_per_s": None,
        "cpu_util_pct": None,
        "gpu_util_pct": None,
        "power_w": None,
        "energy_j": None,
        "unavailable": unavailable,
        "mem_peak_bytes": None,
        "mem_peak_source": None,
        "target": cfg.get("target", {}).get("name", "none"),
        "budget_bytes": cfg.get("target", {}).get("memory_budget_bytes"),
        "sampler": {"interval_ms": cfg.sampler.interval_ms, "samples": 0},
        "env": started.get("env") or env.host(),
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    try:
        results.write_summary(out_dir, summary)
    except OSError as exc:
        summary["write_error"] = f"{type(exc).__name__}: {exc}"
        print(f"mtbench: error: the results of this job could not be written to {out_dir}: {exc}", file=sys.stderr)
    return summary


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
        header, rows = header + ["plan"], [row + [job.planner.labels.get(row[0])] for row in rows]
        results.write_steps(job.out_dir, header, rows)
        results.write_samples(job.out_dir, samples)
    results.write_summary(job.out_dir, summary)
    job.last_summary = summary
