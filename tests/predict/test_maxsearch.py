"""The predictor's max-batch search in rounds: on peaks of known shape (the answer is known exactly), one trace at a
time and two side by side, and through the tracer processes of the guided maxbatch against one Predictor."""
from __future__ import annotations

from typing import Callable, List

import pytest

from mtbench.predict.maxsearch import largest_batch
from tests.conftest import needs_predictor

MIB = 2**20
BUDGET = 1124 * MIB

SHAPES = {
    # a CNN: a fixed part, then a line; small batches bend below it (resnet50's traces: 19.3 MiB a sample from 2
    # to 4, 23.7 from 8 up)
    "cnn": lambda b: 200 * MIB + 24 * MIB * b - (8 - b) * 2 * MIB * (b < 8),
    "linear, a step above 8": lambda b: 100 * MIB + b * MIB + (4 * MIB if b > 8 else 0),
    "curved": lambda b: 100 * MIB + b * b * 2**14,
    "many samples": lambda b: 300 * MIB + b * (MIB * 9 // 10),
}


def _truth(peak: Callable[[int], int]) -> int:
    return max(b for b in range(1, 1 << 14) if peak(b) <= BUDGET)


class Recorder:
    def __init__(self, peak: Callable[[int], int], refused: int = -1) -> None:
        self.peak, self.refused, self.rounds = peak, refused, []  # type: ignore[var-annotated]

    def __call__(self, batches: List[int]):
        self.rounds.append(list(batches))
        return [ValueError(f"batch {b} refused") if b == self.refused else self.peak(b) for b in batches]


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("width", [1, 2])
def test_the_answer_fits_and_is_within_1_percent_of_the_largest(shape, width):
    peak = SHAPES[shape]
    rec = Recorder(peak)
    found, why, rounds = largest_batch(rec, BUDGET, 2, width=width)
    truth = _truth(peak)
    assert peak(found) <= BUDGET and truth - found <= max(1, truth // 100), (found, truth, rec.rounds)
    assert rounds == len(rec.rounds) and all(len(r) <= width for r in rec.rounds)
    assert "does not fit" in why


@pytest.mark.parametrize("shape, most", [("cnn", 2), ("many samples", 2), ("linear, a step above 8", 3)])
def test_side_by_side_a_line_is_found_in_two_rounds(shape, most):
    """Two traces at a time: 8 and 32, then the guess and the batch 1 % above it (the time of two traces where one
    at a time takes four)."""
    rec = Recorder(SHAPES[shape])
    _, _, rounds = largest_batch(rec, BUDGET, 2, width=2)
    assert rec.rounds[0] == [8, 32] and rounds <= most, rec.rounds


def test_one_at_a_time_traces_no_more_than_before():
    rec = Recorder(SHAPES["linear, a step above 8"])
    largest_batch(rec, BUDGET, 2, width=1)
    assert sum(len(r) for r in rec.rounds) <= 4, rec.rounds  # 2, 4, the guess, the batch above it


def test_nothing_fits():
    found, why, _ = largest_batch(Recorder(lambda b: 2 * BUDGET + b), BUDGET, 2, width=2)
    assert found == 0 and why == "no batch fits the budget (batch 1 does not)"


def test_the_anchor_that_cannot_be_traced_raises_and_a_refused_batch_does_not_fit():
    with pytest.raises(ValueError, match="batch 8 refused"):
        largest_batch(Recorder(SHAPES["cnn"], refused=8), BUDGET, 2, width=2)
    truth = _truth(SHAPES["cnn"])
    found, why, _ = largest_batch(Recorder(SHAPES["cnn"], refused=truth), BUDGET, 2, width=2)
    assert found == truth - 1 and why == f"batch {truth} does not fit: it could not be traced"


def test_the_search_limit():
    found, why, _ = largest_batch(Recorder(lambda b: b), BUDGET, 2, width=2, limit=500)
    assert found == 500 and why == "fits up to the search limit 500"


_SIDE_BY_SIDE = """
import json, sys
from mtbench.campaign.prediction import predicted_max_batch
from mtbench.predict.predictor import Predictor

tiny = ["model.workload.ngf=4", "model.workload.ndf=4"]
# a fixed budget: the tracers must be forked before this process runs autograd (Predictor.max_batch's traces)
overrides = tiny + ["target.memory_budget_bytes=%d" % (60 * 2**20)]
cli = ["target=nano", "device=cpu", *overrides]
side_by_side, why, growth = predicted_max_batch("dcgan", "nano", cli, 2)
# a probe at 8 that measured 55 MiB of training memory: every peak is shifted by that less the prediction at 8
shifted, why_shifted, _ = predicted_max_batch("dcgan", "nano", cli, 2, measured=(8, 55 * 2**20))
one = Predictor(target_name="nano", device="cpu", overrides=tuple(overrides))
shift = 55 * 2**20 - one.predict("dcgan", 8).peak_bytes
less = tuple(tiny) + ("target.memory_budget_bytes=%d" % (60 * 2**20 - shift),)  # the same as a smaller budget
at = lambda b: one.predict("dcgan", b).peak_bytes
print(json.dumps([side_by_side, why, one.max_batch("dcgan", 2)[0], shifted, why_shifted,
                  Predictor(target_name="nano", device="cpu", overrides=less).max_batch("dcgan", 2)[0], shift,
                  growth, (at(side_by_side + 1) - at(side_by_side))]))
"""


@pytest.mark.slow
@needs_predictor
def test_the_tracer_processes_find_what_one_predictor_finds(tmp_path):
    """The guided maxbatch's prediction (tracers forked side by side) against Predictor.max_batch, in a fresh
    interpreter (a process that ran autograd cannot fork tracers that run it again)."""
    import json
    import os
    import subprocess
    import sys

    from mtbench.predict import calibration

    env = dict(os.environ, **{calibration.ENV_DIR: str(tmp_path)})
    proc = subprocess.run([sys.executable, "-c", _SIDE_BY_SIDE], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    side_by_side, why, one, shifted, why_shifted, smaller_budget, shift, growth, next_one = figures
    assert one > 8 and side_by_side is not None, (side_by_side, why, one)
    assert abs(side_by_side - one) <= max(1, one // 100) and "does not fit" in why, (side_by_side, why, one)
    assert shift > 0 and 8 <= smaller_budget < one, (shift, smaller_budget, one)
    assert abs(shifted - smaller_budget) <= max(1, smaller_budget // 100), (shifted, smaller_budget, why_shifted)
    assert f"shifted by {shift / 2**20:+.1f} MiB: the probe at batch 8" in why_shifted
    # the trace's growth per sample at the answer, for the guided search's rule: one more sample's
    assert 0.9 * next_one <= growth <= 1.1 * next_one, (growth, next_one)


def test_the_growth_per_sample_at_the_answer_is_not_a_step_between_two_neighbours():
    from mtbench.campaign.prediction import _growth

    mib = 2**20
    line = {8: 100 * mib + 8 * 20 * mib, 32: 100 * mib + 32 * 20 * mib, 53: 100 * mib + 53 * 20 * mib}
    assert _growth({**line, 54: line[53] + 20 * mib}, 53) == 20 * mib
    # a buffer that grows in blocks steps up between 53 and 54: the growth from 8 is taken, not the step
    assert _growth({**line, 54: line[53] + 300 * mib}, 53) == 20 * mib
    assert _growth(line, 53) is None  # nothing traced above the answer
    assert _growth({53: line[53], 54: line[53] + 20 * mib}, 53) is None  # nothing below
    assert _growth({**line, 54: line[53]}, 53) is None  # no growth: nothing can be ruled out


_FAILURES = """
import json, os
from mtbench.campaign.prediction import predicted_max_batch
from mtbench.predict.predictor import Predictor

cli = ["target=nano", "device=cpu"]
Predictor.peak_or_error = lambda self, model, batch: os._exit(9)  # a tracer killed mid-trace (as the OOM killer does)
died = predicted_max_batch("dcgan", "nano", cli, 2)
Predictor.peak_or_error = lambda self, model, batch: RuntimeError("a kernel fake tensors cannot run\\nmore")
failed = predicted_max_batch("dcgan", "nano", cli, 2)
print(json.dumps([died, failed]))
"""


@pytest.mark.slow
def test_a_tracer_that_dies_or_cannot_trace_gives_no_prediction_and_says_why(tmp_path):
    """Real tracer processes (forked, each its own Predictor): one ends with exit code 9 before it answers, then
    every trace raises; the guided search is told why and runs the full search."""
    import json
    import os
    import subprocess
    import sys

    from mtbench.predict import calibration

    env = dict(os.environ, **{calibration.ENV_DIR: str(tmp_path)})
    proc = subprocess.run([sys.executable, "-c", _FAILURES], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    died, failed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert died == [None, "no prediction (its process ended with exit code 9); the full search runs instead", None]
    assert failed == [None, "no prediction (RuntimeError: a kernel fake tensors cannot run); the full search runs "
                            "instead", None]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_first_guess_from_the_anchors_breakdown_answers_in_few_traces(shape):
    """The predictor's guess (the anchor's peak split into a fixed part and a part per sample, anchored at a batch
    far above the answer as `mtbench predict model=bert batch=64` is): the answer is as right as without it, in at
    most four traces where the search from the anchor alone took up to eight."""
    peak = SHAPES[shape]
    truth = _truth(peak)
    anchor = 4 * truth
    guess = (peak(anchor), max(1, int(truth * 1.03)))  # a guess 3 % off, above the answer
    rec = Recorder(peak)
    found, why, rounds = largest_batch(rec, BUDGET, anchor, width=1, guess=guess)
    assert peak(found) <= BUDGET and truth - found <= max(1, truth // 100), (found, truth, rec.rounds)
    assert anchor not in sum(rec.rounds, []) and sum(len(r) for r in rec.rounds) <= 4, rec.rounds
    without = Recorder(peak)
    largest_batch(without, BUDGET, anchor, width=1)
    assert sum(len(r) for r in without.rounds) > sum(len(r) for r in rec.rounds), (without.rounds, rec.rounds)
