"""Trace one training step of a workload on fake tensors: tensor memory by kind, FLOPs, bytes moved, ops."""
from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

from mtbench.device.glibc import MMAP_THRESHOLD_MAX
from mtbench.predict import cache_model, conv_scratch, first_step, mkl_buffers, opcost, rnn_workspace
from mtbench.workload.breakdown import PARTS as BREAKDOWN_KEYS  # the measured breakdown's keys: ours too
from mtbench.workload import torch_internals
from mtbench.workload.base import SetupContext, Workload


@dataclass
class StepTrace:
    """What one traced training step (the steady one: optimizer state exists, gradients of a first step are alive)
    needs."""

    device: str  # the device traced on, e.g. "cpu" or "cuda"
    fake: bool  # traced on fake tensors (nothing allocated) or on real ones
    peak_tensor_bytes: int  # peak of live tensor storage during the step (before any allocator rounding)
    breakdown_bytes: Dict[str, int]  # BREAKDOWN_KEYS at that peak; sums to peak_tensor_bytes
    inputs_bytes: int  # tensors the workload holds between steps that are neither parameters nor optimizer state
    state_bytes: int  # the optimizers' state tensors
    flops: int  # FLOPs of the step (torch.utils.flop_counter formulas), forward + backward + optimizer
    forward_flops: int  # of which outside autograd's backward
    bytes_moved: int  # sum over ops of input + output tensor bytes (views excluded): a DRAM-traffic proxy
    ops: int  # aten ops run (views excluded): a kernel-launch / dispatch count
    # per op class (opcost.CLASSES): {"flops", "grouped_flops" (convolutions with groups > 1), "bytes", "ops"}
    op_classes: Dict[str, Dict[str, float]] = field(default_factory=dict)
    # (storage key, bytes | -1 freed | -2 changed kind, kind) in order: what the allocator model replays
    events: List[Tuple[int, int, str]] = field(default_factory=list)
    trace_s: float = 0.0  # wall time the trace took
    host_bytes: int = 0  # what the workload holds outside tensors after the job's steps (Workload.host_bytes)
    host_s: float = 0.0  # seconds a step spent outside torch's ops on this host (Workload.host_seconds)
    products: List[mkl_buffers.Shape] = field(default_factory=list)  # both steps' matrix products MKL would run
    measured_products: int = 0  # products[measured_products:] are the measured step's


