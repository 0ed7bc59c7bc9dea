"""The per-op-class step-time model: op classes of traced aten ops and of measured ops.csv rows, features, NNLS fit."""
from __future__ import annotations

import contextlib
import re
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from mtbench.device.glibc import MMAP_THRESHOLD_MAX
from mtbench.predict import cache_model

# The model (all coefficients >= 0), summed over the ops of one training step:
#   conv:        conv_flops * s/FLOP (dense) + conv_grouped_flops * s/FLOP (groups > 1: depthwise, memory-bound
#                shapes) + conv_bytes * s/byte + conv_pointwise_bytes * s/byte (a dense 1x1 convolution's bytes:
#                it reads each input once, where a k x k one gathers it at each of its taps) + conv_thin_flops *
#                s/unit (a dense convolution's FLOPs over the narrow side of its weight as a product's matrix: few
#                output channels, or few input channels and taps, run under the peak rate; see conv_thin_flops)
#   matmul:      matmul_flops * s/FLOP + matmul_bytes * s/byte (inputs not read recently, outputs larger than the
#                last-level cache: cache_model.RecentReads, cache_model.cached_outputs) + matmul_rnn_flops * s/FLOP
#                (a recurrent layer's gate products, rnn_workspace.layer_flops: a product per position, each waiting
#                for the state before it, runs under the rate of one large product)
#   pool:        pool_bytes * s/byte + pool_window * s/read (a forward's outputs times its window: a 3x3 window
#                at stride 1 reads 9 inputs per output where its bytes count about 2; see pool_window_reads)
#   norm, elementwise, reduction, optimizer (the update and zero_grad, and every multi-tensor op over the
#                parameters or gradients, _foreach_*: a gradient clipping's norm and scale): <class>_bytes * s/byte
#                (the optimizer's less its re-reads of what is still in the last-level cache: an update's several
#                ops on one parameter, its gradient and its state read them again while they fit; a large one
#                streams) + optimizer_fresh_bytes * s/byte (its outputs in new storage of at least glibc's largest
#                mmap threshold, 32 MiB: mapped fresh and faulted in page by page each step, and too large for any
#                cache; a weight-decayed copy of AlexNet's 151 MB gradient, Adam's sqrt of BERT's embedding's state)
#   launch_ops:  s per op launched (dispatch, kernel launch), every class
#   host_ops:    s per op of host time between ops (Python, autograd engine), the "[no op]" row of ops.csv
#   step_overhead: s per step
# The shape efficiency of a convolution or a matrix product is its FLOPs and bytes terms together: a small or
# thin one moves many bytes per FLOP, and a grouped one runs at its own (lower) rate.
CLASSES = ("conv", "matmul", "norm", "elementwise", "reduction", "pool", "optimizer")
FEATURES = ("conv_flops", "conv_grouped_flops", "conv_bytes", "conv_pointwise_bytes", "conv_thin_flops",
            "matmul_flops", "matmul_bytes", "matmul_rnn_flops", "norm_bytes", "elementwise_bytes", "reduction_bytes",
            "pool_bytes", "pool_window", "optimizer_bytes", "optimizer_fresh_bytes", "launch_ops", "host_ops",
            "step_overhead")
HOST = "host"  # the time between ops (ops.csv's "[no op]" row)
_INDEX = {f: i for i, f in enumerate(FEATURES)}
# which features a class's own time is made of (launch_ops: that class's op count)
CLASS_FEATURES = {c: [f for f in FEATURES if f.startswith(c + "_")] + ["launch_ops"] for c in CLASSES}
CLASS_FEATURES[HOST] = ["host_ops", "step_overhead"]

_CONV = ("convolution", "conv_depthwise", "conv2d", "conv1d", "conv3d", "conv_transpose", "slow_conv")
_MATMUL = ("mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "mv", "addmv", "dot", "linear",
           "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
           "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention_for_cpu",
           "_scaled_dot_product_cudnn_attention", "_flash_attention_forward", "_efficient_attention_forward")
