"""The breakdown of a step's peak (MemTracker): the parts add up, scale as they should, and count what they claim."""
from __future__ import annotations

import sys
from typing import List

import pytest
import torch
import torch.nn.functional as F

from mtbench.workload.breakdown import PARTS, breakdown_bytes, fragmentation_bytes
from tests.helpers.run_if import run_if

CPU = torch.device("cpu")
try:
    from torch.distributed._tools.mem_tracker import MemTracker  # noqa: F401
    HAS_TRACKER = True
except ImportError:  # torch < 2.5 (JetPack 5/6): the breakdown is null with the reason (tested below)
    HAS_TRACKER = False
needs_tracker = pytest.mark.skipif(not HAS_TRACKER, reason="MemTracker needs torch >= 2.5")


class TinyCNN:
    """A workload shaped like the suite's classifiers (SGD with momentum, batches made up front), activation-heavy."""

    def __init__(self, batch: int, batches: int = 2) -> None:
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10))
        # as the suite's CNNs (conf/model/_cnn.yaml): weight decay makes temporaries inside optimizer.step()
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
        self.batches = [(torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))) for _ in range(batches)]
        self.i = 0

    def step(self) -> None:
        x, y = self.batches[self.i % len(self.batches)]
        self.i += 1
        self.optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(self.net(x), y).backward()
        self.optimizer.step()

    def modules(self) -> List[torch.nn.Module]:
        return [self.net]


class TwiceCalled(TinyCNN):
    """Calls its network twice per step, as a GAN's discriminator sees a real and a fake batch."""

    def step(self) -> None:
        x, y = self.batches[0]
        self.optimizer.zero_grad(set_to_none=True)
        (F.cross_entropy(self.net(x), y) + F.cross_entropy(self.net(x.flip(0)), y)).backward()
        self.optimizer.step()


def _measured(workload) -> dict:
    workload.step()  # as after the measured steps: gradients and momentum exist
    out, reason = breakdown_bytes(workload, CPU)
    assert reason is None and out is not None
    return out


@needs_tracker
def test_parts_add_up_to_the_tracked_peak_within_2_percent():
    out = _measured(TinyCNN(8))
    total = sum(out[p] for p in PARTS)
    assert out["tracked_peak"] > 0
    assert abs(total - out["tracked_peak"]) <= 0.02 * out["tracked_peak"]
    assert out["tool"].startswith("torch.distributed._tools.mem_tracker.MemTracker")


@needs_tracker
def test_activations_grow_linearly_with_batch():
    batches = (4, 8, 16)
    acts = [_measured(TinyCNN(b))["activations"] for b in batches]
    assert acts[0] > 0
    # a straight line through the first two points predicts the third within 2 %
    slope = (acts[1] - acts[0]) / (batches[1] - batches[0])
    predicted = acts[1] + slope * (batches[2] - batches[1])
    assert abs(acts[2] - predicted) <= 0.02 * acts[2]
    # and the slope is at least the conv outputs kept for backward: 2 x 8 x 32 x 32 fp32 values per sample
    assert slope >= 2 * 8 * 32 * 32 * 4


@needs_tracker
def test_parameters_optimizer_state_and_inputs_are_exact_for_fp32():
    workload = TinyCNN(4)
    out = _measured(workload)
    count = sum(p.numel() for p in workload.net.parameters())
    assert out["parameters"] == 4 * count
    assert out["optimizer_state"] == 4 * count  # one momentum buffer per parameter, not the update's temporaries
    held = sum(t.numel() * t.element_size() for batch in workload.batches for t in batch)
    assert out["inputs"] == held  # every batch the workload prepared, not only the one in use


@needs_tracker
def test_a_network_called_twice_in_one_step_is_tracked():
    out = _measured(TwiceCalled(4))
    assert out["activations"] > _measured(TinyCNN(4))["activations"]


def test_older_torch_gives_null_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.distributed._tools.mem_tracker", None)  # import fails as on torch < 2.5
    out, reason = breakdown_bytes(TinyCNN(2), CPU)
    assert out is None
    assert "needs torch >= 2.5" in reason and torch.__version__ in reason


