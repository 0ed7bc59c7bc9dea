"""oneDNN's copies in a CPU convolution's backward: the trace holds them while the op runs, as the process does."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

# the predictor needs torch >= 2.5 (MemTracker; mtbench.predict.MIN_TORCH): on an older torch the module skips
pytest.importorskip("torch.distributed._tools.mem_tracker", reason="the predictor needs torch >= 2.5 (MemTracker)")

from mtbench.predict import conv_scratch  # noqa: E402
from tests.helpers.env import child_env  # noqa: E402
from tests.helpers.run_if import run_if  # noqa: E402

BACKWARD = torch.ops.aten.convolution_backward.default


def _args(batch=32, ic=4, oc=32, k=8, stride=4, hw=84, groups=1, transposed=False):
    x, w = torch.empty(batch, ic, hw, hw), torch.empty(oc, ic // groups, k, k)
    out = (hw - k) // stride + 1
    return (torch.empty(batch, oc, out, out), x, w, [oc], [stride, stride], [0, 0], [1, 1], transposed, [0, 0],
            groups, [False, True, True])


def test_the_copies_are_the_output_gradient_and_the_input_padded_to_the_block(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(conv_scratch, "channel_block", lambda: 16)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    # DQN's first convolution at 32: 4 input channels blocked by 8, 32 output channels as they are
    assert conv_scratch.scratch_bytes(_args()) == 32 * 8 * 84 * 84 * 4 + 32 * 32 * 20 * 20 * 4
    # DenseNet's growth: 36 in, 12 out, both padded to 16
    assert conv_scratch.scratch_bytes(_args(ic=36, oc=12, k=3, stride=1, hw=32)) == \
        32 * 48 * 32 * 32 * 4 + 32 * 16 * 30 * 30 * 4
    # an RGB input is read as it is: only the output's gradient is copied
    assert conv_scratch.scratch_bytes(_args(ic=3, oc=64, k=3, stride=1, hw=32)) == 32 * 64 * 30 * 30 * 4
    assert conv_scratch.scratch_bytes(_args(transposed=True)) == 0  # not measured: not counted
    monkeypatch.setattr(conv_scratch, "channel_block", lambda: None)
    assert conv_scratch.scratch_bytes(_args()) == 0  # a CPU whose blocking was not measured
    assert conv_scratch.held_during(torch.ops.aten.mm.default, _args()) is None


def test_a_convolution_torch_runs_natively_holds_nothing(monkeypatch):
    """torch's own test (ConvParams::use_mkldnn): a 1x1 convolution of one sample without stride on one thread, or a
    small 3x3 one of one sample, is not oneDNN's."""
    monkeypatch.setattr(conv_scratch, "channel_block", lambda: 16)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert conv_scratch.scratch_bytes(_args(batch=1, ic=16, oc=16, k=1, stride=1, hw=8)) == 0
    assert conv_scratch.scratch_bytes(_args(batch=1, ic=16, oc=16, k=3, stride=1, hw=8)) == 0
    assert conv_scratch.scratch_bytes(_args(batch=2, ic=16, oc=16, k=3, stride=1, hw=8)) > 0
    assert conv_scratch.scratch_bytes(_args(batch=1, ic=16, oc=16, k=5, stride=1, hw=8)) > 0
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    assert conv_scratch.scratch_bytes(_args()) == 0


# One convolution's training step in a child: its resident high-water mark over the step against the trace's tensor
# peak beyond what is held between steps. glibc's mmap threshold fixed (as training memory is measured), no
# transparent huge pages; VmHWM reset before the measured step.
STEP = """
import sys
from tests.helpers.resident import hold_malloc, step_against_trace
libc = hold_malloc()
import torch
from mtbench.predict import conv_scratch
from mtbench.workload.base import Workload

class Conv(Workload):
    def __init__(self, ic, oc, k, stride, hw):
        self.net = torch.nn.Conv2d(ic, oc, k, stride=stride)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1)
        self.shape = (ic, hw, hw)
    def setup(self, ctx):
        self.x = torch.randn(ctx.batch_size, *self.shape)
    def step(self):
        self.opt.zero_grad(set_to_none=False)
        self.net(self.x).sum().backward()
        self.opt.step()
    def modules(self):
        return [self.net]

batch, ic, oc, k, stride, hw = (int(v) for v in sys.argv[1:7])
print(conv_scratch.channel_block(), *step_against_trace(libc, lambda: Conv(ic, oc, k, stride, hw), batch))
"""


@pytest.mark.slow
@run_if(linux=True, why="the resident high-water mark is read from Linux's /proc")
@pytest.mark.parametrize("shape", ["32 4 32 8 4 84", "32 36 12 3 1 32"], ids=["dqn-first", "densenet-growth"])
def test_a_convolution_step_is_predicted_as_it_stays_resident(shape):
    """What a convolution's step (batch, in, out, kernel, stride, size) adds to the resident peak against the trace:
    without oneDNN's copies in the backward, DQN's first convolution at 32 was predicted at 16 % of it (1.6 of
    10.3 MiB), DenseNet's 36-to-12 at 15 %."""
    repo = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run([sys.executable, "-c", STEP, *shape.split()], capture_output=True, text=True,
                          env=child_env(), cwd=repo, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    block, measured, predicted = proc.stdout.split()[-3:]
    if block == "None":
        pytest.skip("oneDNN's blocked copies were measured on AVX2 and AVX-512 CPUs only")
    assert abs(int(predicted) - int(measured)) <= 0.08 * int(measured), (predicted, measured)
