"""The per-op-class time model: op classes, NNLS, the fit recovering a known cost from synthetic ops, calibrate."""
from __future__ import annotations

import functools
import inspect
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List

import numpy as np
import pytest
import torch

# the predictor needs torch >= 2.5 (MemTracker; mtbench.predict.MIN_TORCH): on an older torch the module skips
pytest.importorskip("torch.distributed._tools.mem_tracker", reason="the predictor needs torch >= 2.5 (MemTracker)")

from mtbench.data.synthetic import Synthetic  # noqa: E402
from mtbench.predict import cache_model, calibration, opcost  # noqa: E402
from mtbench.predict.fit import calibrate  # noqa: E402
from mtbench.predict.trace import trace_step  # noqa: E402
from mtbench.workload.base import SetupContext, Workload  # noqa: E402

# a cost every coefficient of which matters: 50 GFLOP/s dense conv, 5 GFLOP/s grouped, ...
TRUE = dict(conv_flops=1 / 50e9, conv_grouped_flops=1 / 5e9, conv_bytes=1 / 20e9, conv_pointwise_bytes=1 / 35e9,
            conv_thin_flops=1 / 2e9,
            matmul_flops=1 / 80e9, matmul_bytes=1 / 30e9, matmul_rnn_flops=1 / 40e9, norm_bytes=1 / 8e9,
            elementwise_bytes=1 / 10e9,
            reduction_bytes=1 / 4e9, pool_bytes=1 / 3e9, pool_window=1 / 1e9, optimizer_bytes=1 / 6e9,
            optimizer_fresh_bytes=1 / 2e9, launch_ops=4e-6,
            host_ops=2e-6, step_overhead=1.5e-3)
TRUE_COEF = np.array([TRUE[f] for f in opcost.FEATURES])


def _classes(rng: np.random.Generator) -> Dict[str, Dict[str, float]]:
    out = opcost.empty_classes()
    for c in opcost.CLASSES:
        out[c]["bytes"] = float(rng.uniform(1e6, 5e8))
        out[c]["ops"] = float(rng.integers(5, 2000))
    for c in ("conv", "matmul"):
        out[c]["flops"] = float(rng.uniform(1e8, 5e10))
    out["conv"]["grouped_flops"] = out["conv"]["flops"] * float(rng.uniform(0, 0.5))
    out["matmul"]["rnn_flops"] = out["matmul"]["flops"] * float(rng.uniform(0, 0.5))
    out["conv"]["pointwise_bytes"] = out["conv"]["bytes"] * float(rng.uniform(0, 0.6))
    out["pool"]["window"] = out["pool"]["bytes"] * float(rng.uniform(0.2, 3))
    out["conv"]["thin_flops"] = (out["conv"]["flops"] - out["conv"]["grouped_flops"]) / float(rng.uniform(8, 512))
    out["optimizer"]["fresh"] = out["optimizer"]["bytes"] * float(rng.uniform(0, 0.3))
    return out


def _ops_rows(classes: Dict[str, Dict[str, float]], steps: int) -> List[tuple]:
    """ops.csv rows whose class totals are the model's exactly (names as the profiler writes them)."""
    names = {"conv": ["aten::conv2d", "ConvolutionBackward0"], "matmul": ["aten::linear", "AddmmBackward0"],
             "norm": ["aten::batch_norm", "NativeBatchNormBackward0"], "elementwise": ["aten::relu_", "aten::add"],
             "reduction": ["aten::softmax", "NllLossBackward0"], "pool": ["aten::max_pool2d", "AvgPool2DBackward0"],
             "optimizer": ["Optimizer.step#SGD.step"],
             opcost.HOST: ["[no op]"]}
    rows = []
    for cls, seconds in opcost.breakdown_s(classes, TRUE_COEF).items():
        for i, name in enumerate(names[cls]):  # split unevenly over the class's names
            share = 1.0 if len(names[cls]) == 1 else (0.7 if i == 0 else 0.3)
            rows.append((name, "cpu" if cls != opcost.HOST else "", seconds * share * steps))
    return rows


