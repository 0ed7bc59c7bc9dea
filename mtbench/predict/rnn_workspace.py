"""The workspace oneDNN's RNN layer keeps for its backward (torch's fake tensors give it 0 bytes), by running it."""
from __future__ import annotations

import mmap
from typing import Any, Dict, Optional, Tuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

from mtbench.device import glibc, hugepages
from mtbench.device.glibc import MMAP_THRESHOLD_MAX

# Runs at up to 2 x RUN_AT samples are exact; a larger batch is extrapolated from two runs (RUN_AT, 2 x RUN_AT): the
# workspace is page-aligned sections that grow linearly with the batch, so the error is a few pages (the sizes
# measured: docs/prediction.md "An LSTM's workspace")
RUN_AT = 8
PAGE = mmap.PAGESIZE
# A workspace this large is always mapped fresh by glibc (above its largest mmap threshold, 32 MiB, under glibc's own
# settings or live) in a process whose heap holds no free block as large: its pages the layer never writes read as
# zero and are never resident
FRESH_BYTES = 40 << 20
MAX_SHARE_BATCH = 1 << 16  # no larger batch, and no larger input, is run to reach FRESH_BYTES
MAX_SHARE_INPUT_BYTES = 256 << 20
_SIZES: Dict[Tuple[Any, ...], int] = {}
_TOUCHED: Dict[Tuple[Any, ...], Tuple[float, float]] = {}
# a traced workspace -> the bytes its backward makes resident beyond what its forward wrote (`workspace`)
_BACKWARD_GROWTH: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _layer_op() -> Any:
    try:  # torch 2.x runs a CPU LSTM layer by layer through this op; torch 1.13 has none (one fused kernel)
        return torch.ops.aten.mkldnn_rnn_layer.default
    except (AttributeError, RuntimeError):
        return None


LAYER_OP = _layer_op()
LAYER_BACKWARD_OP = None if LAYER_OP is None else torch.ops.aten.mkldnn_rnn_layer_backward.default


def is_rnn_layer(func: Any) -> bool:
    """`aten::mkldnn_rnn_layer`, the CPU's LSTM layer when oneDNN is enabled (training keeps its workspace)."""
    return LAYER_OP is not None and func is LAYER_OP


def is_rnn_backward(func: Any) -> bool:
    """`aten::mkldnn_rnn_layer_backward`, the CPU LSTM layer's backward."""
    return LAYER_BACKWARD_OP is not None and func is LAYER_BACKWARD_OP


def layer_flops(func: Any, args: Tuple[Any, ...]) -> int:
    """FLOPs of one oneDNN RNN layer op, which torch's FlopCounterMode counts as 0: the forward's gate products
    over every position, 2 x positions x (|W_ih| + |W_hh|) (the element-wise gates are not counted, as for a
    matrix product's bias); the backward's twice that (the input's and the weights' gradients), as torch counts a
    matrix product's backward. The same figure the catalog's LSTM count gives (report/flops.py). cuDNN's and
    MIOpen's whole-stack ops are counted by stack_flops."""
    stack = stack_flops(func, args)
    if stack or LAYER_OP is None:
        return stack
    backward = is_rnn_backward(func)
    if func is not LAYER_OP and not backward:
        return 0
    forward = 2 * _positions(args[0]) * (args[1].numel() + args[2].numel())  # W_ih, W_hh
    return 2 * forward if backward else forward


def _positions(inp: Any) -> int:
    """Positions an RNN's input holds: steps x batch whatever the layout, or a packed sequence's rows."""
    return inp.numel() // max(1, int(inp.shape[-1]))


_STACK_OPS = ("aten::_cudnn_rnn", "aten::miopen_rnn")
_STACK_BACKWARD_OPS = ("aten::_cudnn_rnn_backward", "aten::miopen_rnn_backward")


def stack_flops(func: Any, args: Tuple[Any, ...]) -> int:
    """FLOPs of a GPU's whole recurrent stack in one op (`_cudnn_rnn`, `miopen_rnn`; FlopCounterMode: 0): every
    matrix of its `weight` list (each layer's and direction's W_ih, W_hh and, with proj_size, W_hr; not the
    biases) multiplies a vector at every position, 2 x positions x |W|. The backward computes the data gradients
    always and the weights' where output_mask[3] asks: once or twice the forward (none without any gradient in)."""
    name = func._schema.name
    if name not in _STACK_OPS and name not in _STACK_BACKWARD_OPS:
        return 0
    forward = 2 * _positions(args[0]) * sum(int(w.numel()) for w in args[1] if w.dim() == 2)
    if name in _STACK_OPS:
        return forward
    if all(g is None for g in args[7:10]):  # no grad_output, grad_hy or grad_cy: torch returns before any kernel
        return 0
    mask = args[-1] if isinstance(args[-1], (list, tuple)) else (True, True, True, True)
    return forward * (1 + int(bool(mask[3])))


