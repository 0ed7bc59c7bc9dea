"""The torch internals mtbench hooks (private APIs that may change between releases), in one place.

Checked on torch 2.14.1 (CI) and 2.5+ for MemTracker (torch.distributed._tools.mem_tracker: absent before 2.5,
where the memory breakdown and the traced peak are null with that reason); FakeTensorConverter,
torch.utils.swap_tensors (2.3+) and torch.optim.*._default_to_fused_or_foreach on torch 2.0.1 and 2.14.1
(benchmarks/compat.sh runs the suite on torch 2.0.1). Each hook says what it changes and why.
- `fake_mode`: FakeTensorMode whose converter skips the weak-value memo (so `Module.to` can swap tensors).
- `swappable`: torch.utils.swap_tensors, wrapped to drop fake-tensor bookkeeping first.
- `foreach_optimizers`: torch.optim's implementation choice as on a CUDA GPU.
- `foreach_on_fake`: torch's multi-tensor (foreach) choice for fake tensors as for real ones (gradient clipping's).
- `as_on_real`: `packed_on_fake` and `foreach_on_fake` together: what the trace runs to take a real step's path.
- `packed_on_fake`: `torch._VF._pad_packed_sequence` done in Python for fake data (the kernel makes its lengths
  with the fake mode on and writes them through a data pointer).
- `new_recording_tracker`: the trace's MemTracker subclass (keeps the order of allocations and frees), and
  `step_tracker_class`, the measured breakdown's (a network run twice in one step restarts its statistics).
- `on_device`: `with torch.device(d):` (torch >= 2.0), and on torch 1.13 the same through a TorchFunctionMode.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Tuple

import torch


@contextlib.contextmanager
def swappable(fake_mode: Any, counter: Any) -> Iterator[None]:
    """Let `Module.to()` swap fake parameters: drop the weak references torch's fake-tensor bookkeeping and
    our value table hold to the two tensors just before torch.utils.swap_tensors (which refuses them)."""
    if fake_mode is None:
        yield
        return
    original = torch.utils.swap_tensors
    describer = fake_mode.fake_tensor_converter.meta_converter.describer

    def swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
        for t in (t1, t2):
            describer.lookup_tensor.pop(t, None)
            counter.forget(t)
        original(t1, t2)

    torch.utils.swap_tensors = swap_tensors
    try:
        yield
    finally:
        torch.utils.swap_tensors = original


@contextlib.contextmanager
def packed_on_fake(fake_mode: Any) -> Iterator[None]:
    """Under `fake_mode`, `pad_packed_sequence` (torch.nn.utils.rnn calls `torch._VF._pad_packed_sequence`) on fake
    data with real batch sizes runs the kernel's own steps in Python: its C++ makes the lengths with the data's
    options, a tensor without data under a fake mode, then writes through its pointer. The same ops in the same
    order (a padded tensor, one copy per run of equal batch sizes), so the trace sees what the kernel runs."""
    from torch._subclasses.fake_tensor import FakeTensor

    if fake_mode is None:
        yield
        return
    vf = torch._VF
    own = vars(vf).get("_pad_packed_sequence")  # set on the module already (None: looked up in torch._C)
    original = getattr(vf, "_pad_packed_sequence")

    def pad_packed(data: Any, batch_sizes: Any, batch_first: bool, padding_value: float, total_length: int) -> Any:
        if not isinstance(data, FakeTensor) or isinstance(batch_sizes, FakeTensor):
            return original(data, batch_sizes, batch_first, padding_value, total_length)
        return pad_packed_sequence_ops(data, batch_sizes, batch_first, padding_value, total_length)

    setattr(vf, "_pad_packed_sequence", pad_packed)
    try:
        yield
    finally:
        if own is None:
            delattr(vf, "_pad_packed_sequence")  # back to the module's own lookup (torch._C._VariableFunctions)
        else:
            setattr(vf, "_pad_packed_sequence", own)


def pad_packed_sequence_ops(data: Any, batch_sizes: Any, batch_first: bool, padding_value: float,
                            total_length: int) -> Tuple[Any, Any]:
    """aten::_pad_packed_sequence as its CPU kernel computes it (PackedSequence.cpp): a tensor of padding, one
    copy per run of equal batch sizes, the lengths from the batch sizes; batch_sizes must hold values."""
    sizes = [int(b) for b in batch_sizes.tolist()]
    steps = total_length if total_length > 0 else len(sizes)
    output = torch.full((steps, sizes[0], *data.shape[1:]), padding_value, dtype=data.dtype, device=data.device)
    lengths = [0] * sizes[0]
    offset, previous, start = 0, sizes[0], 0
    for i in range(len(sizes) + 1):
        size = sizes[i] if i < len(sizes) else 0
        if size != previous:
            n = previous * (i - start)
            output[start:i, :previous].copy_(data[offset:offset + n].view(i - start, previous, *data.shape[1:]))
            offset, start = offset + n, i
        for j in range(size, previous):
            lengths[j] = i
        previous = size
    return (output.transpose(0, 1) if batch_first else output), torch.tensor(lengths, dtype=torch.int64)


@contextlib.contextmanager
def foreach_on_fake(fake_mode: Any) -> Iterator[None]:
    """Under `fake_mode`, torch.utils._foreach_utils._has_foreach_support accepts fake tensors as it accepts real
    ones (its list of types holds torch.Tensor alone): a real step's gradient clipping (clip_grad_norm_ since torch
    2.1) runs torch._foreach_norm and _foreach_mul_ over the gradients, and a fake one ran one norm and one scale
    per gradient in their place. The optimizers' own choice on a CPU is unchanged: it also asks for a device with
    foreach kernels."""
    import importlib

    from torch._subclasses.fake_tensor import FakeTensor

    try:
        types = getattr(importlib.import_module("torch.utils._foreach_utils"), "_foreach_supported_types", None)
    except ImportError:  # a torch without the module: its clipping has no foreach path either
        types = None
    if fake_mode is None or not isinstance(types, list) or FakeTensor in types:
        yield
        return
    types.append(FakeTensor)
    try:
        yield
    finally:
        types.remove(FakeTensor)


@contextlib.contextmanager
def as_on_real(fake_mode: Any) -> Iterator[None]:
    """packed_on_fake and foreach_on_fake: the ops a step on real tensors runs, run on fake ones."""
    with packed_on_fake(fake_mode), foreach_on_fake(fake_mode):
        yield


@contextlib.contextmanager
def foreach_optimizers() -> Iterator[None]:
    """torch.optim's default implementation choice as on a CUDA GPU: foreach (a fake or CPU tensor gets the
    single-tensor loop otherwise)."""
    import importlib

    def cuda_default(params: Any, differentiable: bool, use_fused: bool = False) -> Tuple[bool, bool]:
        return False, not differentiable and not torch.jit.is_scripting()

    patched = []
    for name in ("optimizer", "sgd", "adam", "adamw", "rmsprop", "adagrad", "adadelta", "adamax", "nadam",
                 "radam", "rprop", "asgd"):
        try:
            module = importlib.import_module(f"torch.optim.{name}")
        except ImportError:
            continue
        if hasattr(module, "_default_to_fused_or_foreach"):
            patched.append((module, module._default_to_fused_or_foreach))
            module._default_to_fused_or_foreach = cuda_default
    try:
        yield
    finally:
        for module, original in patched:
            module._default_to_fused_or_foreach = original


def fake_mode() -> Any:
    """A FakeTensorMode whose fresh tensors hold no weak reference, so that `module.to(device)` works.

    torch memoizes every fake tensor it makes in a weak-value map; `Module.to` swaps a fake parameter for
    its converted copy (torch.utils.swap_tensors), which refuses a tensor that has a weak reference. A
    tensor made from a fresh meta tensor never needs the memo (nothing else maps to it): skip it there.
    """
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorConverter, FakeTensorMode

    class _Converter(FakeTensorConverter):
        def from_meta_and_device(self, fake_mode, t, device, pytype=None, dispatch_keys=None):
            return FakeTensor(fake_mode, t, device, pytype=pytype, dispatch_keys=dispatch_keys)

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    mode.fake_tensor_converter.__class__ = _Converter
    return mode


def _tolerant_tracker_class() -> Any:
    """torch's MemTracker, tolerant of what mtbench's workloads do: a frozen parameter (a fixed embedding), a module
    whose inputs or outputs are a PackedSequence; the trace's and the breakdown's trackers build on it."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class TolerantTracker(MemTracker):
        def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
            # a frozen parameter (a fixed embedding) takes no gradient hook: mark it as already hooked
            for p in module.parameters():
                if not p.requires_grad and p not in self._param_to_grad_hook_handles:
                    self._param_to_grad_hook_handles[p] = (_NoHandle(), _NoHandle())
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

        def _track_inputs_or_outputs(self, args):
            # per-module input/output sizes are not used here; torch's version rebuilds the arguments with
            # tree_map, which fails on a PackedSequence whose unsorted_indices is None
            return 0

    return TolerantTracker


