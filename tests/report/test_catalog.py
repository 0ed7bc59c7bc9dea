"""`mtbench models`: parameters and training FLOPs per sample, counted on the meta device."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from mtbench.report.catalog import model_rows
from mtbench.report.flops import _conv_backward_mapping, _FastLSTM
from mtbench.config import group_options

try:
    from torch.utils.flop_counter import FlopCounterMode
except ImportError:  # torch 2.0 (JetPack 5.1): the catalog gives null FLOPs with the reason
    FlopCounterMode = None
needs_flop_counter = pytest.mark.skipif(FlopCounterMode is None, reason="torch.utils.flop_counter needs torch >= 2.1")


@pytest.fixture(scope="module")
def rows():
    return {row.name: row for row in model_rows()}


@pytest.mark.slow
def test_without_a_flop_counter_flops_are_null_with_the_reason(rows):
    if FlopCounterMode is not None:
        pytest.skip("this torch has torch.utils.flop_counter")
    assert all(r.flops_per_sample is None and "torch >= 2.1" in r.flops_note for r in rows.values())
    assert rows["resnet50"].parameters == 23_520_842


@needs_flop_counter
def test_every_model_has_parameters_and_flops(rows):
    assert set(rows) == set(group_options("model"))
    for row in rows.values():
        assert row.flops_per_sample and row.flops_per_sample > 1e6, (row.name, row.flops_note)
    # the counts that the architectures fix exactly (10-class heads)
    assert rows["resnet50"].parameters == 23_520_842  # torchvision's ResNet-50 with the 3x3 stem (as kuangliu's)
    assert rows["vgg16"].parameters == 15_245_130  # torchvision's VGG16 convolutions + 512-512-10
    assert 0.95e6 < rows["densenet40"].parameters < 1.1e6  # Huang et al. Table 2: 1.0M
    assert 6.8e6 < rows["densenet100"].parameters < 7.2e6  # Huang et al. Table 2: 7.0M
    assert rows["resnet50"].flops_note == "3x32x32"


@needs_flop_counter
def test_resnet50_flops_are_three_forwards():
    # ResNet-50 in its CIFAR form: 1.30 GMAC forward per 32x32 image (kuangliu/pytorch-cifar's figure);
    # backward costs two forwards except the first convolution's input gradient
    (row,) = model_rows(["batch=1"], names=["resnet50"])
    assert row.flops_per_sample == pytest.approx(3 * 2 * 1.30e9, rel=0.01)


@needs_flop_counter
def test_image_size_scales_the_flops():
    rows = {r.name: r for r in model_rows(["data.image_size=64", "batch=2"], names=["resnet50", "dcgan"])}
    assert rows["resnet50"].flops_note == "3x64x64"
    assert rows["resnet50"].flops_per_sample == pytest.approx(4 * 7.783e9, rel=0.01)
    assert rows["dcgan"].flops_per_sample is None and "data.image_size=32" in rows["dcgan"].flops_note


def _count(fn, **mode):
    with FlopCounterMode(display=False, **mode) as counter:
        fn()
    return counter.get_total_flops()


@needs_flop_counter
def test_depthwise_convolution_backward_counts_each_group_once():
    conv = nn.Conv2d(64, 64, 3, padding=1, groups=64, bias=False, device="meta")
    x = torch.empty(2, 64, 8, 8, device="meta", requires_grad=True)
    forward = _count(lambda: conv(x))
    fixed = _count(lambda: conv(x).sum().backward(), custom_mapping=_conv_backward_mapping())
    assert fixed == 3 * forward  # forward, input gradient, weight gradient: one forward's work each
    assert _count(lambda: conv(x).sum().backward()) > 60 * forward  # what torch's own formula gives


@needs_flop_counter
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("kwargs", [dict(num_layers=2, bidirectional=True), dict(num_layers=1, proj_size=4)])
def test_fast_lstm_counts_what_the_lstm_counts(packed, kwargs):
    # the reference: the LSTM as the meta device runs it, step by step (on the CPU it is one uncounted kernel)
    lstm = nn.LSTM(6, 8, batch_first=True, device="meta", **kwargs)
    x = torch.empty(3, 10, 6, device="meta", requires_grad=True)

    def step():
        inp = pack_padded_sequence(x, torch.tensor([10, 7, 4]), batch_first=True) if packed else x
        out, (h, c) = lstm(inp)
        (out.data if packed else out).sum().backward()

    real = _count(step)
    with _FastLSTM():
        fast = _count(step)
    assert fast == pytest.approx(real, rel=0.1)  # the first step's hidden-state gradient: 1 step of 10
    assert fast >= real