@needs_tracker
def test_a_failing_step_gives_null_with_the_error():
    workload = TinyCNN(2)

    def broken() -> None:
        raise RuntimeError("boom")

    out, reason = breakdown_bytes(workload, CPU, step=broken)
    assert out is None and "RuntimeError: boom" in reason


def test_fragmentation_is_reserved_minus_allocated_on_cuda_only():
    cuda = {"mem_peak_bytes": 100, "mem_peak_reserved_bytes": 160, "mem_peak_source": "cuda_allocator"}
    assert fragmentation_bytes(cuda) == 60
    assert fragmentation_bytes({"mem_peak_bytes": 100, "mem_peak_source": "process_rss"}) is None


@needs_tracker
@run_if(cuda=True)
def test_cuda_breakdown_matches_the_allocator_peak():
    class OnCuda(TinyCNN):
        def __init__(self, batch: int) -> None:
            super().__init__(batch)
            self.net.cuda()
            self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.01, momentum=0.9)
            self.batches = [(x.cuda(), y.cuda()) for x, y in self.batches]

    workload = OnCuda(64)
    workload.step()
    out, reason = breakdown_bytes(workload, torch.device("cuda", 0))
    assert reason is None
    assert out["allocator_reserved_peak"] >= out["allocator_peak"] > 0
    # the caching allocator rounds every block up (512 B at least) and keeps cuDNN workspaces the tracker
    # does not see as tensors: the tracked peak is at most the allocator's
    assert out["tracked_peak"] <= out["allocator_peak"] * 1.02


class WideMLP(TinyCNN):
    """Parameter-heavy at batch 1: the step's peak falls inside optimizer.step(), among its temporaries."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
        self.batches = [(torch.randn(1, 512), torch.randint(0, 10, (1,)))]
        self.i = 0


@needs_tracker
def test_optimizer_update_temporaries_are_other_not_state(monkeypatch):
    from mtbench.workload import breakdown

    workload = WideMLP()
    count = sum(p.numel() for p in workload.net.parameters())
    raw = _measured_with(workload, monkeypatch, breakdown)
    assert raw["optimizer_state"] > 4 * count  # what MemTracker alone calls optimizer state: temporaries too
    out = _measured(WideMLP())
    assert out["optimizer_state"] == 4 * count
    assert out["other"] == raw["other"] + raw["optimizer_state"] - 4 * count
    assert out["tracked_peak"] == raw["tracked_peak"]


def _measured_with(workload, monkeypatch, breakdown) -> dict:
    with monkeypatch.context() as m:
        m.setattr(breakdown, "_optimizer_state_bytes", lambda optimizers, device: 10**15)  # no correction
        return _measured(workload)


@needs_tracker
def test_the_tracked_step_leaves_nothing_alive():
    # MemTracker's module hooks form a cycle through the autograd graph that gc cannot see; without removing
    # them the first layer's weights outlive the workload (the next job in the process then reads their memory)
    import gc
    import weakref

    workload = TinyCNN(4)
    first = weakref.ref(workload.net[0].weight)
    _measured(workload)
    del workload
    gc.collect()
    assert first() is None


@needs_tracker
@pytest.mark.parametrize("model, overrides", [
    ("seq2seq", ["model.workload.hidden=16"]),  # a PackedSequence between its modules
    ("bidaf", ["model.workload.d=8"]),  # a frozen word embedding
])
def test_the_suites_recurrent_models_have_a_breakdown(model, overrides):
    """Torch's MemTracker failed on both (null with "Expected data to be a list or tuple of length 2", and a torch
    warning on the job's console): the breakdown's tracker tolerates them as the predictor's does."""
    import warnings

    from mtbench.config import instantiate
    from mtbench.predict.predictor import Predictor
    from mtbench.workload.base import SetupContext

    cfg = Predictor(target_name="none", device="cpu", overrides=tuple(overrides)).compose(model, 2)
    workload = instantiate(cfg.model.workload, "model.workload")
    workload.setup(SetupContext(device=CPU, batch_size=2, data=instantiate(cfg.data, "data"), seed=0, batches=2))
    workload.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing on the console either
        out, reason = breakdown_bytes(workload, CPU)
    assert reason is None and out is not None, reason
    assert out["parameters"] > 0 and out["tracked_peak"] == sum(out[p] for p in PARTS)
