"""The trace's LSTM workspace: torch's fake tensors give oneDNN's RNN layer an empty one; the trace gives the real size."""
from __future__ import annotations

import sys

import pytest
import torch

# the predictor needs torch >= 2.5 (MemTracker; mtbench.predict.MIN_TORCH): on an older torch the module skips
pytest.importorskip("torch.distributed._tools.mem_tracker", reason="the predictor needs torch >= 2.5 (MemTracker)")

from mtbench.predict import rnn_workspace  # noqa: E402
from mtbench.predict.trace import trace_step  # noqa: E402
from mtbench.workload.base import SetupContext, Workload  # noqa: E402
from tests.helpers.run_if import run_if  # noqa: E402
from tests.helpers.env import child_env

if rnn_workspace.LAYER_OP is None:
    pytest.skip(f"torch {torch.__version__} has no aten::mkldnn_rnn_layer (its CPU LSTM keeps no such workspace)",
                allow_module_level=True)
LAYER = torch.ops.aten.mkldnn_rnn_layer.default
BACKWARD = torch.ops.aten.mkldnn_rnn_layer_backward.default


def _layer_args(batch: int, steps: int = 20, features: int = 64, hidden: int = 128):
    return [torch.randn(steps, batch, features), torch.randn(4 * hidden, features), torch.randn(4 * hidden, hidden),
            torch.randn(4 * hidden), torch.randn(4 * hidden), torch.randn(batch, hidden), torch.randn(batch, hidden),
            False, [], 2, hidden, 1, True, False, False, True]


def _fake_args(batch: int, **kw):
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    return [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in _layer_args(batch, **kw)]


@pytest.mark.parametrize("batch", [3, 8, 16, 32, 100, 300])
def test_the_workspace_is_the_real_layers_own_size(batch):
    """At small batches the layer is run at the batch itself; above 2 x RUN_AT its size is extrapolated from two
    runs, within a few pages of the real workspace."""
    real = LAYER(*_layer_args(batch))[3].untyped_storage().nbytes()
    assert real > 0
    predicted = rnn_workspace.workspace_bytes(tuple(_fake_args(batch)), {}, fresh_from=None)
    assert abs(predicted - real) <= max(8 * 4096, 0.005 * real), (predicted, real)


def test_a_workspace_is_kept_whenever_autograd_records():
    """The kernel keeps one whenever grad mode is on (its `train` flag aside), none under no_grad: as the trace."""
    eval_mode = _layer_args(8)[:-1] + [False]
    assert LAYER(*eval_mode)[3].numel() > 0
    assert rnn_workspace.workspace_bytes(tuple(_fake_args(8)[:-1] + [False]), {}, fresh_from=None) == \
        LAYER(*eval_mode)[3].numel()
    with torch.no_grad():
        assert LAYER(*_layer_args(8))[3] is None
        assert rnn_workspace.workspace_bytes(tuple(_fake_args(8)), {}) == 0


# The residency probe runs in a process of its own that sets up the page state it reads: no transparent huge pages
# (PR_SET_THP_DISABLE: with THP a touched page makes 2 MiB resident) and glibc's default mmap threshold (128 KiB, set:
# an earlier test in this process may have raised it, and the workspace then comes from a heap whose pages earlier
# allocations left resident). In-process it read 47.8 MB resident against 42.2 MB predicted once in a full run.
RESIDENCY = """
import ctypes, ctypes.util, sys
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
assert libc.prctl(41, 1, 0, 0, 0) == 0  # PR_SET_THP_DISABLE
assert libc.mallopt(-3, 128 * 1024) == 1  # M_MMAP_THRESHOLD: glibc's default, fixed
import torch
from mtbench.predict import rnn_workspace
from tests.predict.test_rnn_workspace import BACKWARD, LAYER, _fake_args, _layer_args
page = rnn_workspace.PAGE

def resident(ws):
    start = ws.data_ptr() - ws.data_ptr() % page
    length = ws.data_ptr() + ws.numel() - start
    vec = (ctypes.c_ubyte * (-(-length // page)))()
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vec) == 0
    return sum(v & 1 for v in vec) * page

args = _layer_args(300, steps=30)  # about 70 MiB: mapped fresh by glibc
output, hy, cy, ws = LAYER(*args)
after_forward = resident(ws)
BACKWARD(*args[:7], output, hy, cy, torch.ones_like(output), torch.ones_like(hy), torch.ones_like(cy), False, 2,
         128, 1, True, True, False, [], False, ws)
predicted = rnn_workspace.workspace_bytes(tuple(_fake_args(300, steps=30)), {}, both=True)
print(after_forward, resident(ws), *predicted, ws.numel())
"""