def test_fit_recovers_a_known_per_class_cost_from_per_op_times():
    rng = np.random.default_rng(0)
    rows, y, w = [], [], []
    for _ in range(8):
        classes = _classes(rng)
        step = float(opcost.step_features(classes) @ TRUE_COEF)
        per_class = opcost.measured_class_seconds(_ops_rows(classes, 3), steps=3)
        for cls, seconds in per_class.items():
            rows.append(opcost.class_features(classes, cls))
            y.append(seconds)
            w.append(1 / step)
    coef = opcost.fit(rows, y, w)
    np.testing.assert_allclose(coef, TRUE_COEF, rtol=1e-6)


def test_lawson_hanson_agrees_with_scipy_and_keeps_coefficients_nonnegative():
    scipy_nnls = pytest.importorskip("scipy.optimize").nnls
    rng = np.random.default_rng(1)
    for _ in range(20):
        a = rng.normal(size=(30, 8))
        b = rng.normal(size=30)  # noise: several coefficients end at the bound 0
        x = opcost.lawson_hanson(a, b)
        ref = scipy_nnls(a, b)[0]
        assert (x >= 0).all() and (x == 0).any()
        np.testing.assert_allclose(x, ref, atol=1e-8)


def test_profiled_class_times_are_scaled_to_the_unprofiled_step():
    rows = [("aten::conv2d", "cpu", 0.6), ("[no op]", "", 0.2), ("Optimizer.step#Adam.step", "cpu", 0.2)]
    out = opcost.measured_class_seconds(rows, steps=2, scale=0.5)
    assert out["conv"] == pytest.approx(0.15) and out[opcost.HOST] == pytest.approx(0.05)
    assert out["optimizer"] == pytest.approx(0.05) and out["matmul"] == 0.0


@pytest.mark.parametrize("name, cls", [
    ("aten::conv2d", "conv"), ("ConvolutionBackward0", "conv"), ("aten::linear", "matmul"),
    ("AddmmBackward0", "matmul"), ("MmBackward0", "matmul"), ("aten::batch_norm", "norm"),
    ("NativeBatchNormBackward0", "norm"), ("aten::max_pool2d", "pool"), ("LogSoftmaxBackward0", "reduction"),
    ("MaxPool2DWithIndicesBackward0", "pool"), ("aten::adaptive_avg_pool2d", "pool"), ("aten::sum", "reduction"),
    ("aten::hardtanh_", "elementwise"), ("torch::autograd::AccumulateGrad", "elementwise"),
    ("Optimizer.step#SGD.step", "optimizer"), ("[no op]", opcost.HOST), ("aten::lstm", "matmul"),
    ("MkldnnRnnLayerBackward0", "matmul"), ("aten::gru", "matmul"), ("EmbeddingBackward0", "elementwise"),
    ("aten::embedding", "elementwise"), ("aten::normal_", "elementwise"), ("aten::_foreach_norm", "optimizer"),
    ("aten::_foreach_mul_", "optimizer")])
def test_ops_csv_names_fall_in_the_classes_of_their_traced_ops(name, cls):
    assert opcost.measured_class(name) == cls


class OneLayer(Workload):
    """One layer trained with plain SGD on a fixed random input, `shape` per sample."""

    def __init__(self, net: torch.nn.Module, shape: tuple, input_grad: bool = False) -> None:
        self.net, self.shape, self.input_grad = net, shape, input_grad

    def setup(self, ctx: SetupContext) -> None:
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.1)
        self.x = torch.randn(ctx.batch_size, *self.shape, requires_grad=self.input_grad)

    def step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.net(self.x).sum().backward()
        self.optimizer.step()

    def modules(self) -> List[torch.nn.Module]:
        return [self.net]


