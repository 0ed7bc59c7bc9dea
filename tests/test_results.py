from __future__ import annotations

import json
import math

import pytest

from mtbench.results import files as results


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    results.atomic_write(target, "old\n")

    def boom(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(results.os, "replace", boom)
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
