"""A workload whose batches are padded per batch is traced on the largest batch the job's measured steps use."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

# the predictor needs torch >= 2.5 (MemTracker; mtbench.predict.MIN_TORCH): on an older torch the module skips
pytest.importorskip("torch.distributed._tools.mem_tracker", reason="the predictor needs torch >= 2.5 (MemTracker)")

from mtbench.predict.batches import trace_takes  # noqa: E402
from mtbench.predict.predictor import Predictor  # noqa: E402


@dataclass
class _Ctx:
    batches: int


class _Padded:
    """Batch i holds lengths[i] elements: what setup prepares for ctx.batches batches."""

    PADDED_PER_BATCH = True

    def __init__(self, lengths):
        self.lengths = lengths

    def setup(self, ctx):
        self.batches = [(torch.zeros(n),) for n in self.lengths[: ctx.batches]]


@pytest.mark.parametrize("lengths, measured, second", [
    ([50, 10, 30, 20], range(1, 4), 30),  # the warm-up's batch 0 is the largest, but no measured step takes it
    ([50, 10, 30, 20], range(0, 4), 50),  # warmup=0: batch 0 is measured
    ([5, 10, 30, 20], range(1, 9), 30),  # 8 steps over 4 batches: each measured twice
    ([5, 40, 30, 20], range(1, 2), 40),  # one measured step: batch 1 as it is
])
def test_the_largest_measured_batch_goes_second(lengths, measured, second):
    w = _Padded(lengths)
    trace_takes(w, len(lengths), measured)
    w.setup(_Ctx(batches=1))  # the trace's own context asks for one: the job's count is prepared
    assert len(w.batches) == len(lengths)
    assert w.batches[1][0].numel() == second
    assert sorted(b[0].numel() for b in w.batches) == sorted(lengths)  # reordered, none lost


@pytest.mark.slow
def test_a_padded_workload_is_traced_with_the_jobs_batches_held():
    """seq2seq at a tiny size: the trace holds the job's 4 batches (warm-up 1 + 3 steps), each its own size, not 4
    copies of the first; its measured step takes the largest of batches 1-3."""
    overrides = ("warmup=1", "steps=3", "model.workload.hidden=16")
    p = Predictor(target_name="none", device="cpu", overrides=overrides)
    trace, traced = p.trace("seq2seq", 6)
    one = Predictor(target_name="none", device="cpu", overrides=("warmup=0", "steps=1", *overrides[2:]))
    single, _ = one.trace("seq2seq", 6)
    assert trace.inputs_bytes != 4 * single.inputs_bytes
    assert trace.peak_tensor_bytes >= single.peak_tensor_bytes
    # on fake tensors, pad_packed_sequence included (its kernel made a data-less lengths tensor: traced on real ones)
    assert traced == "fake tensors on cpu", traced


@pytest.mark.parametrize("lengths, batch_first, total_length", [
    ([5, 3, 3, 1], True, 0), ([5, 3, 3, 1], False, 7), ([4, 4], True, 0), ([6], False, 0), ([3, 2, 1], True, 3),
])
def test_pad_packed_sequence_in_python_is_torchs_kernel(lengths, batch_first, total_length):
    """The trace's pad_packed_sequence for fake data (torch_internals.packed_on_fake) against torch's own kernel on
    the same packed data: the same padded tensor, the same lengths."""
    from torch.nn.utils.rnn import pack_padded_sequence

    from mtbench.workload.torch_internals import pad_packed_sequence_ops

    padded = torch.randn(len(lengths), max(lengths), 3)
    packed = pack_padded_sequence(padded, torch.tensor(lengths), batch_first=True)
    args = (packed.data, packed.batch_sizes, batch_first, -1.0, total_length)
    expected = torch._VF._pad_packed_sequence(*args)
    got = pad_packed_sequence_ops(*args)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


@pytest.mark.parametrize("lengths, measured, largest", [
    ([50, 10, 30, 20], range(1, 4), 30),
    ([50, 10, 30, 20], range(0, 4), 50),
    ([5, 10, 30, 20], range(1, 9), 30),
    ([5, 40, 30, 20], range(1, 2), 40),
])
def test_the_memory_steps_train_on_the_batch_the_trace_takes(lengths, measured, largest):
    """The runner's two untimed steps that measure training memory: the second (the measured one) takes the largest
    batch of the measured steps, the batch the predictor traces, wherever the job's steps left off."""
    from mtbench.workload.base import Workload

    w = _Padded(lengths)
    w.setup(_Ctx(batches=len(lengths)))
    w.i = 7  # after warm-up and measured steps
    Workload.step_next_on_largest(w, measured)
    taken = [w.batches[(w.i + k) % len(w.batches)][0].numel() for k in (0, 1)]
    assert taken[1] == largest
    w.PADDED_PER_BATCH = False  # any other workload's steps go on as they were
    w.i = 7
    Workload.step_next_on_largest(w, measured)
    assert w.i == 7


@pytest.mark.parametrize("lengths, measured, stat, second", [
    ([50, 10, 30, 20], range(1, 4), "median", 20),  # 10, 30, 20 taken: the middle
    ([50, 10, 30, 20], range(1, 4), "min", 10),
    ([5, 10, 30, 20], range(1, 9), "median", 10),  # each taken twice: 5 5 10 10 20 20 30 30, the lower middle
    ([5, 10, 30, 20], range(1, 9), "min", 5),
    ([5, 40, 30, 20], range(1, 2), "median", 40),  # one measured step: its batch whatever the statistic
])
def test_a_step_times_statistic_is_traced_on_the_batch_of_that_size(lengths, measured, stat, second):
    w = _Padded(lengths)
    trace_takes(w, len(lengths), measured, stat)
    w.setup(_Ctx(batches=1))
    assert w.batches[1][0].numel() == second
    assert sorted(b[0].numel() for b in w.batches) == sorted(lengths)


def test_a_statistic_it_does_not_know_is_refused():
    from mtbench.workload.base import batch_of_size

    with pytest.raises(ValueError, match="stat='mean': allowed max, median, min"):
        batch_of_size([(torch.zeros(3),), (torch.zeros(5),)], range(0, 2), "mean")


@pytest.mark.slow
def test_a_padded_job_is_timed_on_its_median_batch_and_sized_on_its_largest():
    """seq2seq at a tiny size, batches of several lengths: the step time's trace takes the median batch of the
    measured steps (fewer FLOPs than the largest, which memory's trace takes); a search for the peak alone traces
    once; a job whose batches are all alike is traced once for both."""
    p = Predictor(target_name="none", device="cpu", overrides=("warmup=1", "steps=5", "model.workload.hidden=16"))
    p.predict("seq2seq", 6, timed=False)
    assert len(p._traces) == 1
    largest, median = p.trace("seq2seq", 6)[0], p.trace("seq2seq", 6, "median")[0]
    assert median.flops < largest.flops and median.inputs_bytes == largest.inputs_bytes  # the same batches held
    assert "timed on the batch of median size" in p.predict("seq2seq", 6).time_note
    q = Predictor(target_name="none", device="cpu", overrides=("warmup=1", "steps=5"))
    assert q.trace("dqn", 2, "median") is q.trace("dqn", 2)