def depthwise_conv(groups: int) -> OneLayer:
    return OneLayer(torch.nn.Conv2d(32, 64, 3, padding=1, groups=groups), (32, 8, 8), input_grad=True)


@pytest.mark.parametrize("groups", [1, 4, 32])
def test_grouped_convolution_flops_and_classes(groups):
    """torch's formula counts a grouped convolution's weight gradient `groups` times; the trace does not."""
    ctx = SetupContext(device=torch.device("cpu"), batch_size=2, data=Synthetic(), seed=0, batches=1)
    t = trace_step(lambda: depthwise_conv(groups), ctx)
    conv = t.op_classes["conv"]
    forward = 2 * 2 * (64 * 32 // groups * 9) * 8 * 8
    assert t.forward_flops == forward
    assert conv["flops"] == t.flops == 3 * forward  # forward, input gradient, weight gradient
    assert conv["grouped_flops"] == (conv["flops"] if groups > 1 else 0)
    assert conv["pointwise_bytes"] == 0  # a 3x3 kernel
    # a dense one's FLOPs over its weight's narrow side: 64 out channels against 32 in x 9 taps
    assert conv["thin_flops"] == (conv["flops"] / 64 if groups == 1 else 0)
    assert conv["ops"] == 2
    assert conv["weight_bytes"] == 64 * (32 // groups) * 9 * 4  # the forward's weight, once
    assert t.op_classes["optimizer"]["ops"] > 0 and t.op_classes["optimizer"]["bytes"] > 0


@pytest.mark.parametrize("conv, narrow", [(torch.nn.Conv2d(4, 32, 8, stride=4), 32),  # DQN's first: 32 out
                                          (torch.nn.Conv2d(3, 64, 3, padding=1), 27),  # 3 in x 9 taps
                                          (torch.nn.Conv2d(48, 12, 3, padding=1), 12)])  # DenseNet's growth 12
def test_a_dense_convolution_counts_its_flops_over_the_narrow_side_of_its_weight(conv, narrow):
    ctx = SetupContext(device=torch.device("cpu"), batch_size=2, data=Synthetic(), seed=0, batches=1)
    t = trace_step(lambda: OneLayer(conv, (conv.in_channels, 84, 84)), ctx)
    figures = t.op_classes["conv"]
    assert figures["flops"] == 2 * t.forward_flops > 0  # the forward and the weight's gradient (x needs none)
    assert figures["thin_flops"] == pytest.approx(figures["flops"] / narrow)


@pytest.mark.parametrize("conv, pointwise", [(torch.nn.Conv2d(32, 64, 1), True),  # a bottleneck's 1x1
                                             (torch.nn.Conv2d(32, 64, 1, stride=2), True),  # ResNet's shortcut
                                             (torch.nn.Conv2d(32, 64, 3, padding=1), False),
                                             (torch.nn.Conv2d(32, 32, 1, groups=32), False),  # grouped: its own
                                             (torch.nn.Conv1d(32, 64, 1), True)])
def test_a_dense_1x1_convolutions_bytes_are_its_own_term(conv, pointwise):
    """A dense 1x1 convolution (forward, input and weight gradients) reads each input once, where a k x k one
    gathers it at each tap: its bytes are pointwise_bytes, taken out of conv_bytes and fitted at a rate of their
    own (class_features)."""
    ctx = SetupContext(device=torch.device("cpu"), batch_size=2, data=Synthetic(), seed=0, batches=1)
    shape = (32, 16) if isinstance(conv, torch.nn.Conv1d) else (32, 8, 8)
    t = trace_step(lambda: OneLayer(conv, shape, input_grad=True), ctx)
    figures = t.op_classes["conv"]
    assert figures["flops"] == 3 * t.forward_flops > 0 and figures["ops"] == 2 and figures["bytes"] > 0
    assert figures["pointwise_bytes"] == (figures["bytes"] if pointwise else 0)
    x = opcost.class_features(t.op_classes, "conv")
    index = opcost.FEATURES.index
    assert x[index("conv_pointwise_bytes")] == figures["pointwise_bytes"]
    assert x[index("conv_bytes")] == (0 if pointwise else figures["bytes"])


@pytest.mark.parametrize("pool, reads_per_output", [(torch.nn.MaxPool2d(3, 1, padding=1), 9),
                                                    (torch.nn.MaxPool2d(2), 4), (torch.nn.AvgPool2d(3, 2), 9),
                                                    (torch.nn.AdaptiveAvgPool2d(2), None)])
def test_a_pooling_forward_reads_its_window_per_output_and_its_backward_none(pool, reads_per_output):
    """A 3x3 window at stride 1 reads 9 inputs per output where its bytes (input and output) count about 2; an
    adaptive one (to 2x2, not 1x1: that is a mean) reads its input once."""
    ctx = SetupContext(device=torch.device("cpu"), batch_size=2, data=Synthetic(), seed=0, batches=1)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), pool)
    t = trace_step(lambda: OneLayer(net, (3, 16, 16)), ctx)
    outputs = net(torch.zeros(2, 3, 16, 16)).numel()
    assert t.op_classes["pool"]["ops"] == 2  # the forward and its backward
    inputs = 2 * 4 * 16 * 16  # an adaptive one reads its input once, and its backward nothing
    assert t.op_classes["pool"]["window"] == (outputs * reads_per_output if reads_per_output else inputs)


