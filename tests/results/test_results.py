from __future__ import annotations

import json
import math
import os

import pytest

from mtbench.results import files as results


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    results.atomic_write(target, "old\n")

    def boom(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)  # the rename of the one writer (regular_files.write_whole)
    with pytest.raises(OSError):
        results.atomic_write(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_summary_json_has_no_nan(tmp_path):
    results.write_summary(tmp_path, {"a": math.nan, "b": [1.0, math.inf], "c": {"d": 2}})
    assert json.loads((tmp_path / "summary.json").read_text()) == {"a": None, "b": [1.0, None], "c": {"d": 2}}


def test_stats():
    assert results.stats([]) is None
    s = results.stats([1.0, 2.0, 3.0, 4.0])
    assert s["median"] == 2.5 and s["min"] == 1.0 and s["max"] == 4.0 and s["mean"] == 2.5


def test_a_dead_jobs_summary_has_every_key_and_reason_of_a_finished_one(run, tmp_path):
    """Issue 20: one builder for a finished job and for one whose process died: the same keys, every null figure
    with a reason, the contract's required keys in both."""
    from mtbench.job.isolation import _summary_of_dead_job
    from mtbench.results.summary import FIGURE_KEYS
    from tests.conftest import compose_cfg

    finished = run(["model=squeezenet", "batch=1"])
    dead = _summary_of_dead_job(compose_cfg(["model=squeezenet", "batch=1"]), tmp_path / "dead", -9,
                                {"data": "synthetic"}, {"own": None, "machine": None, "file": None})
    assert json.loads((tmp_path / "dead" / "summary.json").read_text())["failure"]["kind"] == "killed"
    for s in (finished, dead):
        assert set(results.REQUIRED_KEYS) <= set(s)
        assert all(s["unavailable"].get(k) for k in FIGURE_KEYS if s[k] is None), s["unavailable"]
    own = {"input_shape"}  # the workload's extra_metrics: a job that died before building it has none
    assert set(finished) - set(dead) - own == set(), set(finished) - set(dead)
    # beside the figures: the reasons of the run's record's and the noise verdict's nulls (issue 24)
    others = {k for k in dead["unavailable"] if k.startswith(("versions.", "noise.")) or k in ("git", "started_at")}
    assert set(dead["unavailable"]) - others == set(FIGURE_KEYS)
