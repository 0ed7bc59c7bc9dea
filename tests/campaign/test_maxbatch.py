"""maxbatch: doubling then bisection to within 5 %, failures that mean "does not fit", the table and maxbatch.json."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import List

import pytest

from mtbench.campaign import maxbatch
from mtbench.commands import maxbatch as maxbatch_command
from mtbench.campaign.maxbatch import Probe, search
from tests.conftest import mtbench_cli, needs_predictor


def fake_board(capacity: int, kind: str = "budget", calls: List[int] = None):
    """A batch fits while it is <= capacity; above, the job fails with `kind`."""

    def fits_at(batch: int) -> Probe:
        if calls is not None:
            calls.append(batch)
        ok = batch <= capacity
        return Probe(batch, ok, None if ok else kind, None if ok else "over", 1000 * batch, 0.0,
                     training_bytes=1000 * batch)

    return fits_at


@pytest.mark.parametrize("capacity", [1, 2, 3, 37, 100, 129, 1000])
def test_search_finds_the_largest_batch_within_5_percent(capacity):
    calls: List[int] = []
    r = search(fake_board(capacity, calls=calls))
    assert r.max_batch <= capacity < r.first_failing_batch
    assert r.first_failing_batch - r.max_batch <= max(1, 0.05 * r.max_batch)
    assert r.probe_at(r.max_batch).fits and not r.probe_at(r.first_failing_batch).fits
    assert calls[: capacity.bit_length() + 1] == [2**i for i in range(capacity.bit_length() + 1)]  # doubling first
    assert len(calls) == len(set(calls))  # no batch probed twice


@pytest.mark.parametrize("kind", ["oom", "budget", "killed"])
def test_oom_budget_and_killed_all_mean_does_not_fit(kind):
    r = search(fake_board(10, kind=kind))
    assert r.error is None and 9 <= r.max_batch <= 10


def test_another_error_stops_the_search_and_says_why():
    r = search(fake_board(10, kind="error"))
    assert r.max_batch == 8 and r.error == "batch 16: error: over"


def test_nothing_fits_and_the_limit():
    assert search(fake_board(0)).max_batch == 0
    r = search(fake_board(10**6), limit=100)
    assert r.max_batch == 100 and r.limit_reached and r.first_failing_batch is None


def test_main_runs_each_model_prints_a_table_and_writes_maxbatch_json(tmp_path, capsys):
    capacities = {"alexnet": 40, "squeezenet": 300}
    seen = []

    def prober(overrides, batch, out_dir: Path) -> Probe:
        seen.append((tuple(overrides), out_dir))
        model = overrides[0].split("=", 1)[1]
        return fake_board(capacities[model])(batch)

    code = maxbatch_command.main(["-m", "model=alexnet,squeezenet", "target=nano", "device=cpu", "--out", str(tmp_path)],
                         prober=prober)
    assert code == 0
    doc = json.loads((tmp_path / "maxbatch.json").read_text())
    assert doc["schema"] == "mtbench.maxbatch/1" and doc["target"] == "nano" and doc["budget_bytes"] == 1610612736
    found = {m["model"]: m["max_batch"] for m in doc["models"]}
    assert 38 <= found["alexnet"] <= 40 and 286 <= found["squeezenet"] <= 300
    assert all(o[1:] == ("target=nano", "device=cpu") for o, _ in seen)
    assert seen[0][1] == tmp_path / "alexnet" / "b2"  # the default start: BatchNorm cannot train on one sample
    out = capsys.readouterr().out
    assert "largest batch that trains within target nano's budget" in out and "squeezenet" in out


@pytest.mark.parametrize("args, needle", [
    (["model=alexnet,vgg16", "target=nano"], "lists several models; add -m"),
    (["model=alexnet", "target=nano", "batch=4"], "batch= is set by maxbatch itself"),
    (["model=alexnet"], "maxbatch needs a target with a budget"),
    (["model=alexnet", "target=tx3"], "target='tx3' is not known"),
    (["model=alexnet", "target=nano", "--limit", "0"], "allowed: 1 <= start <= limit"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle, tmp_path, capsys):
    assert maxbatch_command.main(args + ["--out", str(tmp_path)], prober=lambda *a: pytest.fail("probed")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mtbench: error: ") and needle in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_a_real_probe_in_its_own_process(tmp_path):
    # real jobs of a small model, as `python -m mtbench` processes: forking this pytest process (run_isolated)
    # is unsafe once earlier tests ran torch ops in it (GNU OpenMP's pool does not survive a fork)
    overrides = ["model=squeezenet", "device=cpu", "target=nano"]
    p = maxbatch.probe_in_subprocess(overrides, 2, tmp_path / "b2")
    assert p.fits and p.kind is None and p.peak_bytes > 0
    summary = json.loads((tmp_path / "b2" / "summary.json").read_text())
    assert summary["batch_size"] == 2 and summary["measured_steps"] == 1 and summary["warmup_steps"] == 1
    p = maxbatch.probe_in_subprocess(overrides + ["target.memory_budget_bytes=1000000"], 2, tmp_path / "b2small")
    assert not p.fits and p.kind == "budget" and "exceeds target nano's budget" in p.message


def test_a_memory_plan_is_searched_beside_plain_training(tmp_path, capsys):
    """memory.plan=auto: each model's largest batch with memory.plan=none and with auto, and their ratio."""
    capacity = {"memory.plan=none": 16, "memory.plan=auto": 70}
    seen = []

    def prober(overrides, batch, out_dir: Path) -> Probe:
        seen.append(overrides[-1])
        probe = fake_board(capacity[overrides[-1]])(batch)
        probe.plan = "recompute/auto+microbatch/2" if overrides[-1].endswith("auto") else "none"
        return probe

    code = maxbatch_command.main(["model=resnet50", "memory.budget_gb=1", "memory.plan=auto", "device=cpu",
                          "--out", str(tmp_path)], prober=prober)
    assert code == 0
    doc = json.loads((tmp_path / "maxbatch.json").read_text())
    assert [(m["plan"], m["max_batch"]) for m in doc["models"]][0] == ("none", 16)
    assert doc["models"][1]["plan"] == "auto" and 66 <= doc["models"][1]["max_batch"] <= 70
    assert doc["budget_bytes"] == 2**30 and set(seen) == set(capacity)
    out = capsys.readouterr().out
    assert "auto" in out and "x none" in out