def _recording_tracker_class() -> Any:
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY, _UpdateType

    class RecordingTracker(_tolerant_tracker_class()):
        """torch's MemTracker that also keeps the order of allocations and frees (for the allocator's rounding)."""

        def __init__(self) -> None:
            super().__init__()
            self.events: List[Tuple[int, int, str]] = []

        def _pre_fw_hook(self, module, inputs):
            try:
                super()._pre_fw_hook(module, inputs)
            except NotImplementedError:  # a network called twice in one step (DQN's online network): allowed
                self.memory_tracking.pop(module, None)
                super()._pre_fw_hook(module, inputs)

        def _update_peak_stats(self, peak_state):
            # the step's peak only: torch's version also keeps every module's peak, walking all modules on
            # every op (a third of the trace's time on BERT)
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap[_TOTAL_KEY]:
                    self._peak_mem[dev] = snap[_TOTAL_KEY]
                    self._peak_mem_snap[dev] = dict(snap)

        def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None):
            super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
            kind = getattr(winfo.reftype, "value", str(winfo.reftype))
            if u_type == _UpdateType.ADD:
                self.events.append((id(winfo), winfo.size * winfo.element_size, kind))
            elif u_type == _UpdateType.DEL:
                self.events.append((id(winfo), -1, kind))
            elif u_type == _UpdateType.SIZE:  # a resized storage: freed and allocated again
                self.events.append((id(winfo), -1, kind))
                self.events.append((id(winfo), winfo.size * winfo.element_size, kind))
            elif u_type == _UpdateType.REF:  # the same bytes change kind (e.g. an output becomes a gradient)
                self.events.append((id(winfo), -2, kind))

    return RecordingTracker