@pytest.mark.parametrize("measured, traced", [
    ("aten::lstm", "aten::mkldnn_rnn_layer"), ("MkldnnRnnLayerBackward0", "aten::mkldnn_rnn_layer_backward"),
    ("EmbeddingBackward0", "aten::embedding_dense_backward"), ("aten::embedding", "aten::embedding"),
    ("aten::normal_", "aten::normal_"), ("aten::max_pool2d", "aten::max_pool2d_with_indices"),
    ("MaxPool2DWithIndicesBackward0", "aten::max_pool2d_with_indices_backward"),
    ("aten::adaptive_avg_pool2d", "aten::_adaptive_avg_pool2d"), ("LogSoftmaxBackward0", "aten::_log_softmax_backward_data"),
    ("aten::_foreach_norm", "aten::_foreach_norm.Scalar"), ("aten::_foreach_mul_", "aten::_foreach_mul_.Tensor")])
def test_a_measured_op_and_the_kernel_the_trace_sees_for_it_share_a_class(measured, traced):
    """The fit compares a class's measured time with its traced figures: an LSTM timed as element-wise but traced as
    a matrix product (or the reverse) would make both classes' rates wrong."""
    assert opcost.measured_class(measured) == opcost.aten_class(traced)


class LSTMStep(Workload):
    def __init__(self) -> None:
        self.net = torch.nn.LSTM(12, 16, num_layers=2)

    def setup(self, ctx: SetupContext) -> None:
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.1)
        self.x = torch.randn(5, ctx.batch_size, 12)

    def step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.net(self.x)[0].sum().backward()
        self.optimizer.step()

    def modules(self) -> List[torch.nn.Module]:
        return [self.net]


class ClippedLSTMStep(LSTMStep):
    """LSTMStep with its gradients clipped, as seq2seq and char_rnn clip theirs."""

    def step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.net(self.x)[0].sum().backward()
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), 5.0)
        self.optimizer.step()