# a recurrent layer's time is its gate products (traced: oneDNN's RNN layer and cuDNN's and MIOpen's whole stacks,
# with FLOPs from rnn_workspace.layer_flops; measured: the aten::lstm row and its backward node). A fused cell
# (_thnn_fused_lstm_cell) is only the gates' element-wise part: not one of these.
_RNN = ("mkldnn_rnn", "cudnn_rnn", "miopen_rnn", "lstm", "gru", "rnn_tanh", "rnn_relu")
# A CPU GRU or plain RNN (and an LSTM cell) has no oneDNN layer: it is traced as matrix products and element-wise
# gates, while its measured row (aten::gru, a composite) holds both; most of that is the products, so the row is one
_NORM = ("batch_norm", "layer_norm", "group_norm", "instance_norm")
_REDUCTION = ("sum", "mean", "max", "min", "amax", "amin", "var", "std", "norm", "softmax", "log_softmax",
              "nll_loss", "cross_entropy", "pool", "cumsum", "prod", "topk", "argmax", "argmin", "logsumexp",
              "mse_loss", "binary_cross_entropy", "smooth_l1_loss")


_OP_NAME = re.compile(r"^(\w+::\w+(\.\w+)?|\w+Backward\d+)$")  # aten::conv2d, ConvolutionBackward0


def aten_class(name: str) -> str:
    """The class of a traced aten op, from its name without namespace and overload ("convolution_backward")."""
    base = name.split("::")[-1].split(".")[0].lstrip("_")
    if base.startswith("foreach_"):  # streams over many parameters' tensors as an update does (see CLASSES)
        return "optimizer"
    core = base[:-len("_backward")] if base.endswith("_backward") else base
    core = core.rstrip("_")
    if any(core.startswith(c.lstrip("_")) for c in _CONV) or "convolution" in core:
        return "conv"
    if core in (m.lstrip("_") for m in _MATMUL) or "scaled_dot_product" in core or "attention" in core or (
            any(core.startswith(r) for r in _RNN) and "flatten" not in core and "cell" not in core):
        return "matmul"
    if any(n in core for n in _NORM):
        return "norm"
    if "normal" in core:  # random numbers (normal_, log_normal_), not a norm
        return "elementwise"
    if "pool" in core:  # a window per output (max with its indices, average): slower per byte than a sum
        return "pool"
    if any(r in core for r in _REDUCTION):
        return "reduction"
    return "elementwise"


def measured_class(name: str, device: str = "cpu") -> str:
    """The class of an ops.csv row: a top-level host op ("aten::conv2d", "ConvolutionBackward0",
    "Optimizer.step#SGD.step"; on a GPU the kernels it launched are named so) or, with device "cuda", a kernel whose
    launch the trace did not tie to an op (its own name); HOST for the "[no op]" row."""
    if name == "[no op]":
        return HOST
    low = name.lower()
    if name.startswith("Optimizer.") or low.split("::")[-1].startswith("_foreach_"):
        return "optimizer"
    if device == "cuda" and not _OP_NAME.match(name):  # kernel names
        if "multi_tensor_apply" in low or "foreach" in low:
            return "optimizer"
        if "conv" in low or "wgrad" in low or "dgrad" in low or "implicit_gemm" in low or "winograd" in low:
            return "conv"
        if "gemm" in low or "gemv" in low or "matmul" in low or "cutlass" in low or (
                ("rnn" in low or "lstm" in low) and "cell" not in low):  # cuDNN's RNN kernels; a fused cell: gates
            return "matmul"
        if "batch_norm" in low or "batchnorm" in low or "bn_" in low or "layer_norm" in low or "layernorm" in low:
            return "norm"
        if "pool" in low:
            return "pool"
        if "reduce" in low or "softmax" in low or "nll_loss" in low:
            return "reduction"
        return "elementwise"
    op = low.split("::")[-1]
    if op.endswith("backward0") or op.endswith("backward1"):  # autograd nodes: ConvolutionBackward0
        op = op[:-len("backward0")]
    for key, cls in (("conv", "conv"), ("addmm", "matmul"), ("linear", "matmul"), ("matmul", "matmul"),
                     ("bmm", "matmul"), ("scaled_dot_product", "matmul"), ("einsum", "matmul")):
        if key in op:
            return cls
    if op in ("mm", "mv", "dot", "addmv") or (any(op.replace("_", "").startswith(r.replace("_", "")) for r in _RNN)
                                              and "flatten" not in op):
        return "matmul"
    if any(n.replace("_", "") in op.replace("_", "") for n in _NORM):
        return "norm"
    if "normal" in op:  # random numbers (normal_, log_normal_), not a norm
        return "elementwise"
    if "pool" in op:
        return "pool"
    if any(r.replace("_", "") in op.replace("_", "") for r in _REDUCTION):
        return "reduction"
    return "elementwise"


