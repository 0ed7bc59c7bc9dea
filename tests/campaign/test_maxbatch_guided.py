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


class AffineProber(FakeProber):
    """A CPU as the probes see it: training memory `fixed` + `per_sample` x batch (+ `curve` x batch^2), held to
    `budget`; a batch fits while its training memory is within it."""

    def __init__(self, fixed: int, per_sample: int, budget: int, curve: int = 0) -> None:
        self.fixed, self.per_sample, self.budget, self.curve = fixed, per_sample, budget, curve
        super().__init__(max(b for b in range(0, 10 ** 5) if self.memory(b) <= budget))

    def memory(self, batch: int) -> int:
        return self.fixed + self.per_sample * batch + self.curve * batch * batch

    def __call__(self, batch: int) -> Probe:
        self.calls.append(batch)
        used = self.memory(batch)
        fits = used <= self.budget
        return Probe(batch, fits, None if fits else "budget", None if fits else "over", used, 0.0,
                     training_bytes=used, budget_bytes=self.budget)


@pytest.mark.parametrize("fixed, per_sample, curve", [(300 << 20, 5 << 20, 0), (120 << 20, 9 << 20, 0),
                                                       (200 << 20, 3 << 20, 512)])
def test_on_a_cpu_two_small_probes_draw_the_line_and_no_trace_runs(monkeypatch, fixed, per_sample, curve):
    """Training memory is close to affine in the batch: the line through the probes at 8 and 16 meets the budget
    at the max batch, which two more probes confirm (the predictor's traces, 8-9 s a model, do not run); a curve
    that bends the line costs a probe or two more, not a wrong answer."""
    import argparse

    from mtbench.campaign import maxbatch

    monkeypatch.setattr(maxbatch, "predicted_max_batch", lambda *a, **k: pytest.fail("the predictor traced"))
    prober = AffineProber(fixed, per_sample, 1536 << 20, curve)
    args = argparse.Namespace(start=2, limit=4096, tolerance=0.05)
    guided = maxbatch.guided("resnet50", "nano", [], prober, args)
    _agrees_with_full(guided, prober.true_max)
    assert prober.calls[:2] == [8, 16] and len(prober.calls) <= (4 if curve == 0 else 6), prober.calls


def test_where_twice_the_small_batch_does_not_fit_the_search_bisects_between_them(monkeypatch):
    import argparse

    from mtbench.campaign import maxbatch

    monkeypatch.setattr(maxbatch, "predicted_max_batch", lambda *a, **k: pytest.fail("the predictor traced"))
    prober = AffineProber(1000 << 20, 40 << 20, 1536 << 20)  # 13 fits, 14 does not
    guided = maxbatch.guided("vgg19", "nano", [], prober, argparse.Namespace(start=2, limit=4096, tolerance=0.05))
    _agrees_with_full(guided, prober.true_max)
    assert guided.max_batch == 13 and prober.calls[:2] == [8, 16]


def test_without_training_memory_a_gpu_probe_falls_back_to_the_predictors_traces(monkeypatch):
    import argparse

    from mtbench.campaign import maxbatch

    asked = []
    monkeypatch.setattr(maxbatch, "predicted_max_batch",
                        lambda model, target, overrides, start, measured: asked.append(measured) or (130, "traced"))
    prober = FakeProber(137)  # its probes carry no training memory, as a CUDA job's
    guided = maxbatch.guided("resnet50", "tx2", [], prober, argparse.Namespace(start=2, limit=4096, tolerance=0.05))
    _agrees_with_full(guided, 137)
    assert asked == [None] and prober.calls[0] == 8