def test_search_guided_starts_at_the_prediction_and_confirms_it_in_few_probes(tmp_path, monkeypatch, capsys):
    seen = []

    def prober(overrides, batch, out_dir: Path) -> Probe:
        seen.append(batch)
        return fake_board(40)(batch)

    asked = []

    def predicted(model, target, overrides, anchor, measured):
        asked.append((model, target, tuple(overrides), measured))
        return 39, "", None

    monkeypatch.setattr(maxbatch, "predicted_max_batch", predicted)
    code = maxbatch_command.main(["model=alexnet", "target=nano", "device=cpu", "maxbatch.search=guided",
                          "--out", str(tmp_path)], prober=prober)
    # a small probe first (the batch the prediction traces first), whose training memory shifts the prediction
    assert code == 0 and seen[:2] == [8, 39] and len(seen) <= 4  # the small probe, then <= 3 from the prediction
    # predicted as the probes run (their one warm-up and one measured step hold two prepared batches, not eight)
    assert asked == [("alexnet", "nano", ("target=nano", "device=cpu", "memory.plan=none", *maxbatch.PROBE),
                      (8, 8000))]
    doc = json.loads((tmp_path / "maxbatch.json").read_text())
    assert doc["search"] == "guided" and 38 <= doc["models"][0]["max_batch"] <= 40
    assert "predicted max batch: 39" in capsys.readouterr().out