def workspace(args: Tuple[Any, ...], kwargs: Dict[str, Any], device: Any,
              fresh_from: Optional[int] = MMAP_THRESHOLD_MAX) -> torch.Tensor:
    """The workspace `aten::mkldnn_rnn_layer(*args)` returns, as an empty tensor of the bytes it holds resident
    once the forward ran (`workspace_bytes`); what the layer's backward writes on top of that, `held_during`
    holds while the backward runs (the workspace is freed after it)."""
    size, after_backward = workspace_bytes(args, kwargs, fresh_from, both=True)
    ws = torch.empty(size, dtype=torch.uint8, device=device)
    if after_backward > size:
        _BACKWARD_GROWTH[ws] = after_backward - size
    return ws


def held_during(func: Any, args: Tuple[Any, ...]) -> Optional[torch.Tensor]:
    """What oneDNN's LSTM layer holds beyond its tensors while its forward or backward runs, as a tensor to hold
    that long: its scratchpad's gates, 4 x hidden floats per position (oneDNN's scratch_gates), its weights
    reordered into oneDNN's layout (W_ih and W_hh once in the forward; twice in the backward, the weights and
    their gradients), all allocated and freed by each call, and in the backward the workspace pages it writes
    beyond the forward's (`workspace`). Measured against the process's resident high-water mark:
    docs/prediction.md. None for any other op."""
    forward = is_rnn_layer(func)
    if not (forward or is_rnn_backward(func)) or len(args) < 3 or not isinstance(args[0], torch.Tensor):
        return None
    size = _positions(args[0]) * 4 * int(args[2].shape[-1]) * 4  # args[2]: W_hh, (4 x hidden, hidden)
    weights = sum(int(w.numel()) * w.element_size() for w in args[1:3])  # W_ih, W_hh
    size += weights if forward else 2 * weights
    if not forward and isinstance(args[-1], torch.Tensor):
        size += _BACKWARD_GROWTH.get(args[-1], 0)
    return torch.empty(size, dtype=torch.uint8, device=args[0].device)