def empty_classes() -> Dict[str, Dict[str, float]]:
    """Per class: flops, grouped_flops (convolutions with groups > 1), pointwise_bytes (of bytes, the dense 1x1
    convolutions'), thin_flops (conv_thin_flops), window
    (pool_window), rnn_flops (of flops, a recurrent layer's: matmul_rnn_flops), bytes, ops; and weight_bytes (the
    forward convolutions' weights: what oneDNN keeps reordered copies of on a CPU, see
    Calibration.non_tensor_bytes); fresh (an update's new blocks that glibc maps fresh: fresh_bytes)."""
    return {c: {"flops": 0.0, "grouped_flops": 0.0, "pointwise_bytes": 0.0, "thin_flops": 0.0, "window": 0.0,
                "rnn_flops": 0.0, "bytes": 0.0, "ops": 0.0, "weight_bytes": 0.0, "fresh": 0.0} for c in CLASSES}


def step_features(classes: Dict[str, Dict[str, float]]) -> np.ndarray:
    """The FEATURES of a whole step from its per-class figures (flops, grouped_flops, bytes, ops per class)."""
    x = np.zeros(len(FEATURES))
    for c in CLASSES:
        x += class_features(classes, c)
    x += class_features(classes, HOST)
    return x


def class_features(classes: Dict[str, Dict[str, float]], cls: str) -> np.ndarray:
    """The FEATURES of class `cls`'s own time (zeros outside its columns)."""
    x = np.zeros(len(FEATURES))
    if cls == HOST:
        x[_INDEX["host_ops"]] = sum(v.get("ops", 0.0) for v in classes.values())
        x[_INDEX["step_overhead"]] = 1.0
        return x
    v = classes.get(cls, {})
    if cls == "conv":
        x[_INDEX["conv_flops"]] = v.get("flops", 0.0) - v.get("grouped_flops", 0.0)
        x[_INDEX["conv_grouped_flops"]] = v.get("grouped_flops", 0.0)
        x[_INDEX["conv_thin_flops"]] = v.get("thin_flops", 0.0)
        x[_INDEX["conv_pointwise_bytes"]] = v.get("pointwise_bytes", 0.0)
    elif cls == "matmul":
        x[_INDEX["matmul_flops"]] = v.get("flops", 0.0) - v.get("rnn_flops", 0.0)
        x[_INDEX["matmul_rnn_flops"]] = v.get("rnn_flops", 0.0)
    elif cls == "pool":
        x[_INDEX["pool_window"]] = v.get("window", 0.0)
    elif cls == "optimizer":
        x[_INDEX["optimizer_fresh_bytes"]] = v.get("fresh", 0.0)
    x[_INDEX[f"{cls}_bytes"]] = v.get("bytes", 0.0) - v.get("pointwise_bytes", 0.0)
    x[_INDEX["launch_ops"]] = v.get("ops", 0.0)
    return x


def measured_class_seconds(rows: Sequence[Tuple[str, str, float]], steps: int,
                           scale: float = 1.0) -> Dict[str, float]:
    """Seconds per step of each class (and HOST) from ops.csv rows (name, device, total_s) of `steps` steps,
    times `scale` (unprofiled / profiled step time: the profiler's own overhead taken out)."""
    kernels = any(d == "cuda" for _, d, _ in rows)
    out = {c: 0.0 for c in CLASSES + (HOST,)}
    for name, device, total_s in rows:
        if kernels and device != "cuda" and name != "[no op]":
            continue  # on a GPU the kernels are the timeline; host rows would count their launches again
        out[measured_class(name, device or "cpu")] += float(total_s) / steps * scale
    return out


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| with x >= 0: scipy.optimize.nnls where scipy is installed, else Lawson-Hanson in numpy
    (scipy is no dependency of mtbench: a Jetson's Python may lack it)."""
    try:
        from scipy.optimize import nnls as scipy_nnls
    except ImportError:
        return lawson_hanson(a, b)
    try:
        return scipy_nnls(a, b)[0]
    except RuntimeError:  # its iteration limit: the numpy one has its own
        return lawson_hanson(a, b)


def lawson_hanson(a: np.ndarray, b: np.ndarray, tol: Optional[float] = None) -> np.ndarray:
    """Lawson and Hanson's active-set NNLS (Solving Least Squares Problems, 1974, ch. 23)."""
    m, n = a.shape
    tol = tol if tol is not None else 10 * np.finfo(float).eps * np.linalg.norm(a, 1) * max(m, n)
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    for _ in range(3 * n + 30):
        if passive.all() or not (w[~passive] > tol).any():
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / np.maximum(x[neg] - z[neg], 1e-300))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        w = a.T @ (b - a @ x)
    return x


