"""A trace's first step made as the gradients and optimizer state it leaves: the trace a run first step gives."""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import pytest
import torch

pytest.importorskip("torch.distributed._tools.mem_tracker", reason="the predictor needs torch >= 2.5 (MemTracker)")

from mtbench.data.synthetic import Synthetic  # noqa: E402
from mtbench.predict import first_step  # noqa: E402
from mtbench.predict.trace import StepTrace, trace_step  # noqa: E402
from mtbench.workload import plans  # noqa: E402
from mtbench.workload.base import SetupContext, Workload  # noqa: E402


class Counted(Workload):
    """Two Linear layers under AdamW (state: two tensors a parameter) that count their steps; `unused` adds a layer
    the step never reaches (no gradient, so a job's AdamW makes no state for it)."""

    STEP_LEAVES_ONLY_STATE = True

    def __init__(self, unused: bool = False) -> None:
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        self.spare = torch.nn.Linear(64, 64) if unused else None
        self.steps = 0

    def setup(self, ctx: SetupContext) -> None:
        self.net.to(ctx.device).train()
        params = list(self.net.parameters()) + (list(self.spare.parameters()) if self.spare is not None else [])
        self.optimizer = torch.optim.AdamW(params, lr=0.1)
        self.x = torch.randn(ctx.batch_size, 8, device=ctx.device)

    def step(self) -> None:
        self.steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.net(self.x).square().mean().backward()
        self.optimizer.step()

    def modules(self) -> List[torch.nn.Module]:
        return [self.net] + ([self.spare] if self.spare is not None else [])


def _ctx(batch: int = 16) -> SetupContext:
    return SetupContext(device=torch.device("cpu"), batch_size=batch, data=Synthetic(), seed=0, batches=1)


def _traced(short: bool, **kw: Any):
    made: List[Counted] = []

    def make() -> Counted:
        made.append(Counted(**kw))
        return made[-1]

    trace = trace_step(make, _ctx(), short=short, cuda_optimizers=True)
    return trace, [w.steps for w in made]


def comparable(trace: StepTrace) -> Dict[str, Any]:
    """The trace's figures, its timing left out, its storages numbered in the order they are allocated (a key is an
    object's address, which differs from run to run), without the frees after its last allocation (which change no
    peak of allocator.replay; which storages the collector has let go by then differs from run to run) and with its
    matrix products each once (a first step repeats them)."""
    out = dict(vars(trace))
    for key in ("trace_s", "measured_products"):
        out.pop(key)
    out["products"] = list(dict.fromkeys(tuple(p) for p in trace.products))
    numbers: Dict[int, int] = {}  # storage key -> its number while it lives (an address is reused once freed)
    events: List[Tuple[int, int, str]] = []
    for key, n, kind in trace.events:
        if key >= 0 and n >= 0 and key not in numbers:
            numbers[key] = len(events)
        events.append((numbers[key] if key >= 0 else key, n, kind))
        if key >= 0 and n == -1:
            numbers.pop(key)
    last = max(i for i, (_, n, _) in enumerate(events) if n >= 0)
    out["events"] = events[:last + 1]
    return out


def test_the_state_a_first_step_leaves_traces_as_the_step_itself_in_one_step():
    short, short_steps = _traced(True)
    full, full_steps = _traced(False)
    assert short_steps == [1] and full_steps == [2]
    assert short.state_bytes == full.state_bytes == 2 * (8 * 64 + 64 + 64 * 4 + 4) * 4
    assert comparable(short) == comparable(full)


def test_a_parameter_the_step_leaves_untrained_gets_no_state_the_trace_runs_both_steps():
    short, short_steps = _traced(True, unused=True)
    full, _ = _traced(False, unused=True)
    assert short_steps == [1, 2]  # the state-only trace found the spare layer without a gradient, and ran again
    assert short.state_bytes == full.state_bytes == 2 * (8 * 64 + 64 + 64 * 4 + 4) * 4
    assert comparable(short) == comparable(full)


def test_a_recomputing_plan_or_a_workload_that_keeps_more_runs_its_first_step():
    w = Counted()
    assert first_step.state_only(w)
    w.memory_plan = plans.MemoryPlan(segments=2)  # its first step profiles the blocks it recomputes
    assert not first_step.state_only(w)
    w.memory_plan = plans.MemoryPlan(microbatch=2)
    assert first_step.state_only(w)
    assert not first_step.state_only(object())
    for model in ("DQN", "Seq2Seq", "BiDAF", "DCGAN"):  # a replay buffer, batches of their own lengths, ...
        module = __import__(f"models.{model.lower()}", fromlist=[model])
        assert not getattr(module, model).STEP_LEAVES_ONLY_STATE


@pytest.mark.parametrize("model, overrides", [
    pytest.param("bert", ("model.workload.hidden=32", "model.workload.layers=2", "model.workload.heads=2",
                          "model.workload.intermediate=64", "model.workload.seq_len=32",
                          "model.workload.max_question=8", "model.workload.vocab_size=200"), marks=pytest.mark.slow),
    ("alexnet", ()),
])
def test_bert_and_a_cnn_trace_alike_without_their_first_step(model, overrides, monkeypatch):
    from mtbench.predict.predictor import Predictor

    traces = []
    for short in (True, False):
        if not short:
            monkeypatch.setattr(first_step, "state_only", lambda workload: False)
        p = Predictor(target_name="tx2", device="auto", overrides=overrides)
        traces.append(comparable(p.trace(model, 4)[0]))
    assert traces[0] == traces[1]


def test_predict_traces_with_its_imports_frozen_and_leaves_the_collector_as_it_was(tmp_path, monkeypatch):
    """The command makes its imports with the cyclic collector off, traces with them frozen (never scanned again) and
    the collector on, and gives the collector back as it found it (here: inside a test process)."""
    import gc

    import mtbench.predict as predict_package
    from mtbench.commands.predict import main_predict
    from mtbench.predict.predictor import Predictor

    seen = {}
    require, predict = predict_package.require_torch, Predictor.predict

    def requiring() -> None:
        seen["imports"] = gc.isenabled()
        require()

    def predicting(self, *args, **kwargs):
        seen.setdefault("traces", (gc.isenabled(), gc.get_freeze_count()))
        return predict(self, *args, **kwargs)

    monkeypatch.setattr(predict_package, "require_torch", requiring)
    monkeypatch.setattr(Predictor, "predict", predicting)
    assert gc.isenabled()
    before = gc.get_freeze_count()  # 0, but 375 of the interpreter's own at the start of Python 3.12.1
    assert main_predict(["model=alexnet", "batch=2", "device=cpu", f"out={tmp_path}"]) == 0
    assert seen["imports"] is False
    enabled, frozen = seen["traces"]
    assert enabled and frozen > before + 10_000  # torch's modules' objects, at least
    assert gc.isenabled() and gc.get_freeze_count() <= before  # none of the command's left frozen