def workspace_bytes(args: Tuple[Any, ...], kwargs: Dict[str, Any],
                    fresh_from: Optional[int] = MMAP_THRESHOLD_MAX, both: bool = False) -> Any:
    """Bytes of the workspace `aten::mkldnn_rnn_layer(*args)` returns on real tensors: none where gradients are off
    (the kernel keeps one whenever autograd records, whatever its `train` flag says).

    torch's meta function returns an empty workspace, yet the real one holds every step's gates and states and is
    saved for the backward: on a character LSTM at batch 32 it is three quarters of the step's tensor storage. The
    op is run on zeros of the same shapes (once per shape), outside every dispatch mode.

    A workspace of at least `fresh_from` bytes (a CPU's malloc maps it fresh: glibc above its mmap threshold, 32 MiB
    at most, 128 KiB under memory.cpu_malloc=live) counts only the part the layer's forward writes (the share
    measured by running one; docs/prediction.md): the rest of the mapping is never touched until the backward,
    so not resident while the layer waits for it; with both=True, (that, the part written once the backward ran
    too). A smaller one comes from the heap, whose pages earlier tensors made resident, and counts whole, as
    every byte does on a GPU (fresh_from=None).
    """
    bound = LAYER_OP._schema.arguments
    named = {a.name: v for a, v in zip(bound, args)}
    named.update(kwargs)
    if not torch.is_grad_enabled():  # the caller's grad mode: the dispatcher below autograd leaves it as it was
        return (0, 0) if both else 0
    packed = bool(named.get("batch_sizes")) or named["input"].dim() != 3
    batch = int(named["hx_"].shape[0])
    if packed or batch <= 2 * RUN_AT:  # a packed sequence: its own shapes only
        size = _nominal(named, None)
    else:
        high, per_sample = _line(named)
        size = int(high + per_sample * (batch - 2 * RUN_AT))
    forward = backward = 1.0
    if fresh_from is not None and size >= fresh_from and not packed:
        forward, backward = _touched_shares(named)
    pages = [-(-int(size * share) // 4096) * 4096 for share in (forward, backward)]
    return tuple(pages) if both else pages[0]


def _line(named: Dict[str, Any]) -> Tuple[int, float]:
    """The workspace's bytes at 2 x RUN_AT samples and its growth per sample (from the runs at RUN_AT and 2 x RUN_AT)."""
    low, high = _nominal(named, RUN_AT), _nominal(named, 2 * RUN_AT)
    return high, (high - low) / RUN_AT


def _dims(name: str, t: torch.Tensor, batch: Optional[int]) -> Tuple[int, ...]:
    """The shape of argument `name` with the batch set to `batch` (None: as it is). The layer's input is (steps,
    batch, features) whatever `batch_first` says (the LSTM transposes it before); hx_ and cx_ are (batch, hidden)."""
    dims = list(t.shape)
    dim = {"input": 1, "hx_": 0, "cx_": 0}.get(name)
    if batch is not None and dim is not None and len(dims) > dim:
        dims[dim] = batch
    return tuple(dims)


def _real_args(named: Dict[str, Any], batch: Optional[int], fill: float) -> Dict[str, Any]:
    """Real tensors of the arguments' shapes (`_dims`), filled with `fill`; the other arguments as they are."""
    return {name: torch.full(_dims(name, v, batch), fill, dtype=v.dtype, device="cpu")
            if isinstance(v, torch.Tensor) else v for name, v in named.items()}


def _key(named: Dict[str, Any], batch: Optional[int]) -> Tuple[Any, ...]:
    return tuple((name, (_dims(name, v, batch), v.dtype) if isinstance(v, torch.Tensor) else
                  (tuple(v) if isinstance(v, list) else v)) for name, v in named.items())


def _nominal(named: Dict[str, Any], batch: Optional[int]) -> int:
    """The workspace's bytes at `batch` (None: the shapes as they are), cached per shape."""
    from torch.utils._python_dispatch import _disable_current_modes

    key = _key(named, batch)
    if key not in _SIZES:
        with _disable_current_modes(), torch.enable_grad():  # under no_grad the layer keeps no workspace
            out = LAYER_OP(*_real_args(named, batch, 0.0).values())
            _SIZES[key] = int(out[3].untyped_storage().nbytes())
    return _SIZES[key]


def _touched_shares(named: Dict[str, Any]) -> Tuple[float, float]:
    """The shares of the workspace's pages the layer's forward writes, and its forward and backward together, at a
    batch whose workspace is mapped fresh (FRESH_BYTES), so that a page it never writes reads as zero; cached per
    shape less the batch."""
    from torch.utils._python_dispatch import _disable_current_modes

    key = _key(named, 1)
    if key not in _TOUCHED:
        high, per_sample = _line(named)
        batch = 2 * RUN_AT + int(max(0, FRESH_BYTES - high) / per_sample) + 1 if per_sample > 0 else 0
        inputs = named["input"].numel() * named["input"].element_size() // max(1, int(named["hx_"].shape[0])) * batch
        if not 0 < batch <= MAX_SHARE_BATCH or inputs > MAX_SHARE_INPUT_BYTES:  # a tiny workspace: counted whole
            _TOUCHED[key] = (1.0, 1.0)
            return _TOUCHED[key]
        with _disable_current_modes(), torch.enable_grad():
            real = _real_args(named, batch, 0.01)  # not zeros: a written page must read as non-zero
            libc = glibc.glibc_malloc()
            if libc is not None:  # glibc serves a block this large from a free chunk of its heap where it has one,
                libc.malloc_trim(0)  # its old bytes still there: trimmed, the free chunks' pages read as zero
            output, hy, cy, ws = LAYER_OP(*real.values())
            forward = _written_share(ws)
            grads = [torch.full_like(t, 0.01) for t in (output, hy, cy)]
            torch.ops.aten.mkldnn_rnn_layer_backward.default(
                real["input"], real["weight0"], real["weight1"], real["weight2"], real["weight3"], real["hx_"],
                real["cx_"], output, hy, cy, *grads, real["reverse"], real["mode"], real["hidden_size"],
                real["num_layers"], real["has_biases"], real["train"], real["bidirectional"], real["batch_sizes"],
                real["batch_first"], ws)
            _TOUCHED[key] = (forward, _written_share(ws))
    return _TOUCHED[key]


def _written_share(ws: torch.Tensor) -> float:
    """The share of a workspace's resident units (`_resident_grain`) holding a non-zero byte."""
    grain = _resident_grain()
    pages = ws.numel() // grain
    written = int(ws[:pages * grain].view(pages, grain).ne(0).any(dim=1).sum()) if pages else 0
    return written / pages if pages else 1.0


def _resident_grain() -> int:
    """The unit in which a written mapping becomes resident: a page, or a huge page where transparent huge pages
    are always on (a touched 2 MiB region is then resident whole)."""
    pmd = hugepages.thp_setting("hpage_pmd_size")
    if hugepages.thp_setting("enabled") == "always" and pmd and pmd.isdigit():
        return int(pmd)
    return PAGE