@pytest.mark.parametrize("confirm", [[], ["--confirm-above"], ["memory.plan=recompute"]])
def test_search_guided_says_which_step_above_it_did_not_probe(tmp_path, monkeypatch, capsys, confirm):
    """The step above a predicted max batch whose probe measured too little headroom for it is not probed by
    default: the table, the console and maxbatch.json say so; --confirm-above probes it, and so does a search under
    a memory plan (a plan may train a larger batch another way)."""
    budget, per_sample, fixed = 1610612736, 25 * 2**20, 210 * 2**20  # resnet50 at 53 under nano's budget, roughly

    def prober(overrides, batch, out_dir: Path) -> Probe:
        seen.append(batch)
        training = fixed + per_sample * batch
        ok = training <= budget
        return Probe(batch, ok, None if ok else "budget", None if ok else "over", training, 0.0,
                     training_bytes=training, budget_bytes=budget)

    seen: List[int] = []
    monkeypatch.setattr(maxbatch, "predicted_max_batch", lambda *a: (53, "", per_sample * 1.004))
    code = maxbatch_command.main(["model=resnet50", "target=nano", "device=cpu", "--search", "guided",
                                  "--out", str(tmp_path)] + confirm, prober=prober)
    doc = json.loads((tmp_path / "maxbatch.json").read_text())["models"][-1]
    out = capsys.readouterr().out
    assert code == 0 and doc["max_batch"] == 53 and doc["first_failing_batch"] == 55
    if confirm:
        assert seen[-3:] == [8, 53, 55] and doc["inferred"] is None and "55 (budget)" in out
    else:
        assert seen == [8, 53] and "55 (inferred)" in out
        assert doc["inferred"].startswith("batch 55 not probed: batch 53 measured 1535.0 MiB of training memory, "
                                          "1.0 MiB under the budget, and 55 holds at least 25.1 MiB more")
        assert "batch 55 not probed" in out


def test_search_guided_without_a_prediction_runs_the_full_search(tmp_path, monkeypatch, capsys):
    seen = []

    def prober(overrides, batch, out_dir: Path) -> Probe:
        seen.append(batch)
        return fake_board(40)(batch)

    monkeypatch.setattr(maxbatch, "predicted_max_batch", lambda *a: (None, "no prediction (a reason)", None))
    code = maxbatch_command.main(["model=alexnet", "target=nano", "--search", "guided", "--out", str(tmp_path)],
                         prober=prober)
    assert code == 0 and seen[:4] == [8, 2, 4, 16]  # the small probe, then the full search's doubling (8 known)
    assert "predicted max batch: no prediction (a reason)" in capsys.readouterr().out


def test_search_must_be_full_or_guided(tmp_path, capsys):
    code = maxbatch_command.main(["model=alexnet", "target=nano", "--search", "fast", "--out", str(tmp_path)],
                         prober=lambda *a: pytest.fail("probed"))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "fast" in err[0] and "guided" in err[0]


@pytest.mark.slow
@needs_predictor
def test_guided_probes_train_after_the_real_prediction(tmp_path):
    # the real predictor, then real probes, as a user runs it: the prediction's trace runs autograd, after which
    # torch refuses autograd in a forked child ("Unable to handle autograd's threading in combination with
    # fork-based multiprocessing"): every probe was an "error" and the guided search found nothing
    proc = mtbench_cli("maxbatch", "model=squeezenet", "target=nano", "device=cpu", "--search", "guided",
                       "target.memory_budget_bytes=300000000", "--limit", "128", "--tolerance", "0.5", "--out",
                       str(tmp_path), timeout=300)  # a coarse search: 3 or 4 probes (the question is whether they train)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    predicted = re.search(r"predicted max batch: (\d+)", proc.stdout)
    assert predicted, proc.stdout
    # the predicted batch was probed and trained, no probe an error (it fits, or it went over the budget: a
    # prediction can be off, and a CPU's resident peak varies between runs: 76 fitted here once, and 56 was the
    # largest in another run)
    assert re.search(rf"batch {predicted.group(1)}: (fits under none|does not fit \(budget\))", proc.stdout), \
        proc.stdout
    assert "(error)" not in proc.stdout
    result = json.loads((tmp_path / "maxbatch.json").read_text())["models"][0]
    assert result["max_batch"] >= 1 and result["error"] is None, result


def test_search_guided_whose_small_probe_does_not_fit_runs_the_full_search_below_it(tmp_path, monkeypatch, capsys):
    seen: List[int] = []
    monkeypatch.setattr(maxbatch, "predicted_max_batch", lambda *a: pytest.fail("predicted"))
    code = maxbatch_command.main(["model=alexnet", "target=nano", "--search", "guided", "--out", str(tmp_path)],
                         prober=lambda overrides, batch, out_dir: fake_board(5, calls=seen)(batch))
    doc = json.loads((tmp_path / "maxbatch.json").read_text())["models"][0]
    assert code == 0 and doc["max_batch"] == 5 and seen[:3] == [8, 2, 4] and seen.count(8) == 1, seen
    assert "the probe at batch 8 did not fit (budget): the full search runs" in capsys.readouterr().out