class _NoHandle:
    def remove(self) -> None:
        pass


def new_recording_tracker() -> Any:
    """A RecordingTracker (the class is made on first use: torch's module is imported lazily)."""
    global _TRACKER_CLASS
    if _TRACKER_CLASS is None:
        _TRACKER_CLASS = _recording_tracker_class()
    return _TRACKER_CLASS()


_TRACKER_CLASS = None


def step_tracker_class() -> type:
    """The breakdown's MemTracker subclass (the trace's is `new_recording_tracker`): a second forward restarts."""
    class StepTracker(_tolerant_tracker_class()):
        """MemTracker that accepts a network called twice in one step (a GAN's discriminator on real, then fake).

        MemTracker refuses a second forward of a top-level module as "multiple iterative calls"; we only need the
        step's peak, not per-module statistics, so the module's statistics restart instead. A frozen parameter
        and a PackedSequence are tolerated as in the trace's tracker (BiDAF's and seq2seq's breakdowns failed).
        """

        def _pre_fw_hook(self, module: torch.nn.Module, inputs: Any) -> None:
            if module in self.memory_tracking and not self._mod_tracker.is_bw:
                del self.memory_tracking[module]
            super()._pre_fw_hook(module, inputs)

    return StepTracker


# the factory functions torch 2.0's device context (torch.utils._device) gives a default device
_FACTORIES = ("empty", "empty_strided", "zeros", "ones", "full", "rand", "randn", "randint", "randperm", "arange",
              "range", "linspace", "logspace", "eye", "tensor", "as_tensor", "scalar_tensor", "sparse_coo_tensor")


def on_device(device: Any) -> Any:
    """A context in which new tensors and modules' parameters are made on `device` ("meta": shapes only): torch's
    own `torch.device` context from 2.0, and on torch 1.13 (a TX2's JetPack 4 route) the same rule written as a
    TorchFunctionMode (the factory functions get `device` where the call names none), as torch 2.0 implements it."""
    device = torch.device(device)
    if hasattr(device, "__enter__"):
        return device
    from torch.overrides import TorchFunctionMode

    factories = {getattr(torch, name) for name in _FACTORIES if hasattr(torch, name)}

    class _DeviceMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = dict(kwargs or {})
            if func in factories and kwargs.get("device") is None:
                kwargs["device"] = device
            return func(*args, **kwargs)

    return _DeviceMode()


class _GlobalOnly:
    """Stands in for FlopCounterMode's ModuleTracker: every FLOP counted under "Global" (the trace reads totals only).

    ModuleTracker puts a torch.autograd.graph.register_multi_grad_hook on every module's inputs and outputs; each
    hook's closure holds the grad_fns it waits for, and the grad_fns hold the hook: a reference cycle. Under a
    non-reentrant checkpoint the modules run again in the backward pass, and the recomputed graph, which is never
    run backward and so never releases what it saved, then stays alive with its saved activations until Python's
    cyclic garbage collector happens to run. The trace saw those activations as live, a predicted peak above plain
    training's (the figures: docs/benchmarks.md "Figures behind design choices").
    Known upstream: pytorch/pytorch#139214 (hooks registered again during checkpoint recomputation).
    """

    parents = {"Global"}

    def __enter__(self) -> "_GlobalOnly":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def without_module_tracker(flops: Any) -> None:
    """Count a FlopCounterMode's FLOPs under "Global" only (torch >= 2.4 attributes them to modules: _GlobalOnly)."""
    if hasattr(flops, "mod_tracker"):
        flops.mod_tracker = _GlobalOnly()