def test_a_traced_lstm_counts_the_flops_torch_counts_for_its_matrix_products():
    """oneDNN's RNN layer has no formula in FlopCounterMode; with oneDNN off, the same LSTM runs as matrix products
    torch does count: both traces give the same FLOPs, and the layer is a matrix product in both."""
    from mtbench.predict import rnn_workspace

    if rnn_workspace.LAYER_OP is None:
        pytest.skip(f"torch {torch.__version__} has no aten::mkldnn_rnn_layer")
    ctx = SetupContext(device=torch.device("cpu"), batch_size=3, data=Synthetic(), seed=0, batches=1)
    onednn = trace_step(LSTMStep, ctx)
    with torch.backends.mkldnn.flags(enabled=False):
        native = trace_step(LSTMStep, ctx)
    assert onednn.op_classes["matmul"]["ops"] == 4  # two layers, forward and backward
    forward = 2 * 5 * 3 * (4 * 16 * 12 + 4 * 16 * 16) + 2 * 5 * 3 * (4 * 16 * 16 + 4 * 16 * 16)
    assert onednn.forward_flops == forward
    assert onednn.flops == 3 * forward
    # oneDNN's backward computes every gradient; torch's products skip the input's (x needs none) and, in each
    # layer, the one of the zero initial hidden state (2 x batch x 4H x H)
    skipped = 2 * 5 * 3 * (4 * 16 * 12) + 2 * (2 * 3 * 4 * 16 * 16)
    assert native.flops + skipped == onednn.flops
    assert onednn.op_classes["matmul"]["flops"] == onednn.flops
    # all of them a recurrent layer's (matmul_rnn_flops, a rate of their own); the same products run one by one
    # are plain matrix products
    assert onednn.op_classes["matmul"]["rnn_flops"] == onednn.flops and native.op_classes["matmul"]["rnn_flops"] == 0
    x = opcost.class_features(onednn.op_classes, "matmul")
    assert x[opcost.FEATURES.index("matmul_rnn_flops")] == onednn.flops
    assert x[opcost.FEATURES.index("matmul_flops")] == 0


@pytest.mark.parametrize("kind,proj,bidirectional,packed", [("LSTM", 0, False, False), ("LSTM", 6, True, False),
                                                             ("LSTM", 0, True, True), ("GRU", 0, True, False)])
def test_a_cudnn_rnn_stack_counts_the_flops_torch_counts_for_its_matrix_products(kind, proj, bidirectional, packed):
    """cuDNN runs a whole recurrent stack as one op (`_cudnn_rnn`) that FlopCounterMode counts as 0; its arguments
    (as torch's cuDNN path passes them: the module's flat weights, the packed rows) give the FLOPs torch counts for
    the same stack run as matrix products on a CPU, projections, both directions and packed sequences included."""
    from torch.nn.utils.rnn import pack_padded_sequence
    from torch.utils.flop_counter import FlopCounterMode

    from mtbench.predict import rnn_workspace

    extra = {"proj_size": proj} if kind == "LSTM" else {}
    rnn = getattr(torch.nn, kind)(12, 16, num_layers=2, bidirectional=bidirectional, **extra)
    x = torch.randn(5, 3, 12)
    data = pack_padded_sequence(x, [5, 3, 2]) if packed else x
    with torch.backends.mkldnn.flags(enabled=False), torch.no_grad(), FlopCounterMode(display=False) as counter:
        rnn(data)
    inp, sizes = (data.data, list(data.batch_sizes)) if packed else (x, [])
    layers, out = 2 * (2 if bidirectional else 1), proj or 16
    hx, cx = torch.zeros(layers, 3, out), (torch.zeros(layers, 3, 16) if kind == "LSTM" else None)
    mode = {"LSTM": 2, "GRU": 3}[kind]  # cuDNN's modes: RNN_RELU 0, RNN_TANH 1, LSTM 2, GRU 3
    args = (inp, rnn._flat_weights, (4 if rnn.bias else 2) + int(bool(proj)), None, hx, cx, mode, 16, proj, 2,
            False, 0.0, True, bidirectional, sizes, None)
    forward = rnn_workspace.layer_flops(torch.ops.aten._cudnn_rnn.default, args)
    assert forward == counter.get_total_flops() > 0
    # the backward: the data gradients always, the weights' where output_mask[3] asks; nothing without a gradient
    backward = torch.ops.aten._cudnn_rnn_backward.default
    output = torch.zeros(inp.shape[:-1] + (out * (2 if bidirectional else 1),))
    grads = args[:6] + (output, torch.ones_like(output), None, None) + args[6:] + (None, [True, False, False, True])
    assert rnn_workspace.layer_flops(backward, grads) == 2 * forward
    assert rnn_workspace.layer_flops(backward, grads[:-1] + ([True, False, False, False],)) == forward
    assert rnn_workspace.layer_flops(backward, args[:6] + (output, None, None, None) + grads[10:]) == 0
    assert rnn_workspace.layer_flops(torch.ops.aten._cudnn_rnn_flatten_weight.default, args) == 0