@pytest.mark.parametrize("where", ["an existing file", "under a file", "/proc"])
def test_an_output_folder_it_cannot_write_is_refused_before_the_first_probe(tmp_path, capsys, where):
    """Issue 51 item 5: every probe ran (90 s) and then write() raised: a traceback, exit 1, the answer lost."""
    afile = tmp_path / "taken"
    afile.write_text("x")
    out = {"an existing file": afile, "under a file": afile / "sub", "/proc": "/proc/mtbench-maxbatch"}[where]
    code = maxbatch_command.main(["model=alexnet", "target=nano", "--out", str(out)], prober=lambda *a: pytest.fail("probed"))
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"mtbench: error: --out '{out}' is not a folder this user can write")


def test_a_key_given_twice_takes_the_last_value_as_the_jobs_config_does(tmp_path, monkeypatch):
    """Hydra composes the last of two `target=` (and `memory.plan=`): the search predicts, tells and records the
    target its probes train under, not the first one given."""
    asked = []

    def predicted(model, target, overrides, anchor, measured):
        asked.append((target, tuple(overrides)))
        return 39, "", None

    monkeypatch.setattr(maxbatch, "predicted_max_batch", predicted)
    seen = []

    def prober(overrides, batch, out_dir: Path) -> Probe:
        seen.append(tuple(overrides))
        return fake_board(40)(batch)

    code = maxbatch_command.main(["model=alexnet", "target=tx2", "device=cpu", "target=nano", "--search", "guided",
                                  "memory.plan=recompute", "memory.plan=none", "--out", str(tmp_path)], prober=prober)
    doc = json.loads((tmp_path / "maxbatch.json").read_text())
    assert code == 0 and asked and asked[0][0] == "nano", asked
    assert doc["target"] == "nano" and len(doc["models"]) == 1, doc  # memory.plan=none: plain training alone
    assert all("memory.plan=recompute" not in o for o in seen), seen


def test_a_plan_forced_with_plus_plus_is_searched_beside_plain_training_and_not_recorded_as_fixed(tmp_path):
    """`++memory.plan=recompute` sets the plan as `memory.plan=recompute` does: both plans are searched, each probe
    composes its own plan last, and the overrides every search shares (maxbatch.json) do not hold the plan."""
    seen = []

    def prober(overrides, batch, out_dir: Path) -> Probe:
        seen.append(tuple(overrides))
        return fake_board(40)(batch)

    code = maxbatch_command.main(["model=alexnet", "target=nano", "device=cpu", "++memory.plan=recompute",
                                  "--out", str(tmp_path)], prober=prober)
    doc = json.loads((tmp_path / "maxbatch.json").read_text())
    assert code == 0 and doc["overrides"] == ["target=nano", "device=cpu"], doc["overrides"]
    assert {o[-1] for o in seen} == {"memory.plan=none", "memory.plan=recompute"}, seen
    assert all("++memory.plan=recompute" not in o for o in seen), seen


@pytest.mark.parametrize("budget, expected", [
    ("++memory.budget_gb=2", 2 * 2**30),
    ("+target.memory_budget_bytes=1000000", 1000000),
])
def test_a_budget_set_with_plus_is_searched_and_recorded_as_without(budget, expected, tmp_path):
    """Hydra takes `++memory.budget_gb=2` (or `+key=`) as `memory.budget_gb=2`: with target=none the search runs
    under that budget, and maxbatch.json records it, rather than refusing for want of a budget."""
    code = maxbatch_command.main(["model=alexnet", "device=cpu", budget, "--out", str(tmp_path)],
                                 prober=lambda overrides, batch, out_dir: fake_board(40)(batch))
    doc = json.loads((tmp_path / "maxbatch.json").read_text())
    assert code == 0 and doc["target"] == "none" and doc["budget_bytes"] == expected, doc