def fit(rows: List[np.ndarray], targets: List[float], weights: List[float]) -> np.ndarray:
    """Coefficients of FEATURES, all >= 0, fitting rows @ c to targets in the weighted least-squares sense
    (weight: 1 / the job's step time, so each row's error counts relative to its job's step)."""
    x, y, w = np.array(rows, float), np.array(targets, float), np.array(weights, float)
    span = np.maximum(np.abs(x).max(axis=0), 1e-300)  # columns of comparable size
    coef = nnls(x / span * w[:, None], y * w)
    return coef / span


def breakdown_s(classes: Dict[str, Dict[str, float]], coef: Sequence[float]) -> Dict[str, float]:
    """Predicted seconds per step of each class and HOST."""
    c = np.asarray(coef, float)
    return {k: float(class_features(classes, k) @ c) for k in CLASSES + (HOST,)}


def describe(coef: Sequence[float]) -> str:
    """The fitted rates in a reader's units: GFLOP/s and GB/s of each class, microseconds per op and per step."""
    out = []
    for name, c in zip(FEATURES, coef):
        if name == "conv_thin_flops":  # FLOPs over the weight's narrow side: not FLOPs
            out.append(f"conv_thin {1e-9 / c:.3g} G/s" if c > 0 else "conv_thin free")
        elif name.endswith("flops"):
            out.append(f"{name[:-6]} {1e-9 / c:.3g} GFLOP/s" if c > 0 else f"{name[:-6]} free")
        elif name.endswith("bytes"):
            out.append(f"{name[:-6]} {1e-9 / c:.3g} GB/s" if c > 0 else f"{name[:-6]} free")
        elif name == "pool_window":
            out.append(f"pool {1e-9 / c:.3g} G window reads/s" if c > 0 else "pool window free")
        elif name in ("launch_ops", "host_ops"):
            out.append(f"{name} {c * 1e6:.3g} us")
        else:
            out.append(f"{name} {c * 1e3:.3g} ms")
    return ", ".join(out)


def conv_groups(func: Any, args: Any) -> int:
    """`groups` of aten.convolution (argument 8) and aten.convolution_backward (argument 9); 1 for others."""
    index = {"aten::convolution": 8, "aten::convolution_backward": 9, "aten::_convolution": 8}.get(func._schema.name)
    if index is None or len(args) <= index or not isinstance(args[index], int):
        return 1
    return int(args[index])


def add_op(figures: Dict[str, float], cls: str, func: Any, args: Any, out: Any, flops: float, groups: int,
           moved: int, hit: int, capacity: int) -> None:
    """One traced op in its class's figures: ops, flops, bytes moved less what is read from the last-level cache (a
    matrix product's inputs read recently and outputs that fit, cached_outputs; an update's re-reads of what its
    ops on one parameter read before it), and its class's own (a convolution's, a pooling's window reads)."""
    figures["ops"] += 1
    cached = hit + cache_model.cached_outputs(out, capacity) if cls == "matmul" else (hit if cls == "optimizer" else 0)
    figures["bytes"] += moved - cached
    figures["flops"] += flops
    if cls == "conv":
        add_conv_figures(figures, func, args, flops, groups, moved)
    elif cls == "pool":
        figures["window"] += pool_window_reads(func, args, out)
    elif cls == "optimizer":
        figures["fresh"] += fresh_bytes(args, out)