@pytest.mark.parametrize("workload", ["lstm", "conv", "clipped"])
def test_a_fake_trace_counts_the_ops_and_bytes_a_real_step_runs(workload):
    """On fake tensors the autograd engine's and kernels' reads of a tensor's device dispatch prim::device (4 of
    every 5 ops of a BERT step); on real tensors nothing runs for them: both traces count the same ops and bytes.
    Gradient clipping takes the same path on both (torch >= 2.1: one _foreach_norm over the gradients, where fake
    tensors took one norm per gradient), in the class the update's ops are in."""
    make = {"lstm": LSTMStep, "conv": lambda: depthwise_conv(1), "clipped": ClippedLSTMStep}[workload]
    ctx = SetupContext(device=torch.device("cpu"), batch_size=3, data=Synthetic(), seed=0, batches=1)
    fake, real = trace_step(make, ctx), trace_step(make, ctx, fake=False)
    assert (fake.ops, fake.bytes_moved) == (real.ops, real.bytes_moved)
    assert {c: v["ops"] for c, v in fake.op_classes.items()} == {c: v["ops"] for c, v in real.op_classes.items()}
    if workload == "clipped" and "foreach" in inspect.signature(torch.nn.utils.clip_grad_norm_).parameters:
        plain = trace_step(LSTMStep, ctx)  # the clipping's _foreach_norm and _foreach_mul_ go with the update
        assert fake.op_classes["optimizer"]["ops"] == plain.op_classes["optimizer"]["ops"] + 2


class DecayedLinear(OneLayer):
    """A linear layer trained with SGD, momentum and weight decay (the update's weight-decayed gradient is a new
    tensor the size of each parameter; the rest of the update is in place)."""

    def __init__(self, features: int, weight_decay: float) -> None:
        super().__init__(torch.nn.Linear(features, features), (features,))
        self.weight_decay = weight_decay

    def setup(self, ctx: SetupContext) -> None:
        super().setup(ctx)
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9, weight_decay=self.weight_decay)


@pytest.mark.parametrize("features, weight_decay, fresh", [(3000, 1e-4, 3000 * 3000 * 4), (3000, 0.0, 0),
                                                             (2000, 1e-4, 0)])
def test_an_updates_new_tensors_past_glibcs_mmap_ceiling_are_its_fresh_bytes(features, weight_decay, fresh):
    """A 36 MB weight's weight-decayed gradient is a new block above glibc's largest mmap threshold: mapped and
    faulted in at every step (its bias's and a 16 MB weight's come from the heap); an update without weight decay
    writes in place. Fake and real traces count the same."""
    ctx = SetupContext(device=torch.device("cpu"), batch_size=2, data=Synthetic(), seed=0, batches=1)
    make = functools.partial(DecayedLinear, features, weight_decay)
    fake, real = trace_step(make, ctx), trace_step(make, ctx, fake=False)
    assert fake.op_classes["optimizer"]["fresh"] == real.op_classes["optimizer"]["fresh"] == fresh
    assert all(v["fresh"] == 0 for c, v in fake.op_classes.items() if c != "optimizer")
    x = opcost.class_features(fake.op_classes, "optimizer")
    assert x[opcost.FEATURES.index("optimizer_fresh_bytes")] == fresh


