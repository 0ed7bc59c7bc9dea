"""The guided max-batch search on a fake prober whose true max is known: the full search's answer in <= 3 probes
from a right prediction, and the same answer from one 30 % off either way."""
from __future__ import annotations

from typing import List

import pytest

from mtbench.campaign.maxbatch import Probe, search, search_guided


class FakeProber:
    """A batch fits when it is at most `true_max` (as a real device: memory grows with the batch); an error
    (not memory) at `broken`."""

    def __init__(self, true_max: int, broken: int = -1) -> None:
        self.true_max, self.broken = true_max, broken
        self.calls: List[int] = []

    def __call__(self, batch: int) -> Probe:
        self.calls.append(batch)
        if batch == self.broken:
            return Probe(batch, False, "error", "a bug", None, 0.0)
        fits = batch <= self.true_max
        return Probe(batch, fits, None if fits else "oom", None if fits else "out of memory", batch * 1000, 0.0)


def _agrees_with_full(guided, true_max: int, tolerance: float = 0.05) -> None:
    full = search(FakeProber(true_max), tolerance=tolerance)
    assert guided.error is None and guided.max_batch <= true_max < guided.first_failing_batch
    gap = guided.first_failing_batch - guided.max_batch
    assert gap <= max(1, tolerance * guided.max_batch)  # the full search's stopping rule
    assert abs(guided.max_batch - full.max_batch) <= max(1, tolerance * full.max_batch)


def _one_step_under(true_max: int) -> int:
    """The smallest prediction whose next step up (5 %) reaches the true max."""
    return next(p for p in range(1, true_max + 1) if p + max(1, int(0.05 * p)) >= true_max)


@pytest.mark.parametrize("true_max", [1, 2, 7, 40, 137, 672, 2000])
@pytest.mark.parametrize("where", ["exact", "one step under", "one step over", "4 % over"])
def test_a_right_prediction_is_confirmed_in_at_most_three_probes(true_max, where):
    """Right: the true max is within one search step (the full search's 5 %) of the prediction."""
    predicted = {"exact": true_max, "one step under": _one_step_under(true_max),
                 "one step over": true_max + max(1, int(0.05 * true_max)), "4 % over": round(true_max * 1.04)}[where]
    prober = FakeProber(true_max)
    guided = search_guided(prober, predicted=predicted)
    _agrees_with_full(guided, true_max)
    assert len(prober.calls) <= 3 and len(guided.probes) == len(prober.calls)


@pytest.mark.parametrize("true_max", [10, 137, 672, 2000])
@pytest.mark.parametrize("error", [0.3, -0.3])
def test_a_prediction_30_percent_off_still_finds_the_full_searchs_answer(true_max, error):
    prober = FakeProber(true_max)
    guided = search_guided(prober, predicted=round(true_max * (1 + error)))
    _agrees_with_full(guided, true_max)
    full = FakeProber(true_max)
    search(full)
    assert len(prober.calls) <= len(full.calls) and len(set(prober.calls)) == len(prober.calls)


def test_nothing_fits_and_the_limit():
    nothing = search_guided(FakeProber(0), predicted=16)
    assert nothing.max_batch == 0 and nothing.first_failing_batch == 1
    capped = search_guided(FakeProber(10 ** 6), predicted=4000, limit=4096)
    assert capped.max_batch == 4096 and capped.limit_reached and capped.first_failing_batch is None


def test_an_error_that_is_not_memory_stops_the_search():
    guided = search_guided(FakeProber(100, broken=105), predicted=100)
    assert guided.error is not None and "a bug" in guided.error and guided.max_batch == 100


class MemoryProber(FakeProber):
    """A CPU job held to a budget: training memory affine in the batch (the measured growth near the answer is
    within 1 % of the trace's for the four CNNs of docs/benchmarks.md), a batch fits while it is within the budget,
    and the probe records both figures as summary.json does."""

    def __init__(self, true_max: int, per_sample: int = 25 * 2**20, fixed: int = 400 * 2**20,
                 headroom: float = 0.5) -> None:
        super().__init__(true_max)
        self.per_sample, self.fixed = per_sample, fixed
        # the budget sits `headroom` of a sample above the true max's memory
        self.budget = fixed + per_sample * true_max + int(headroom * per_sample)

    def __call__(self, batch: int) -> Probe:
        self.calls.append(batch)
        training = self.fixed + self.per_sample * batch
        fits = training <= self.budget
        return Probe(batch, fits, None if fits else "budget", None if fits else "exceeds the budget", training, 0.0,
                     training_bytes=training, budget_bytes=self.budget)


@pytest.mark.parametrize("true_max", [20, 53, 81, 890])
def test_the_step_above_a_right_prediction_is_ruled_out_by_its_measured_headroom(true_max):
    prober = MemoryProber(true_max, headroom=0.3)  # under half a step's growth (a step is 1 sample below 40)
    guided = search_guided(prober, predicted=true_max, growth_bytes=prober.per_sample)
    _agrees_with_full(guided, true_max)
    assert prober.calls == [true_max] and guided.probe_at(guided.first_failing_batch) is None
    assert guided.inferred.startswith(f"batch {guided.first_failing_batch} not probed: batch {true_max} measured ")
    assert "MiB under the budget" in guided.inferred
    confirmed = MemoryProber(true_max, headroom=0.3)
    search_guided(confirmed, predicted=true_max)  # no growth: the step above is probed, as before
    assert confirmed.calls == [true_max, guided.first_failing_batch]


@pytest.mark.parametrize("true_max", [7, 20, 53, 81, 137, 890])
@pytest.mark.parametrize("headroom", [0.05, 0.5, 0.95])
@pytest.mark.parametrize("trace_error", [0.5, 1.0, 1.9])
@pytest.mark.parametrize("where", ["exact", "one step under", "one step over", "30 % under", "30 % over"])
def test_a_trace_whose_growth_is_off_up_to_twice_never_rules_out_a_batch_that_fits(true_max, headroom, trace_error,
                                                                                    where):
    """The rule's margin: a step above is ruled out only where even half the trace's growth would not fit, so a
    trace that over-states the growth by up to 2x (or under-states it) ends on the full search's answer."""
    prober = MemoryProber(true_max, headroom=headroom)
    predicted = {"exact": true_max, "one step under": _one_step_under(true_max),
                 "one step over": true_max + max(1, int(0.05 * true_max)), "30 % under": round(true_max * 0.7),
                 "30 % over": round(true_max * 1.3)}[where]
    guided = search_guided(prober, predicted=predicted, growth_bytes=trace_error * prober.per_sample)
    _agrees_with_full(guided, true_max)
    assert len(set(prober.calls)) == len(prober.calls)
    # `inferred` is said exactly where the smallest batch that does not fit was not probed
    assert (guided.inferred is None) == (guided.probe_at(guided.first_failing_batch) is not None), guided


def test_a_probe_without_training_memory_rules_nothing_out():
    """A GPU's probe: its allocator's peak is not what a CPU budget compares, so the step above is probed."""
    prober = FakeProber(53)
    guided = search_guided(prober, predicted=53, growth_bytes=25 * 2**20)
    assert prober.calls == [53, 55] and guided.inferred is None