def fresh_bytes(args: Any, out: Any, threshold: int = MMAP_THRESHOLD_MAX) -> int:
    """Bytes of an op's CPU outputs in storage of their own of at least `threshold` bytes: glibc maps such a block
    fresh at every allocation (above the largest threshold its own rule and memory.cpu_malloc=cached reach; `live`
    maps smaller ones fresh too, not counted), and the kernel faults it in page by page as the op writes it. An
    output that shares an input's storage (an in-place op's) is not new; a GPU's caching allocator maps nothing."""
    import torch

    def storages(tree: Any) -> Dict[int, int]:
        out_: Dict[int, int] = {}
        for t in torch.utils._pytree.tree_leaves(tree):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                try:
                    storage = t.untyped_storage()
                    out_[storage._cdata] = int(storage.nbytes())
                except (RuntimeError, NotImplementedError, TypeError):  # no single storage (sparse, nested)
                    continue
        return out_

    read = storages(args)
    return sum(n for key, n in storages(out).items() if key not in read and n >= threshold)


def add_conv_figures(figures: Dict[str, float], func: Any, args: Any, flops: float, groups: int,
                     moved: int) -> None:
    """A convolution's own figures beside its FLOPs and bytes (`moved`): grouped_flops (groups > 1),
    pointwise_bytes (dense with a 1x1 kernel: its bytes), thin_flops (dense: its FLOPs over
    the narrow side of its weight seen as the product's matrix, out channels x in channels * taps: what a narrow
    product of oneDNN's runs at below its rate, DQN's 32-channel 8x8 and DenseNet's 12-channel convolutions), and
    weight_bytes (a forward's weight)."""
    name = func._schema.name
    weight_at = 2 if name == "aten::convolution_backward" else 1
    weight = args[weight_at] if len(args) > weight_at else None
    if groups > 1:
        figures["grouped_flops"] += flops
    elif weight is not None and hasattr(weight, "shape") and len(weight.shape) > 1:
        narrow = min(int(weight.shape[0]), _prod(weight.shape[1:]))
        figures["thin_flops"] += flops / max(1, narrow)
        if _prod(weight.shape[2:]) == 1:
            figures["pointwise_bytes"] += moved
    if name == "aten::convolution" and weight is not None and hasattr(weight, "numel"):
        figures["weight_bytes"] += weight.numel() * weight.element_size()


def pool_window_reads(func: Any, args: Any, out: Any) -> int:
    """What a pooling's forward reads: its outputs times its window (an adaptive one: its input, once); 0 for a
    backward (its cost is its bytes: a max pool's scatters one gradient per output)."""
    name = func._schema.name
    if "backward" in name or not args or not hasattr(args[0], "numel"):
        return 0
    if "adaptive" in name:
        return int(args[0].numel())
    kernel = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else None
    result = out[0] if isinstance(out, (list, tuple)) else out
    if not kernel or not hasattr(result, "numel"):
        return 0
    dims = next((d for d in (1, 2, 3) if f"{d}d" in name), len(kernel))
    area = _prod(kernel) if len(kernel) > 1 else int(kernel[0]) ** dims
    return int(result.numel()) * area


def grouped_backward_flops(args: Any) -> int:
    """FLOPs of aten.convolution_backward: the forward's 2 * N * |weight| * |output positions| for each gradient
    asked for (input, weight; output_mask, argument 10), as for an ungrouped one."""
    grad_out, inp, weight, transposed = args[0], args[1], args[2], bool(args[7])
    mask = args[10] if len(args) > 10 else (True, True, True)
    spatial = inp.shape[2:] if transposed else grad_out.shape[2:]
    forward = 2 * grad_out.shape[0] * weight.numel() * _prod(spatial)
    return forward * (int(bool(mask[0])) + int(bool(mask[1])))


@contextlib.contextmanager
def optimizer_marked(counter: Any) -> Iterator[None]:
    """Marks the ops run inside any optimizer's step() (global step hooks, torch >= 2.0)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    def pre(*_: Any) -> None:
        counter.in_optimizer = True

    def post(*_: Any) -> None:
        counter.in_optimizer = False

    handles = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        counter.in_optimizer = False


def _prod(values: Any) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out
