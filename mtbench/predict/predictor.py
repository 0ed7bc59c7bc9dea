"""Predict one job (model, batch, target): peak memory split into tensors and runtime, FLOPs, step time, max batch."""
from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

import numpy as np
import torch

from mtbench.config import default_option
from mtbench.errors import UsageError
from mtbench.predict import allocator, calibration, mkl_buffers, opcost
from mtbench.predict.maxsearch import largest_batch
from mtbench.predict.non_tensor import (DEFAULT_NON_TENSOR_BYTES_CPU, DEFAULT_NON_TENSOR_BYTES_CPU_LIVE,
                                         DEFAULT_NON_TENSOR_NOTE_CPU, DEFAULT_NON_TENSOR_NOTE_CPU_LIVE,
                                         cuda_non_tensor_bytes)
from mtbench.predict.batches import trace_takes, with_batches
from mtbench.predict.trace import StepTrace, breakdown, trace_step, transient_bytes
from mtbench.predict.tracers import side_by_side


@dataclass
class Prediction:
    model: str
    batch_size: int
    target: str  # conf/target name ("none": this host)
    device: str  # the device the job would train on: "cpu" or "cuda"
    traced: str  # how the step was traced (fake tensors, or real ones and why)
    tensors_bytes: int  # peak of live tensors (on CUDA rounded as the caching allocator does: max_memory_allocated)
    breakdown_bytes: Dict[str, int]  # tensors_bytes by part (sums to it)
    allocator_reserved_bytes: Optional[int]  # CUDA: the allocator model's reserved peak (segments); None on CPU
    non_tensor_bytes: int  # training memory that is not tensors (see non_tensor_note)
    non_tensor_note: str
    peak_bytes: int  # what the job needs: tensors (or the reserved segments on CUDA) + runtime
    budget_bytes: Optional[int]  # the target's budget (None: no target)
    fits: Optional[bool]  # peak_bytes <= budget_bytes
    flops: int  # FLOPs of one training step
    forward_flops: int
    bytes_moved: int  # input + output bytes of every op of the step (a DRAM-traffic proxy)
    ops: int
    roofline_s: Optional[float]  # max(FLOPs / peak, bytes / bandwidth) from the target's figures
    step_time_s: Optional[float]  # predicted step time (None: no calibration and no roofline)
    time_note: str  # calibrated from what, or why not
    calibrated: bool  # the step time comes from a calibration of this target and device
    trace_s: float  # how long the prediction's trace took
    max_batch: Optional[int] = None  # the largest batch whose peak fits the budget (when asked)
    max_batch_note: str = ""
    error: Optional[str] = None  # why there is no prediction for this job

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass
class Predictor:
    """Predicts jobs for one target; traces are cached per (model, batch, overrides)."""

    target_name: str = "none"
    device: str = "auto"  # "cpu", "cuda" or "auto": target none, cuda when this host has one; a board, its GPU
    overrides: Sequence[str] = ()  # further config overrides (model.workload.seq_len=128, target.memory_budget_bytes=N)
    calibration_path: Optional[str] = None  # a calibration file instead of the stored one for this target and device
    stored_calibration: bool = True  # False: no calibration, and the trace models this host's cache (calibrate's use)
    job_config: Any = None  # a job's composed config: predict that job at other batches (the planner's use)
    first_model: Optional[str] = None  # the model traced first, where known: its config, composed now, is kept
    _traces: Dict[Tuple[Any, ...], Tuple[StepTrace, str]] = field(default_factory=dict)
    _padded: Set[Tuple[str, int]] = field(default_factory=set)  # jobs that pad each batch to its own length
    _job_data: Dict[str, Any] = field(default_factory=dict)  # each model's own data node (the batch changes nothing)
    _composed: Dict[Tuple[Any, ...], Any] = field(default_factory=dict)  # a config as composed, at its first batch

    def __post_init__(self) -> None:
        from mtbench.device.budget import job_budget, target_from_cfg
        from mtbench.device.peak import measured_cpu_malloc

        cfg = self.compose(self.first_model, 1) if self.first_model else \
            self.compose(None, 1, [o for o in self.overrides if o.startswith(("target.", "memory."))])
        self.target = target_from_cfg(cfg)
        memory = cfg.get("memory") or {}
        # the malloc a CPU job's training memory is measured under with this config
        self.cpu_malloc = measured_cpu_malloc(str(memory.get("cpu_malloc", "auto")))
        self.cpu_malloc_live = self.cpu_malloc == "live"
        # a CPU job measures its training memory in two steps of a thread of its own where nothing holds it to a
        # budget under glibc's own malloc (device/peak.measure_training_step), else in its measured steps
        self.measured_in_own_thread = str(memory.get("cpu_malloc", "auto")) == "auto" and job_budget(cfg)[0] is None
        if self.device not in ("cpu", "cuda", "auto"):
            raise UsageError(f"device={self.device!r} is not known; allowed: cpu, cuda, auto")
        if self.device == "auto":
            # a Jetson trains on its GPU; device=cpu with a board: a CPU job held to the board's budget
            self.device = "cuda" if torch.cuda.is_available() or not self.target.is_none else "cpu"
        key = calibration.calibration_key(self.target.name, self.device)
        self.calibration = calibration.load(key, self.calibration_path) if self.stored_calibration else None
        self.cache_bytes, self.cache_note = self._cache()

    def _cache(self) -> Tuple[int, str]:
        """The last-level cache the trace models (cache_model.RecentReads): a calibration's own (it was fitted with it;
        one made before it has none: 0), else this host's where the job would train here, else none."""
        from mtbench.device.caches import cpu_last_level_cache_bytes, gpu_l2_cache_bytes

        if self.calibration is not None:
            try:
                size = max(0, int(self.calibration.cache_bytes or 0))
            except (TypeError, ValueError):  # a hand-edited file: no cache, as a calibration made before it
                size = 0
            return size, f"{size / 2**20:g} MiB, as the calibration was fitted"
        here = cpu_last_level_cache_bytes() if self.device == "cpu" else (
            gpu_l2_cache_bytes() if self.target.is_none else None)
        if here is None:
            return 0, "not known for this device: every re-read of a matrix product counts"
        return here, f"{here / 2**20:g} MiB, this host's {'CPU last-level cache' if self.device == 'cpu' else 'GPU L2'}"

    def clear_traces(self) -> None:
        """Forget the cached traces (a memory plan changes what a (model, batch) trace holds)."""
        self._traces.clear()

    def compose(self, model: Optional[str], batch: int, extra: Optional[Sequence[str]] = None,
                data: Optional[str] = "synthetic") -> Any:
        if self.job_config is not None:  # the job's own config, at `batch`
            from omegaconf import OmegaConf

            composed = OmegaConf.create(OmegaConf.to_container(self.job_config, resolve=True))
            composed.batch = batch
            return composed
        extra = self.overrides if extra is None else extra
        key = (model, data, tuple(extra))
        if key not in self._composed:  # composing takes a third of a second; only `batch` differs between batches
            self._composed[key] = self._compose(model, batch, extra, data)
        composed = copy.deepcopy(self._composed[key])
        composed.batch = batch
        return composed

    def _compose(self, model: Optional[str], batch: int, extra: Sequence[str], data: Optional[str]) -> Any:
        from hydra import compose, initialize_config_dir
        from hydra.errors import HydraException

        from mtbench.config import conf_dir, group_options

        overrides = [f"target={self.target_name}", f"batch={batch}", *([f"data={data}"] if data else []), *extra]
        if model is not None:
            if model not in group_options("model"):
                raise UsageError(f"model={model!r} is not known; allowed: {', '.join(group_options('model'))}")
            overrides.insert(0, f"model={model}")
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            try:
                return compose(config_name="config", overrides=overrides)
            except HydraException as exc:
                raise UsageError(str(exc).splitlines()[0]) from None

    def trace(self, model: str, batch: int, stat: str = "max") -> Tuple[StepTrace, str]:
        """The step's trace and how it was made, cached: on the largest batch the job's measured steps take (its
        memory), or with `stat` "median" or "min" on the batch of that size (a step time's statistic) where the job
        pads each batch to its own length; any other job's steps are alike: its one trace."""
        key = (model, batch)
        if key not in self._traces:
            self._traces[key] = self._trace(model, batch)
        if stat != "max" and key in self._padded:
            key = (model, batch, stat)
            if key not in self._traces:
                self._traces[key] = self._trace(model, batch, stat)
        return self._traces[key]

    def _trace(self, model: str, batch: int, stat: str = "max") -> Tuple[StepTrace, str]:
        from mtbench.config import instantiate
        from mtbench.workload.base import MAX_PREPARED_BATCHES, SetupContext

        cfg = self.compose(model, batch)
        # a GPU target is traced on the CPU where this host has no GPU (the autograd engine needs a real
        # device for CUDA fake tensors); the CUDA allocator's rounding is applied afterwards
        trace_device = torch.device("cuda" if self.device == "cuda" and torch.cuda.is_available() else "cpu")
        # the runner prepares `batches` input batches and holds them all; one is traced (making inputs on fake
        # tensors is slow: BERT pads each example with its own ops) and the others are added as inputs
        later = int(cfg.warmup) + int(cfg.steps)
        batches = min(MAX_PREPARED_BATCHES, later)
        data, data_note = self._data(model, batch, cfg)
        ctx = SetupContext(device=trace_device, batch_size=batch, data=data, seed=int(cfg.seed), batches=1)

        every = {"batch": False}  # the workload prepares each of the job's batches (PADDED_PER_BATCH)

        def make() -> Any:
            torch.manual_seed(int(cfg.seed))
            workload = instantiate(cfg.model.workload, "model.workload")
            if getattr(workload, "PADDED_PER_BATCH", False) and batches > 1:
                every["batch"] = True
                self._padded.add((model, batch))
                trace_takes(workload, batches, range(int(cfg.warmup), later), stat)
            return workload

        def held(trace: StepTrace) -> StepTrace:
            return trace if every["batch"] else with_batches(trace, batches)

        def on_fake(ctx: SetupContext) -> StepTrace:
            return held(trace_step(make, ctx, cuda_optimizers=self.device == "cuda", later_steps=later,
                                   cache_bytes=self.cache_bytes, fresh_mapping_bytes=self._fresh_mapping_bytes()))

        try:
            return on_fake(ctx), f"fake tensors on {trace_device.type}{data_note}"
        except UsageError as exc:
            if not data_note:
                raise
            # the job's own source could not be run here (no ALE): synthetic data, and the note says so
            from dataclasses import replace

            ctx = replace(ctx, data=instantiate(cfg.data, "data"))
            return on_fake(ctx), f"fake tensors on {trace_device.type}; on synthetic data, not the job's: {exc}"
        except Exception as exc:  # a kernel that needs values fake tensors lack: trace real tensors instead
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        cpu_ctx = SetupContext(device=torch.device("cpu"), batch_size=batch, data=ctx.data, seed=ctx.seed,
                               batches=1)
        trace = trace_step(make, cpu_ctx, fake=False, cuda_optimizers=self.device == "cuda", later_steps=later,
                           cache_bytes=self.cache_bytes)
        return held(trace), f"real tensors on cpu (allocates; on fake tensors: {why})"

    def _data(self, model: str, batch: int, cfg: Any) -> Tuple[Any, str]:
        """The trace's data source: the synthetic one of `cfg`, or the job's own where that is traced as is (an
        emulator: DataSource.traced_as_is), with the note that says so."""
        from mtbench.config import check_target, instantiate

        job_data = self._job_data_node(model)
        target = str(job_data.get("_target_", ""))
        if target and target != str(cfg.data.get("_target_", "")):
            if getattr(check_target(target, "data"), "traced_as_is", False):  # only an allowed source is imported
                source = instantiate(job_data, "data")
                return source, f"; on the job's own data ({source.label}: its time and memory are the job's)"
        return instantiate(cfg.data, "data"), ""

    def _job_data_node(self, model: str) -> Any:
        if model not in self._job_data:  # where the job's data is the trace's (synthetic), one composed config serves
            same = default_option("data", model, self.overrides) == "synthetic"
            self._job_data[model] = self.compose(model, 1, data="synthetic" if same else None).get("data") or {}
        return self._job_data[model]

    def prepare(self, model: str) -> None:
        """Compose `model`'s configs (its trace's, its data node) before tracers fork: they need not compose them."""
        self.compose(model, 1)
        self._job_data_node(model)

    def _fresh_mapping_bytes(self) -> Optional[int]:
        """From this size a CPU job's malloc maps an allocation fresh: glibc's fixed threshold under `live`, the
        largest its dynamic one reaches under its own settings; None under `cached` (a freed block in the heap, which
        is never trimmed, serves the next request: every byte of it resident)."""
        from mtbench.device.peak import CACHED_MMAP_BYTES, MMAP_THRESHOLD_BYTES

        if self.cpu_malloc == "live":
            return MMAP_THRESHOLD_BYTES
        return None if self.cpu_malloc == "cached" else CACHED_MMAP_BYTES

    def predict(self, model: str, batch: int, timed: bool = True) -> Prediction:
        """The job's prediction. A padded job's step time comes from the trace of its time statistic's batch (see
        `trace`); timed=False makes one trace, the memory's, and times that (a search that reads only the peak)."""
        trace, traced = self.trace(model, batch)
        if self.device == "cuda":
            peaks = allocator.replay(trace.events)
            tensors = peaks.allocated_bytes
            parts = breakdown(peaks.breakdown_bytes, trace.inputs_bytes, trace.state_bytes)
            parts["other"] += tensors - sum(parts.values())  # storage the replay saw on no tracked kind
            reserved: Optional[int] = peaks.reserved_bytes
        else:
            tensors, parts, reserved = trace.peak_tensor_bytes, dict(trace.breakdown_bytes), None
        runtime, non_tensor_note = self._runtime(trace, parts)
        held, held_note = self.held_outside(trace)
        runtime, non_tensor_note = runtime + held, non_tensor_note + held_note
        peak = (reserved if reserved is not None else tensors) + runtime
        budget = self.target.memory_budget_bytes
        stat = str(getattr(self.calibration, "time_stat", None) or "median")
        timed_on = self.trace(model, batch, stat)[0] if timed else trace
        step_s, roofline_s, time_note = self._host_time(timed_on, *self._time(timed_on))
        if timed_on is not trace:
            time_note += f"; its batches padded each to its own length: timed on the batch of {stat} size"
        return Prediction(
            model=model, batch_size=batch, target=self.target.name, device=self.device, traced=traced,
            tensors_bytes=int(tensors), breakdown_bytes={k: int(v) for k, v in parts.items()},
            allocator_reserved_bytes=reserved, non_tensor_bytes=int(runtime), non_tensor_note=non_tensor_note,
            peak_bytes=int(peak), budget_bytes=budget, fits=None if budget is None else peak <= budget,
            flops=trace.flops, forward_flops=trace.forward_flops, bytes_moved=trace.bytes_moved, ops=trace.ops,
            roofline_s=roofline_s, step_time_s=step_s, time_note=time_note,
            calibrated=step_s is not None and self.calibration is not None and (
                self.calibration.time_coef is not None or self.calibration.op_coef is not None),
            trace_s=trace.trace_s,
        )

    def _runtime(self, trace: StepTrace, parts: Dict[str, int]) -> Tuple[int, str]:
        cal = self.calibration
        if cal is not None and cal.non_tensor_bytes is not None:
            conv_weight_bytes = trace.op_classes.get("conv", {}).get("weight_bytes", 0.0)
            runtime = (cal.non_tensor_bytes + cal.non_tensor_per_op_bytes * trace.ops
                       + cal.non_tensor_per_transient_byte * transient_bytes(parts)
                       + cal.non_tensor_per_conv_weight_byte * conv_weight_bytes)
            return int(runtime), f"{cal.non_tensor_note}; {cal.describe()}"
        if self.device == "cuda":
            return cuda_non_tensor_bytes(self.target.capability())
        if self.cpu_malloc_live:
            return DEFAULT_NON_TENSOR_BYTES_CPU_LIVE, DEFAULT_NON_TENSOR_NOTE_CPU_LIVE
        return DEFAULT_NON_TENSOR_BYTES_CPU, DEFAULT_NON_TENSOR_NOTE_CPU

    def held_outside(self, trace: StepTrace) -> Tuple[int, str]:
        """What a CPU job holds beyond its tensors and the calibrated runtime, counted rather than fitted, and what
        that is: the workload's arrays (Workload.host_bytes) and the buffers MKL keeps for its products on this
        host (mkl_buffers). 0 on a GPU, whose budget counts the allocator's memory only."""
        if self.device != "cpu":
            return 0, ""
        held, note = trace.host_bytes, ""
        if trace.host_bytes:
            note = (f"; + {trace.host_bytes / 2**20:.1f} MiB the workload holds outside tensors "
                    "(Workload.host_bytes: a replay buffer's touched pages, an emulator's memory)")
        if trace.products:
            kept, why = self.mkl_kept(trace)
            held, note = held + (kept or 0), note + (f"; + {why}" if kept is not None else f"; MKL's buffers: {why}")
        return held, note

    def mkl_kept(self, trace: StepTrace) -> Tuple[Optional[int], str]:
        """What MKL keeps of the traced products' buffers in the job, as this config measures its training memory
        (mkl_buffers.kept_bytes; None and why where MKL's statistics cannot be read)."""
        return mkl_buffers.kept_bytes(trace.products, trace.products[trace.measured_products:],
                                      self.measured_in_own_thread)

    def _host_time(self, trace: StepTrace, step_s: Optional[float], roofline_s: Optional[float],
                   note: str) -> Tuple[Optional[float], Optional[float], str]:
        """The ops' time plus what the workload spent outside torch's ops (an emulator), timed by the trace on this
        host: counted where the job would run here (target none), said and left out for a board's CPU."""
        if not trace.host_s or step_s is None:
            return step_s, roofline_s, note
        outside = f"{trace.host_s:.4f} s a step outside torch's ops (Workload.host_seconds: an emulator's steps)"
        if not self.target.is_none:
            return step_s, roofline_s, f"{note}; not counted: {outside} on this host, not known for {self.target.name}"
        return step_s + trace.host_s, roofline_s, f"{note}; + {outside}, timed in the trace on this host"

    def _time(self, trace: StepTrace) -> Tuple[Optional[float], Optional[float], str]:
        peak_flops, bandwidth = self.target.peak_fp32_flops, self.target.dram_bandwidth_bytes_per_s
        roofline = None
        if peak_flops and bandwidth:
            roofline = max(trace.flops / peak_flops, trace.bytes_moved / bandwidth)
        cal = self.calibration
        if cal is not None and cal.op_coef is not None and list(cal.op_features) == list(opcost.FEATURES):
            return (float(opcost.step_features(trace.op_classes) @ np.array(cal.op_coef)), roofline,
                    f"{cal.describe()}; cache modelled: {self.cache_note}")
        if cal is not None and cal.time_coef is not None:
            if cal.time_scaled and not (peak_flops and bandwidth):
                return None, roofline, f"the calibration is scaled by peak figures target {self.target.name} lacks"
            scale = (peak_flops, bandwidth) if cal.time_scaled else (None, None)
            x = calibration.time_features(trace.flops, trace.bytes_moved, trace.ops, *scale)
            return float(x @ cal.time_coef), roofline, cal.describe(opcost.FEATURES)
        if roofline is not None:
            return roofline, roofline, ("not calibrated: the roofline of the target's peak FP32 FLOP/s and DRAM "
                                        "bandwidth, a lower bound (run `mtbench calibrate DIR` on a sweep of the "
                                        "board)")
        return None, None, ("not calibrated, and target none has no peak figures: run a sweep here and "
                            "`mtbench calibrate DIR`")

    def max_batch(self, model: str, anchor: int, beside: Any = None) -> Tuple[Optional[int], str]:
        """The largest batch whose predicted peak fits the target's budget, to 1 % (maxsearch.largest_batch; `anchor`
        is a batch known to trace). One trace at a time, or with `beside` (tracers.Tracers forked from this Predictor
        before it traced) each round's batches side by side: the first here, the others there."""
        budget = self.target.memory_budget_bytes
        if budget is None:
            return None, "target none has no memory budget"
        guess = self._first_guess(model, anchor, budget)
        beside = beside if guess is not None else None  # no guess: one at a time from the anchor, not 4 and 16 x it
        peaks = side_by_side(lambda b: self.peak_or_error(model, b), model, beside)
        best, why, _ = largest_batch(peaks, budget, anchor, width=1 + len(beside or ()), guess=guess)
        return best, why

    def _first_guess(self, model: str, anchor: int, budget: int) -> Optional[Tuple[int, int]]:
        """(the anchor's peak, the batch where it meets the budget if the anchor's peak is a fixed part, the
        parameters, gradients, optimizer state and runtime, plus a part per sample); None where the anchor has no
        prediction (its trace failed: the search raises that)."""
        try:
            p = self.predict(model, anchor, timed=False)
        except Exception:  # noqa: BLE001 - the search traces it again and raises what stopped it
            return None
        parts = getattr(p, "breakdown_bytes", None) or {}
        fixed = sum(parts.get(k, 0) for k in ("parameters", "gradients", "optimizer_state")) + \
            getattr(p, "non_tensor_bytes", 0)
        per_sample = (p.peak_bytes - fixed) / anchor
        if per_sample <= 0:
            return None
        return int(p.peak_bytes), max(1, int((budget - fixed) / per_sample))

    def peak_or_error(self, model: str, batch: int) -> Union[int, Exception]:
        """The predicted peak, or the exception that stopped the trace (a UsageError is raised)."""
        try:
            return int(self.predict(model, batch, timed=False).peak_bytes)
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001 - a batch the workload refuses, or a model that cannot be traced
            return exc


def failed(model: str, batch: int, target: str, device: str, exc: BaseException) -> Prediction:
    """A row that says why a job could not be predicted (every figure None, never a made-up 0)."""
    msg = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    none: Any = None
    return Prediction(model=model, batch_size=batch, target=target, device=device, traced="", tensors_bytes=none,
                      breakdown_bytes={}, allocator_reserved_bytes=None, non_tensor_bytes=none, non_tensor_note="",
                      peak_bytes=none, budget_bytes=None, fits=None, flops=none, forward_flops=none,
                      bytes_moved=none, ops=none, roofline_s=None, step_time_s=None, time_note="", calibrated=False,
                      trace_s=0.0, error=msg)


def dumps(predictions: List[Prediction]) -> str:
    return json.dumps([p.to_dict() for p in predictions], indent=2, default=str)