@pytest.mark.slow
@run_if(linux=True, why="mincore(2) residency is read on Linux only")
def test_the_resident_share_is_what_the_kernel_says_is_resident():
    """The resident estimates against the kernel's own count (mincore) of the pages a real layer left resident in a
    freshly mapped workspace: after its forward (what waits for the backward) and after its backward."""
    import subprocess
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[2])
    env = child_env()
    proc = subprocess.run([sys.executable, "-c", RESIDENCY], capture_output=True, text=True, env=env, cwd=repo,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    forward, backward, predicted_forward, predicted_backward, numel = (int(v) for v in proc.stdout.split()[-5:])
    assert forward < numel * 0.5 and numel * 0.4 < backward < numel * 0.9  # the layer leaves part of it untouched
    assert abs(predicted_forward - forward) <= 0.02 * numel, (predicted_forward, forward, numel)
    assert abs(predicted_backward - backward) <= 0.02 * numel, (predicted_backward, backward, numel)


# A stacked bidirectional LSTM's step, its resident high-water mark against the trace: glibc's mmap threshold fixed
# (as training memory is measured), no transparent huge pages, one thread; VmHWM reset before the measured step
STACK = """
import sys
from tests.helpers.resident import hold_malloc, step_against_trace
libc = hold_malloc()
import torch
torch.set_num_threads(1)
from tests.predict.test_rnn_workspace import _Lstm

batch, features, hidden, layers, bidirectional = (int(v) for v in sys.argv[1:6])
make = lambda: _Lstm(features=features, hidden=hidden, layers=layers, bidirectional=bool(bidirectional), steps=100,
                     keep_grads=True)  # the gradients held between steps and at the peak alike
print(*step_against_trace(libc, make, batch))
"""


@pytest.mark.slow
@run_if(linux=True, why="the resident high-water mark is read from Linux's /proc")
@pytest.mark.parametrize("shape", ["32 400 100 3 1", "2 512 512 2 0"], ids=["bidirectional-stack", "wide-small-batch"])
def test_a_stacked_lstm_step_is_predicted_as_it_stays_resident(shape):
    """What a step of LSTM layers (batch, features, hidden, layers, bidirectional) adds to the resident peak,
    measured (VmHWM, with glibc's mmap threshold fixed as training memory is measured) against the trace's tensors
    beyond those held between steps (the gradients kept between steps): each workspace counts its forward's written share until its backward (counted
    at the backward's share from the forward on, three bidirectional layers were predicted 54 % over), and each
    layer's call holds oneDNN's scratch gates and reordered weights while it runs (without the weights, two wide
    layers at batch 2 were predicted 50 % under)."""
    import subprocess
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run([sys.executable, "-c", STACK, *shape.split()], capture_output=True, text=True,
                          env=child_env(), cwd=repo, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    measured, predicted = (int(v) for v in proc.stdout.split()[-2:])
    assert abs(predicted - measured) <= 0.08 * measured, (predicted, measured)


class _Lstm(Workload):
    """A workload of one LSTM stack, two layers by default."""

    def __init__(self, features: int = 32, hidden: int = 64, layers: int = 2, bidirectional: bool = False,
                 steps: int = 40, keep_grads: bool = False) -> None:
        self.net = torch.nn.LSTM(features, hidden, layers, batch_first=True, bidirectional=bidirectional)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9)
        self.features, self.steps, self.keep_grads = features, steps, keep_grads

    def setup(self, ctx):
        self.x = torch.randn(ctx.batch_size, self.steps, self.features, device=ctx.device)

    def step(self):
        self.opt.zero_grad(set_to_none=not self.keep_grads)
        out, _ = self.net(self.x)
        out.sum().backward()
        self.opt.step()

    def modules(self):
        return [self.net]


def test_a_traced_lstm_holds_its_workspace_as_real_tensors_do(monkeypatch):
    """On fake tensors the step's tensor peak equals the one traced on real tensors (whose workspace is real) where
    every byte of the workspace counts (from the heap, or on a GPU); mapped fresh (memory.cpu_malloc=live's 128 KiB
    threshold) only its written share counts: less, but more than without any workspace."""
    ctx = SetupContext(device=torch.device("cpu"), batch_size=24, data=None, seed=0, batches=1)
    real = trace_step(_Lstm, ctx, fake=False)
    heap = trace_step(_Lstm, ctx)  # the workspaces are under glibc's 32 MiB: from the heap, whole
    fresh = trace_step(_Lstm, ctx, fresh_mapping_bytes=128 << 10)
    nominal = sum(LAYER(*_layer_args(24, steps=40, features=f, hidden=64))[3].numel() for f in (32, 64))
    assert heap.peak_tensor_bytes == real.peak_tensor_bytes
    assert real.peak_tensor_bytes - nominal < fresh.peak_tensor_bytes < real.peak_tensor_bytes
    monkeypatch.setattr(rnn_workspace, "_touched_shares", lambda named: (1.0, 1.0))
    assert trace_step(_Lstm, ctx, fresh_mapping_bytes=128 << 10).peak_tensor_bytes == real.peak_tensor_bytes


# A heap that holds a large free chunk of old, non-zero bytes (as after other work in the process): glibc serves the
# shares' probe workspace from it, not from a fresh mapping
DIRTY_HEAP = """
import torch
big = torch.ones(30 << 18); del big  # a freed 30 MiB mapping raises glibc's mmap threshold to it
blocks = [torch.ones(1 << 18) for _ in range(120)]  # 120 MiB of 1 MiB blocks from the heap, then freed below one
keep = torch.ones(1 << 10)                          # still held: one free chunk in the heap, not trimmed
del blocks
from mtbench.predict import rnn_workspace
from tests.predict.test_rnn_workspace import LAYER, _layer_args
named = dict(zip([a.name for a in LAYER._schema.arguments], _layer_args(24, steps=40, features=32, hidden=64)))
print(*rnn_workspace._touched_shares(named))
"""


@run_if(linux=True, why="glibc's heap")
def test_the_written_share_is_measured_on_a_heap_with_old_bytes_in_it():
    """The share of a workspace a layer writes is read as its non-zero pages: where glibc serves the probe's
    workspace from a free chunk of its heap holding old bytes, every page read as written (the whole workspace
    counted, as on real tensors); the heap trimmed first, its free pages read as zero."""
    import subprocess
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run([sys.executable, "-c", DIRTY_HEAP], capture_output=True, text=True, env=child_env(),
                          cwd=repo, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    forward, both = (float(v) for v in proc.stdout.split()[-2:])
    assert forward < 0.5 and both < 0.9, (forward, both)