class _FakePredictor:
    """Stands in for Predictor in calibrate: traces known per-class figures (as a real trace gives them)."""

    def __init__(self, classes: Dict[tuple, Dict[str, Dict[str, float]]], tensors: Dict[tuple, int] = None) -> None:
        self.classes = classes
        self.tensors = tensors or {}
        self.target = SimpleNamespace(peak_fp32_flops=None, dram_bandwidth_bytes_per_s=None)
        self.calibration = None

    def trace(self, model: str, batch: int, stat: str = "max"):
        c = self.classes[(model, batch)]
        return SimpleNamespace(op_classes=c, host_bytes=0, flops=sum(v["flops"] for v in c.values()),
                               bytes_moved=sum(v["bytes"] for v in c.values()),
                               ops=int(sum(v["ops"] for v in c.values()))), "fake"

    def held_outside(self, trace):
        return trace.host_bytes, ""

    def predict(self, model: str, batch: int, timed: bool = True):
        trace, _ = self.trace(model, batch)
        tensors = self.tensors.get((model, batch), 1 << 20)
        return SimpleNamespace(flops=trace.flops, bytes_moved=trace.bytes_moved, ops=trace.ops, tensors_bytes=tensors,
                               breakdown_bytes={"parameters": tensors // 4, "activations": tensors * 3 // 4})


def test_calibrate_fits_the_op_model_from_ops_csv_and_predicts_a_model_it_never_saw(tmp_path: Path):
    rng = np.random.default_rng(2)
    classes, summaries = {}, []
    for i in range(6):
        key = (f"m{i}", 2)
        classes[key] = _classes(rng)
        step = float(opcost.step_features(classes[key]) @ TRUE_COEF)
        job = tmp_path / f"{i}"
        job.mkdir()
        # the profiler slows every op by 10 %: ops.csv holds the profiled times
        lines = ["name,device,calls,total_s"] + [f"{n},{d},1,{s * 1.1!r}" for n, d, s in _ops_rows(classes[key], 3)]
        if i % 2 == 0:  # half the jobs profiled (ops.csv), half ordinary
            (job / "ops.csv").write_text("\n".join(lines) + "\n")
        summary = {"model": key[0], "batch_size": 2, "device": "cpu", "success": True, "measured_steps": 3,
                   "step_time_s": {"median": step * (1.1 if i % 2 == 0 else 1.0)}, "env": {"device_name": "x"},
                   "profiled": i % 2 == 0, "_path": str(job / "summary.json")}
        if i % 2 == 0:
            summary["profile"] = {"unprofiled_step_time_s": {"median": step}}
        (job / "summary.json").write_text(json.dumps(summary))
        summaries.append(summary)
    cal, path, report = calibrate(tmp_path, target="none", out=str(tmp_path / "cal.json"), summaries=summaries,
                                  predictor=_FakePredictor(classes))
    assert cal.op_profiled_runs == 3 and cal.op_fit_mape_pct < 1e-6
    np.testing.assert_allclose(cal.op_coef, TRUE_COEF, rtol=1e-6)
    assert calibration.load(cal.key, path).op_coef == cal.op_coef
    unseen = _classes(rng)
    assert float(opcost.step_features(unseen) @ np.array(cal.op_coef)) == pytest.approx(
        float(opcost.step_features(unseen) @ TRUE_COEF), rel=1e-6)
    assert any("GFLOP/s" in line for line in report)


def test_calibration_and_evaluation_share_no_model():
    from mtbench.errors import UsageError
    from mtbench.predict.fit import split_by_model

    runs = [{"model": m, "batch_size": b} for m in ("alexnet", "resnet50", "xception", "vgg16") for b in (2, 8, 32)]
    fit, test = split_by_model(runs, ["xception", "vgg16"])
    assert {s["model"] for s in fit} == {"alexnet", "resnet50"} and {s["model"] for s in test} == {"xception", "vgg16"}
    assert len(fit) + len(test) == len(runs)
    with pytest.raises(UsageError, match="bert"):
        split_by_model(runs, ["bert"])
    with pytest.raises(UsageError, match="at least one"):
        split_by_model(runs, ["alexnet", "resnet50", "xception", "vgg16"])


def test_the_runtime_memory_fit_has_a_term_per_convolution_weight_byte(tmp_path: Path):
    """A CPU job's memory beyond its tensors grows with its convolution weights (oneDNN's reordered copies):
    the fit recovers a known constant + per op + per transient byte + per conv weight byte, and the predictor
    adds it (xception's and resnet50's runtime was 19-30 % of training memory off without it)."""
    rng = np.random.default_rng(3)
    truth = (60 << 20, 2000.0, 0.25, 1.4)
    classes, tensors, summaries = {}, {}, []
    for i in range(8):
        key = (f"m{i}", 2)
        c = _classes(rng)
        c["conv"]["weight_bytes"] = float(rng.uniform(1e6, 1e8))
        tensors[key] = int(rng.uniform(5e7, 5e8))
        classes[key] = c
        ops = int(sum(v["ops"] for v in c.values()))
        runtime = truth[0] + truth[1] * ops + truth[2] * (tensors[key] * 3 // 4) + truth[3] * c["conv"]["weight_bytes"]
        job = tmp_path / f"{i}"
        job.mkdir()
        summaries.append({"model": key[0], "batch_size": 2, "device": "cpu", "success": True, "measured_steps": 3,
                          "step_time_s": {"median": 1.0}, "env": {"device_name": "x"}, "_path": str(job / "s.json"),
                          "mem_peak_source": "process_rss", "mem_runtime_bytes": 500 << 20,
                          "mem_peak_bytes": (500 << 20) + tensors[key] + int(runtime)})
    cal, _, _ = calibrate(tmp_path, target="none", out=str(tmp_path / "cal.json"), summaries=summaries,
                          predictor=_FakePredictor(classes, tensors))
    got = (cal.non_tensor_bytes, cal.non_tensor_per_op_bytes, cal.non_tensor_per_transient_byte, cal.non_tensor_per_conv_weight_byte)
    np.testing.assert_allclose(got, truth, rtol=1e-3)

    from mtbench.predict.predictor import Predictor

    predictor = object.__new__(Predictor)  # only _runtime: no config needed
    predictor.calibration, predictor.device = cal, "cpu"
    trace = SimpleNamespace(ops=100, op_classes={"conv": {"weight_bytes": 50e6}})
    runtime, _ = predictor._runtime(trace, {"activations": 10 << 20})
    assert runtime == pytest.approx(truth[0] + truth[1] * 100 + truth[2] * (10 << 20) + truth[3] * 50e6, rel=1e-3)


def test_a_products_output_that_fits_the_cache_is_not_its_dram_traffic():
    """cached_outputs: each output of at most the cache's size counts as cached, a larger one does not, and
    without a cache (capacity 0) none does; in a trace, the matrix products' bytes drop by their outputs."""
    small, large = torch.zeros(256), torch.zeros(4096)  # 1 KiB, 16 KiB
    assert cache_model.cached_outputs((small, large), 8 << 10) == 1 << 10
    assert cache_model.cached_outputs(small, 0) == 0

    def linear() -> OneLayer:
        return OneLayer(torch.nn.Linear(64, 64), (64,))

    ctx = SetupContext(device=torch.device("cpu"), batch_size=8, data=Synthetic(), seed=0, batches=1)
    uncached = trace_step(linear, ctx, cache_bytes=0).op_classes["matmul"]["bytes"]
    cached = trace_step(linear, ctx, cache_bytes=1 << 30).op_classes["matmul"]["bytes"]
    # forward addmm's output (8 x 64), the backward's weight gradient (64 x 64); the input needs no gradient
    assert uncached - cached >= (8 * 64 + 64 * 64) * 4
