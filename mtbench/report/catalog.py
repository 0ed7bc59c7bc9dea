"""`mtbench models`: every model in conf/model/ with its parameters and its training FLOPs per sample.

FLOPs are counted by torch.utils.flop_counter.FlopCounterMode over one real training step of the workload
(forward, backward, optimizer) on the meta device: shapes only, nothing is allocated nor computed. The count
is what FlopCounterMode counts (matrix products and convolutions, 2 FLOPs per multiply-add; element-wise
work, normalization and the optimizer's update are not counted), per sample at the configured batch and
input size, on synthetic data shaped like the real set. Two corrections: torch's convolution backward
formula ignores groups (it counts a depthwise convolution's weight gradient `groups` times over), and an
LSTM on the meta device runs step by step through Python decompositions (seconds for one BiDAF step), so
each LSTM call is replaced by the same matrix products done for all time steps at once (the same FLOPs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import torch
from hydra import compose, initialize_config_dir
from rich.table import Table

from mtbench.config import conf_dir, group_options, instantiate
from mtbench.results.console import console
from mtbench.errors import UsageError, describe_error


@dataclass
class ModelRow:
    name: str
    parameters: int  # trained parameters
    paper_params: Optional[int]  # the count the paper's Table II gives, when it gives one
    flops_per_sample: Optional[float]  # forward + backward FLOPs of one training sample (None: see flops_note)
    flops_note: str  # the input the FLOPs are for ("3x32x32"), or why they are missing
    description: str


def model_rows(overrides: Sequence[str] = (), names: Optional[Sequence[str]] = None) -> List[ModelRow]:
    """One row per model (or per model in `names`), each composed with `overrides` (e.g. data.image_size=224,
    batch=1). A model that an override does not fit (model.workload.net.variant for bert) is left out."""
    rows, skipped = [], []
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        for name in names if names is not None else group_options("model"):
            try:
                cfg = compose(config_name="config", overrides=[f"model={name}", *overrides])
            except Exception as exc:  # an override for keys this model does not have (model.workload.net...)
                skipped.append((name, exc))
                continue
            rows.append(_row(name, cfg))
    if not rows and skipped:
        raise UsageError(f"the overrides {' '.join(overrides)} apply to no model ({skipped[0][1]})")
    return rows


def _row(name: str, cfg: Any) -> ModelRow:
    with torch.device("meta"):  # shapes only: a 140M-parameter VGG costs nothing to build
        workload = instantiate(cfg.model.workload, "model.workload")
    params = workload.parameter_count()
    try:
        flops, note = training_flops_per_sample(workload, cfg)
        params = workload.parameter_count()  # after setup: some models size their vocabulary from the data
    except Exception as exc:  # e.g. dcgan at data.image_size=224: the row keeps its parameters and says why
        flops, note = None, f"not counted: {describe_error(exc)}"
    return ModelRow(name, params, cfg.model.get("paper_params"), flops, note, cfg.model.description)


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


def print_models(overrides: Sequence[str] = ()) -> None:
    rows = model_rows(overrides)
    table = Table(title="mtbench models" + (f" ({' '.join(overrides)})" if overrides else ""),
                  caption="GFLOP/sample: forward + backward of one training sample, at the configured batch "
                          "and input size (FlopCounterMode on the meta device; see README)")
    for column in ("model", "parameters", "paper (Table II)", "GFLOP/sample", "input", "description"):
        table.add_column(column, justify="right" if column in ("parameters", "paper (Table II)", "GFLOP/sample")
                         else "left")
    for row in rows:
        flops = f"{row.flops_per_sample / 1e9:.3g}" if row.flops_per_sample is not None else "n/a"
        table.add_row(row.name, f"{row.parameters / 1e6:.2f}M", f"{row.paper_params / 1e6:.0f}M" if row.paper_params
                      else "", flops, row.flops_note, row.description)
    console.print(table)
    left_out = sorted(set(group_options("model")) - {row.name for row in rows})
    if left_out:
        console.print(f"left out (the overrides do not apply to them): {', '.join(left_out)}")