def _walk_state(obj: Any, seen: set, depth: int = 0) -> Iterator[Any]:
    """Modules, optimizers and tensors a workload holds, found through its attributes (lists, dicts too)."""
    if id(obj) in seen or depth > 4:
        return
    seen.add(id(obj))
    if isinstance(obj, (torch.Tensor, torch.nn.Module, torch.optim.Optimizer)):
        yield obj
        return
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _walk_state(v, seen, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _walk_state(v, seen, depth + 1)
    elif depth == 0 or (hasattr(obj, "__dict__") and type(obj).__module__.split(".")[0] in ("models", "mtbench")):
        for v in vars(obj).values():
            yield from _walk_state(v, seen, depth + 1)


SMALL_NUMEL = 4096  # tensors up to this many elements also carry real values (lengths, step counters, targets)


class _StepCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts ops and bytes moved, splits FLOPs into forward and backward, and gives small tensors real values.

    Sits above FlopCounterMode, so the FLOPs an op adds are read as the counter's total before and after it.
    A fake tensor has no values, but a workload may read some (`int(lengths.max())` to pad a batch, Adam's
    step counter, an action picked with `.item()`): every op whose tensor inputs all have known values and
    whose outputs are small is also run for real on the CPU, and a value read from a fake tensor comes from
    there. A value nothing can give (it depends on a large fake tensor, e.g. a network's output) reads as 0:
    memory and FLOPs do not depend on it, only control flow that branches on it would.
    """

    def __init__(self, flop_counter: Any, fake_mode: Any) -> None:
        super().__init__()
        self.flop_counter = flop_counter
        self.fake_mode = fake_mode
        from torch._subclasses.fake_tensor import FakeTensor

        self._fake_class = FakeTensor if fake_mode is not None else ()  # (): no tensor is one
        self.ops = 0
        self.bytes_moved = 0
        self.forward_flops = 0
        self.flops_fix = 0  # added to FlopCounterMode's total (see _grouped_backward_flops)
        self.classes = opcost.empty_classes()
        self.products: List[mkl_buffers.Shape] = []  # mkl_buffers.note
        self.in_optimizer = False  # set by the optimizers' step hooks: the update is a class of its own
        self.fresh_mapping_bytes: Optional[int] = None  # a CPU's malloc maps allocations this large fresh (None: GPU)
        self._class_of: Dict[Any, str] = {}
        self.recent = cache_model.RecentReads(0)  # what the last ops touched: a matrix product's re-read is from cache
        self.values = WeakIdKeyDictionary()  # fake tensor -> real CPU tensor with its values

    def value_of(self, t: Any) -> Any:
        """The real tensor behind `t` (itself when it is real), or None when unknown."""
        from torch._subclasses.fake_tensor import FakeTensor

        if not isinstance(t, torch.Tensor):
            return t
        if not isinstance(t, FakeTensor):
            return t if t.device.type != "meta" else None
        return self.values.get(t)

    def forget(self, t: Any) -> None:
        self.values.pop(t, None)

    def _remember(self, fake: Any, real: Any) -> None:
        if isinstance(fake, torch.Tensor) and isinstance(real, torch.Tensor) and fake.numel() <= SMALL_NUMEL:
            self.values[fake] = real

    def _run_real(self, func: Any, args: Any, kwargs: Any, zeros_for_unknown: bool = False) -> Any:
        """func on the real values of its inputs, on the CPU; None when an input has no known value
        (with zeros_for_unknown, such an input is zeros of its shape instead)."""
        from torch.utils._python_dispatch import _disable_current_modes

        flat, spec = torch.utils._pytree.tree_flatten((args, kwargs))
        real = []
        for x in flat:
            if isinstance(x, torch.Tensor):
                v = self.value_of(x) if x.numel() <= SMALL_NUMEL else None
                if v is None and zeros_for_unknown:
                    with _disable_current_modes():
                        v = torch.zeros(x.shape, dtype=x.dtype)
                if v is None:
                    return None
                real.append(v)
            elif isinstance(x, torch.device):
                real.append(torch.device("cpu"))
            else:
                real.append(x)
        r_args, r_kwargs = torch.utils._pytree.tree_unflatten(real, spec)
        if "device" in r_kwargs:
            r_kwargs["device"] = torch.device("cpu")
        try:
            with _disable_current_modes():
                return (func(*r_args, **r_kwargs),)
        except Exception:  # an op the CPU cannot run on these values: its outputs stay value-less
            return None

    def _dynamic_shape(self, func: Any, args: Any, kwargs: Any) -> Any:
        from torch._subclasses.fake_tensor import DynamicOutputShapeException

        devices = [t.device for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        real = self._run_real(func, args, kwargs, zeros_for_unknown=True)
        if real is None:
            raise DynamicOutputShapeException(func)
        device = devices[0] if devices else torch.device("cpu")
        converter = self.fake_mode.fake_tensor_converter

        def fake(r: Any) -> Any:
            if not isinstance(r, torch.Tensor):
                return r
            if r.numel() <= SMALL_NUMEL and r.dtype == torch.int64:
                return r  # small index tensors (packed batch sizes) stay real: kernels read their values
            return converter.from_meta_and_device(self.fake_mode, r.to("meta"), device)

        return torch.utils._pytree.tree_map(fake, real[0])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

        if func is _PRIM_DEVICE and isinstance(args[0], self._fake_class) and \
                not args[0].fake_mode.in_kernel_invocation:
            return args[0].fake_device  # as FakeTensor answers it, without the modes below: most of a step's ops
        kwargs = kwargs or {}
        before = self.flop_counter.get_total_flops()
        # oneDNN's scratch of an LSTM layer or a convolution's backward: held while the op runs
        extra = rnn_workspace.held_during(func, args), conv_scratch.held_during(func, args)
        try:
            out = func(*args, **kwargs)
        except DataDependentOutputException:  # a value read from a fake tensor: .item(), bool(t), ...
            real = self._run_real(func, args, kwargs)
            if real is not None:
                return real[0]
            return _zero_like_result(func, args)
        except DynamicOutputShapeException:
            # an output shape that depends on values (pack_padded_sequence and its lengths): run the op for
            # real with zeros for the inputs whose values are unknown (allocates them, once), keep the shapes
            out = self._dynamic_shape(func, args, kwargs)
        except RuntimeError as exc:
            if "data is not allocated" not in str(exc):
                raise
            # a CPU kernel that reads an input's values (_pad_packed_sequence reads the batch sizes): the same
            out = self._dynamic_shape(func, args, kwargs)
        del extra
        if self.fake_mode is None:  # tracing real tensors: they have their values
            return self._count(func, args, kwargs, out, before)
        if rnn_workspace.is_rnn_layer(func):  # the meta function's workspace is empty; the real one is not
            out = (*out[:3], rnn_workspace.workspace(args, kwargs, out[3].device, self.fresh_mapping_bytes))
        tensors_out = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        small = all(t.numel() <= SMALL_NUMEL for t in tensors_out)
        real = self._run_real(func, args, kwargs) if small else None
        outs = torch.utils._pytree.tree_leaves(out)
        if real is not None:
            for fake_t, real_t in zip(outs, torch.utils._pytree.tree_leaves(real[0])):
                self._remember(fake_t, real_t)
        else:
            for t in outs:  # an op run without values (in place too) leaves its outputs value-less
                if isinstance(t, torch.Tensor):
                    self.forget(t)
        return self._count(func, args, kwargs, out, before)

    def _count(self, func: Any, args: Any, kwargs: Any, out: Any, flops_before: int) -> Any:
        added = self.flop_counter.get_total_flops() - flops_before
        groups = opcost.conv_groups(func, args)
        if groups > 1 and func._schema.name == "aten::convolution_backward":
            # torch's formula counts a grouped convolution's weight gradient `groups` times over
            fixed = opcost.grouped_backward_flops(args)
            self.flops_fix += fixed - added
            added = fixed
        rnn = rnn_workspace.layer_flops(func, args)
        if rnn:  # FlopCounterMode has no formula for oneDNN's RNN layer
            self.flops_fix += rnn - added
            added = rnn
        if not getattr(func, "is_view", False) and func not in _METADATA_OPS:
            self.ops += 1
            mkl_buffers.note(self.products, func, args)
            leaves = torch.utils._pytree.tree_leaves((args, kwargs, out))
            moved = sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))
            self.bytes_moved += moved
            cls = "optimizer" if self.in_optimizer else self._class_of.get(func)
            if cls is None:
                cls = self._class_of[func] = opcost.aten_class(func._schema.name)
            figures = self.classes[cls]
            opcost.add_op(figures, cls, func, args, out, flops=added, groups=groups, moved=moved,
                          hit=self.recent.touch(leaves), capacity=self.recent.capacity)
            if rnn:
                figures["rnn_flops"] += rnn
        if torch._C._current_autograd_node() is None:
            self.forward_flops += added
        return out


def _zero_like_result(func: Any, args: Any) -> Any:
    """What a value-less fake scalar reads as: 0 of its dtype (False for bool)."""
    t = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if func in (torch.ops.aten.is_nonzero.default, torch.ops.aten.equal.default) or (
            t is not None and t.dtype == torch.bool):
        return False
    if t is not None and (t.dtype.is_floating_point or t.dtype.is_complex):
        return 0.0
    return 0


# `tensor.device` on a fake tensor dispatches prim::device, no kernel on a real one (most of a BERT step's ops)
_PRIM_DEVICE = getattr(getattr(torch.ops.prim, "device", None), "default", None)
_METADATA_OPS = {
    _PRIM_DEVICE,
    torch.ops.aten.detach.default,
    torch.ops.aten.alias.default,
    torch.ops.aten.lift_fresh.default,
    torch.ops.aten.empty.memory_format,
    torch.ops.aten.empty_strided.default,
    torch.ops.aten.empty_like.default,
    torch.ops.aten._unsafe_view.default,  # a view torch does not mark as one: no byte is read or written
    torch.ops.aten.set_.source_Storage_storage_offset,
}


def trace_step(make_workload: Callable[[], Workload], ctx: SetupContext, fake: bool = True,
               cuda_optimizers: bool = False, later_steps: int = 0,
               fresh_mapping_bytes: Optional[int] = MMAP_THRESHOLD_MAX, cache_bytes: int = 0,
               short: bool = True) -> StepTrace:
    """Build the workload (`make_workload()`), set it up and run two training steps on fake tensors; measure the second.

    Nothing is allocated: every tensor is a FakeTensor (shape, dtype, device only), also on a device this
    machine does not have (ctx.device may be "cuda" on a host without a GPU). The first step creates the
    optimizer state; the second is the steady state the runner measures. With `short`, a workload whose first step
    leaves only gradients and optimizer state (first_step.state_only) gets those without the step, and
    the trace is made again with both steps where the measured one leaves a parameter without a gradient.
    With fake=False the same is done on real tensors (it allocates): for a workload whose kernels read values fake
    tensors do not have.
    With cuda_optimizers, optimizers take the multi-tensor (foreach) path they take on a CUDA GPU, whatever
    device is traced (its temporaries, e.g. a weight-decayed copy of every gradient, are part of the peak).
    fresh_mapping_bytes: on a CPU, the size from which malloc maps an allocation fresh (rnn_workspace; None: never).
    cache_bytes: the last-level cache of the device; a matrix product's input that is among the last `cache_bytes`
    the step touched does not count in its class's bytes (cache_model.RecentReads; 0: every byte counts).
    """
    from torch.utils.flop_counter import FlopCounterMode

    start = time.monotonic()
    fake_mode = torch_internals.fake_mode() if fake else None
    flops = FlopCounterMode(display=False)
    torch_internals.without_module_tracker(flops)
    counter = _StepCounter(flops, fake_mode)
    if ctx.device.type == "cpu" and not cuda_optimizers:
        counter.fresh_mapping_bytes = fresh_mapping_bytes
    foreach = torch_internals.foreach_optimizers() if cuda_optimizers else contextlib.nullcontext()
    quiet = warnings.catch_warnings()  # torch's deepcopy of a fake module warns of data pointers: not the user's
    packed = torch_internals.as_on_real(fake_mode)  # pad_packed_sequence, clipping's foreach ops as on real data
    with fake_mode or contextlib.nullcontext(), torch_internals.swappable(fake_mode, counter), foreach, quiet, packed:
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        with counter:
            workload = make_workload()  # its parameters are fake from the start
            workload.setup(ctx)
            made = first_step.take(workload, [o for o in _walk_state(workload, set())
                                              if isinstance(o, torch.optim.Optimizer)] if short else None)
        tracker = torch_internals.new_recording_tracker()
        inputs_bytes, state_bytes = _track_state(tracker, workload)
        counter.ops = counter.bytes_moved = counter.forward_flops = counter.flops_fix = 0
        measured_from = len(counter.products)
        counter.classes, counter.recent = opcost.empty_classes(), cache_model.RecentReads(cache_bytes)
        with tracker, flops, counter, opcost.optimizer_marked(counter):
            workload.step()
        peak = tracker.get_tracker_snapshot("peak")
    if made and not first_step.all_trained(made):  # a parameter the step leaves untrained has no state in a job
        return trace_step(make_workload, ctx, fake, cuda_optimizers, later_steps, fresh_mapping_bytes, cache_bytes,
                          short=False)
    host = workload.host_bytes(max(0, later_steps - 2))  # the trace stands for two of the job's steps
    parts = breakdown(_device_snapshot(peak, ctx.device), inputs_bytes, state_bytes)
    return StepTrace(
        device=str(ctx.device.type), fake=fake, peak_tensor_bytes=int(sum(parts.values())), breakdown_bytes=parts,
        inputs_bytes=inputs_bytes, state_bytes=state_bytes,
        flops=int(flops.get_total_flops() + counter.flops_fix), forward_flops=int(counter.forward_flops),
        bytes_moved=int(counter.bytes_moved), ops=int(counter.ops), op_classes=counter.classes,
        events=tracker.events, trace_s=time.monotonic() - start, host_bytes=int(host),
        host_s=float(workload.host_seconds()), products=counter.products, measured_products=measured_from,
    )


def _track_state(tracker: Any, workload: Workload) -> Tuple[int, int]:
    """Register what the workload holds before the step; returns the bytes of held tensors (its inputs) and of
    its optimizers' state."""
    modules: List[torch.nn.Module] = []
    optimizers: List[torch.optim.Optimizer] = []
    tensors: List[torch.Tensor] = []
    for obj in _walk_state(workload, set()):
        if isinstance(obj, torch.nn.Module):
            modules.append(obj)
        elif isinstance(obj, torch.optim.Optimizer):
            optimizers.append(obj)
        else:
            tensors.append(obj)
    for m in workload.modules():
        if all(m is not k for k in modules):
            modules.append(m)
    owned = {id(t) for m in modules for t in list(m.parameters()) + list(m.buffers())}
    owned |= {id(v) for o in optimizers for s in o.state.values() for v in s.values() if isinstance(v, torch.Tensor)}
    inputs = [t for t in tensors if id(t) not in owned and not isinstance(t, torch.nn.Parameter)]
    tracker.track_external(*modules, *optimizers, *inputs)
    state = [v for o in optimizers for st in o.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    return _storage_bytes(inputs), _storage_bytes(state)


def _storage_bytes(tensors: List[torch.Tensor]) -> int:
    storages = {}
    for t in tensors:
        if t.device.type != "cpu" or t.numel() > 1:  # CPU scalars (step counters) are not device memory
            st = t.untyped_storage()
            storages[id(st)] = st.nbytes()
    return int(sum(storages.values()))


def _device_snapshot(peak: Dict[Any, Dict[Any, int]], device: torch.device) -> Dict[str, int]:
    """The tracker's per-kind bytes at the peak on `device` (tensors on other devices, e.g. CPU copies, ignored)."""
    out: Dict[str, int] = {}
    for dev, snap in peak.items():
        if torch.device(dev).type != device.type:
            continue
        for key, value in snap.items():
            name = getattr(key, "value", key)
            out[name] = out.get(name, 0) + int(value)
    return out


def breakdown(snap: Dict[str, int], inputs_bytes: int, state_bytes: int) -> Dict[str, int]:
    """MemTracker's kinds in the measured breakdown's keys.

    As mtbench.workload.breakdown maps the measured one: Parameter -> parameters; Gradient -> gradients;
    Optstate -> optimizer_state up to the size of the optimizers' state (the rest, temporaries of the update
    such as a weight-decayed copy of a gradient, -> other); Activation -> activations; Other (tensors the
    workload holds: its prepared batches) -> inputs; Buffer (BatchNorm statistics) and Temp (the backward's
    temporaries, gradients of activations) -> other.
    """
    held = snap.get("Other", 0)
    inputs = min(inputs_bytes, held)
    opt = snap.get("Optstate", 0)
    state = min(state_bytes, opt)
    return {
        "parameters": snap.get("Parameter", 0),
        "gradients": snap.get("Gradient", 0),
        "optimizer_state": state,
        "activations": snap.get("Activation", 0),
        "inputs": inputs,
        "other": held - inputs + opt - state + snap.get("Buffer", 0) + snap.get("Temp", 0),
    }


def transient_bytes(parts: Dict[str, int]) -> int:
    """Tensor bytes at the peak that the step allocates and frees (activations, temporaries)."""
    held = sum(parts.get(k, 0) for k in ("parameters", "gradients", "optimizer_state", "inputs"))
    return max(0, sum(parts.values()) - held)
