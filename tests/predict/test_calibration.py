"""A calibration file's fields are each of the kind and range `mtbench calibrate` writes (issue 51 item 12): a named
file that is not is one line; a stored one is left out with one warning, never an empty or negative prediction."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from mtbench.errors import UsageError
from mtbench.predict import calibration


def _good(tmp_path):
    cal = calibration.Calibration("none-cpu", "none", "cpu", "test cpu", str(tmp_path), 4, "2026-12-05T00:00:00",
                                  time_coef=[0.001, 1e-10, 1e-9, 1e-5], op_coef=[1.0, 2.0], op_features=["a", "b"],
                                  non_tensor_bytes=10 << 20, non_tensor_note="fitted", runs_used=["alexnet b2"])
    return asdict(cal)


@pytest.mark.parametrize("field, value, says", [
    ("op_coef", "abc", "op_coef must be a list of finite numbers"),
    ("op_coef", 5, "op_coef must be a list of finite numbers"),
    ("op_coef", [1.0], "one per op_features entry"),
    ("time_coef", "abc", "time_coef must be a list of 4 finite numbers"),
    ("non_tensor_bytes", -1e12, "non_tensor_bytes must be a whole number of bytes >= 0"),
    ("non_tensor_per_op_bytes", -5.0, "non_tensor_per_op_bytes must be a finite number >= 0"),
    ("time_stat", "bogus", "time_stat 'bogus' is neither median nor min"),
    ("device_type", "tpu", "device_type 'tpu' is neither cpu nor cuda"),
    ("runs", "4", "runs must be a whole number >= 0"),
    ("cache_bytes", 1.5, "cache_bytes must be a whole number of bytes >= 0"),
    ("runtime_spread_bytes", {"min": 1}, "runtime_spread_bytes must be [min, max] bytes"),
    ("time_scaled", "yes", "time_scaled must be true or false"),
    ("non_tensor_note", 7, "non_tensor_note must be a text"),
])
def test_a_field_of_the_wrong_kind_or_range_is_refused(tmp_path, capsys, monkeypatch, field, value, says):
    data = _good(tmp_path)
    data[field] = value
    named = tmp_path / "named.json"
    named.write_text(json.dumps(data))
    with pytest.raises(UsageError) as caught:
        calibration.load("none-cpu", named)
    assert says in str(caught.value) and "\n" not in str(caught.value)
    monkeypatch.setenv(calibration.ENV_DIR, str(tmp_path / "store"))
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "none-cpu.json").write_text(json.dumps(data))
    assert calibration.load("none-cpu") is None
    warning = capsys.readouterr().err
    assert says in warning and warning.count("\n") == 1


def test_a_good_file_reads_and_its_note_loses_terminal_escapes(tmp_path):
    data = _good(tmp_path)
    data["non_tensor_note"] = "fitted \x1b[2J\x1b]0;owned\x07 here"
    named = tmp_path / "named.json"
    named.write_text(json.dumps(data))
    cal = calibration.load("none-cpu", named)
    assert cal.op_coef == [1.0, 2.0] and cal.non_tensor_bytes == 10 << 20
    assert cal.non_tensor_note == "fitted [2J]0;owned here"


def test_a_per_op_class_fit_with_other_terms_is_said_to_be_unused(tmp_path):
    """A calibration made before the per-op-class model gained a term: the predictor takes its whole-step model,
    and its note says so and how to get the new terms, instead of naming the per-op-class model."""
    named = tmp_path / "named.json"
    named.write_text(json.dumps(_good(tmp_path)))
    cal = calibration.load("none-cpu", named)
    assert "per-op-class model" in cal.describe(["a", "b"]) and "per-op-class model" in cal.describe()
    stale = cal.describe(["a", "b", "c"])
    assert stale.count("whole-step model") == 1 and "mtbench calibrate" in stale
