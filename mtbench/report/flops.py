"""Training FLOPs per sample of one workload, counted by torch's FlopCounterMode on the meta device (see catalog)."""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from mtbench.config import instantiate


def training_flops_per_sample(workload: Any, cfg: Any) -> Tuple[Optional[float], str]:
    """(FLOPs of one training step / batch, the input shape or the reason there is no figure)."""
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None, "not counted: needs torch >= 2.1 (torch.utils.flop_counter)"
    from mtbench.config import positive_int
    from mtbench.workload.base import SetupContext

    batch = positive_int("batch", cfg.batch)
    workload.setup(SetupContext(device=torch.device("meta"), batch_size=batch, data=_synthetic(cfg),
                                seed=int(cfg.seed), batches=1))
    try:
        with FlopCounterMode(display=False, custom_mapping=_conv_backward_mapping()) as counter, _FastLSTM():
            workload.step()
    finally:
        workload.close()
    shape = getattr(workload, "input_shape", None)
    return counter.get_total_flops() / batch, "x".join(str(n) for n in shape) if shape else ""


def _synthetic(cfg: Any):
    """The configured synthetic data, or synthetic data of the configured image size for a real data set:
    the catalog reads no files and opens no emulator."""
    from mtbench.data.synthetic import Synthetic

    if str(cfg.data.get("_target_", "")).endswith(".Synthetic"):
        return instantiate(cfg.data, "data")
    return Synthetic(image_size=cfg.data.get("image_size", 32))


def _conv_backward_mapping() -> dict:
    """torch's convolution_backward formula with the weight gradient counted per group (torch counts a
    depthwise convolution's weight gradient as if it mixed every channel with every other)."""
    from torch.utils.flop_counter import conv_flop_count

    def conv_backward_flop(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                           _output_padding, _groups, output_mask, out_shape=None, **kwargs) -> int:
        # recent torch hands a custom formula shapes, older releases may hand it the tensors: take either
        grad_out_shape, x_shape, w_shape = (getattr(t, "shape", t) for t in (grad_out_shape, x_shape, w_shape))
        flops = 0
        if output_mask[0]:  # the input gradient: a transposed convolution of grad_out with the weight
            flops += conv_flop_count(grad_out_shape, w_shape, x_shape, not transposed)
        if output_mask[1]:  # the weight gradient: as many multiply-adds as the forward convolution
            flops += conv_flop_count(x_shape, w_shape, grad_out_shape, transposed)
        return flops

    return {torch.ops.aten.convolution_backward: conv_backward_flop}


class _FastLSTM(torch.overrides.TorchFunctionMode):
    """Every torch.lstm call becomes, per layer and direction, the matrix products an LSTM does over all its
    positions at once (x W_ih^T and h W_hh^T, and h W_hr^T with projections): the FLOPs the step-by-step
    LSTM counts (within one time step's hidden-state gradient), and the same autograd structure, in a few
    operations instead of thousands. Outputs have the LSTM's shapes; their values mean nothing."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is not torch.lstm:
            return func(*args, **(kwargs or {}))
        if isinstance(args[1], torch.Tensor):  # packed: data, batch_sizes, hx, params, bias, layers, dropout, train, bi
            data, batch_sizes, hx, params, _, layers, _, _, bidirectional = args
            out, h, c = self._layers(data, hx, params, layers, bidirectional, int(batch_sizes[0]))
            return out, h, c
        x, hx, params, _, layers, _, _, bidirectional, batch_first = args
        b, t = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
        out, h, c = self._layers(x.reshape(b * t, x.shape[-1]), hx, params, layers, bidirectional, b)
        return out.reshape(x.shape[0], x.shape[1], -1), h, c

    @staticmethod
    def _layers(x, hx, params, layers, bidirectional, batch):
        dirs = 2 if bidirectional else 1
        per = len(params) // (layers * dirs)  # w_ih, w_hh[, b_ih, b_hh][, w_hr]
        anchor = sum(s.sum() for s in hx) * 0  # keeps hx in the graph (a decoder started from an encoder)
        for layer in range(layers):
            outs = []
            for d in range(dirs):
                group = params[(layer * dirs + d) * per: (layer * dirs + d + 1) * per]
                w_ih, w_hh = group[0], group[1]
                gates = x @ w_ih.t()  # N x 4H
                h = gates[:, : w_hh.shape[1]]  # a stand-in hidden state that depends on the input
                gates = gates + h @ w_hh.t() + sum((p.sum() * 0 for p in group[2:4] if per >= 4), anchor)
                out = gates[:, : w_ih.shape[0] // 4]
                if per in (3, 5):  # projections: h = (o * tanh(c)) W_hr^T
                    out = out @ group[-1].t()
                outs.append(out)
            x = torch.cat(outs, -1) if dirs > 1 else outs[0]
        hidden, cell = x.shape[-1] // dirs, params[0].shape[0] // 4
        tie = x.sum() * 0
        h_n = torch.zeros(layers * dirs, batch, hidden, device=x.device, dtype=x.dtype) + tie
        c_n = torch.zeros(layers * dirs, batch, cell, device=x.device, dtype=x.dtype) + tie
        return x, h_n, c_n
