"""The one summary reader (issue 20) and what its readers do with a summary.json that is not one (issue 19 items
9 and 11): a typed error, never a traceback, a hang or a lost table."""
from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mtbench.errors import UsageError
from mtbench.report import make_report
from mtbench.results import console, reader
from mtbench.results.reader import UnreadableSummary
from tests.conftest import mtbench_cli, needs_predictor
from tests.report.test_boards import REAL_SHAPE, write_jobs
from tests.helpers.run_if import run_if

DEEP = "[" * 100_000 + "]" * 100_000


def _write(path: Path, content) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


BAD_FILES = {
    "an array": ("[]", "JSON an array, not an object"),
    "null": ("null", "JSON null, not an object"),
    "a string": ('"x"', "JSON a string, not an object"),
    "not UTF-8": (b'{"schema": "\xff"}', "not UTF-8 (byte 0xff at offset 12)"),
    "not JSON": ("{", "not JSON"),
    "deep": (DEEP, "nested deeper than"),
    "deep inside an object": ('{"schema": "mtbench.summary/1", "a": ' + "[" * 200 + "]" * 200 + "}",
                              "nested deeper than"),
    "another schema": ('{"schema": "other/1"}', "schema is 'other/1'"),
    "no schema": ('{"model": "x"}', "schema is None"),
    "a huge integer": ('{"a": ' + "9" * 5000 + "}", "not JSON"),
}


@pytest.mark.parametrize("name", BAD_FILES)
def test_a_file_that_is_not_a_summary_is_one_typed_error(tmp_path, name):
    content, reason = BAD_FILES[name]
    path = _write(tmp_path / "summary.json", content)
    with pytest.raises(UnreadableSummary) as info:
        reader.read_summary(tmp_path)
    assert reason in info.value.reason and info.value.path == path
    assert isinstance(info.value, UsageError) and "\n" not in str(info.value)


def test_missing_link_fifo_folder_and_size_are_refused_without_opening(tmp_path, monkeypatch):
    with pytest.raises(UnreadableSummary) as info:
        reader.read_summary(tmp_path)
    assert info.value.missing
    os.mkfifo(tmp_path / "summary.json")  # opened for reading, it would block until a writer came
    with pytest.raises(UnreadableSummary, match="not a regular file"):
        reader.read_summary(tmp_path)
    os.unlink(tmp_path / "summary.json")
    (tmp_path / "summary.json").mkdir()
    with pytest.raises(UnreadableSummary, match="not a regular file"):
        reader.read_summary(tmp_path)
    (tmp_path / "summary.json").rmdir()
    real = _write(tmp_path / "elsewhere.json", json.dumps(REAL_SHAPE))
    (tmp_path / "summary.json").symlink_to(real)
    with pytest.raises(UnreadableSummary, match="symbolic link"):
        reader.read_summary(tmp_path)
    (tmp_path / "summary.json").unlink()
    _write(tmp_path / "summary.json", json.dumps(REAL_SHAPE))
    assert reader.read_summary(tmp_path)["model"] == "squeezenet"
    monkeypatch.setattr(reader, "MAX_SUMMARY_BYTES", 100)
    with pytest.raises(UnreadableSummary, match="over the limit of 100"):
        reader.read_summary(tmp_path)


def test_a_field_of_the_wrong_type_is_null_with_a_reason():
    s = dict(copy.deepcopy(REAL_SHAPE), energy_j=3, step_time_s={"median": "fast"}, success="yes")
    c = reader.checked(s)
    assert c["energy_j"] is None and c["step_time_s"] is None and c["success"] is None
    assert c["unavailable"]["energy_j"] == "unreadable in summary.json: a number where null or {per_step_mean: " \
                                          "number, total: number, by_rail: {rail: joules}, ...} was expected"
    assert set(c["_unreadable"]) == {"energy_j", "step_time_s", "success"}
    assert reader.checked(copy.deepcopy(REAL_SHAPE))["_unreadable"] == {}  # a real summary passes


# ---- the report ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["an array", "not UTF-8", "deep"])
def test_report_of_only_an_unreadable_summary_is_one_line_exit_2(tmp_path, name):
    _write(tmp_path / "0-x" / "summary.json", BAD_FILES[name][0])
    proc = mtbench_cli("report", str(tmp_path), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("mtbench: error: report: ")
    assert "0-x/summary.json: not a readable summary.json (" in proc.stderr and "Traceback" not in proc.stderr


def test_one_bad_job_among_good_ones_is_a_row_that_says_why(tmp_path):
    good = copy.deepcopy(REAL_SHAPE)
    write_jobs(tmp_path, [good, dict(copy.deepcopy(REAL_SHAPE), batch_size=4, energy_j=3)])
    _write(tmp_path / "2-squeezenet-b8" / "summary.json", "[]")
    _write(tmp_path / "3-squeezenet-b16" / "summary.json", DEEP)
    proc = mtbench_cli("report", str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "report" / "README.md").read_text()
    assert "| 2-squeezenet-b8 |  |  |  |  |  | **unreadable** |" in text
    assert "- 2-squeezenet-b8: JSON an array, not an object" in text
    assert "- 3-squeezenet-b16: JSON nested deeper than 64 levels" in text
    assert "| 1-squeezenet-b4 | squeezenet | 4 |" in text and "ok (**unreadable**: energy_j)" in text
    assert "- 1-squeezenet-b4: energy_j: a number where null or {" in text
    csv_text = (tmp_path / "report" / "summary.csv").read_text()
    assert "JSON an array, not an object" in csv_text


def test_a_report_folder_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    from mtbench.report import build

    write_jobs(tmp_path, [copy.deepcopy(REAL_SHAPE)])

    def read_only(path, text):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(build, "atomic_write", read_only)  # root writes into a chmod 555 folder: fake the refusal
    with pytest.raises(UsageError, match=r"report: cannot write to .*/report \(Permission denied\); give another "
                                         r"with --out DIR"):
        make_report(tmp_path)


@run_if(not_root=True, why="root writes into a read-only folder")
def test_a_read_only_report_folder_is_one_line_exit_2(tmp_path):
    write_jobs(tmp_path, [copy.deepcopy(REAL_SHAPE)])
    (tmp_path / "report").mkdir(mode=0o555)
    proc = mtbench_cli("report", str(tmp_path), timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "cannot write to" in proc.stderr


# ---- the sweep's end table and the console -------------------------------------------------------------------


def test_the_sweep_table_shows_an_unreadable_row_and_keeps_the_others(tmp_path, capsys):
    from mtbench.campaign.sweep import SweepProgress

    write_jobs(tmp_path, [copy.deepcopy(REAL_SHAPE), dict(copy.deepcopy(REAL_SHAPE), batch_size=4, energy_j=3)])
    _write(tmp_path / "2-squeezenet-b8" / "summary.json", "[]")
    SweepProgress().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    out = capsys.readouterr().out
    assert "0-squeezenet-b2" in out and "unreadable (JSON an array, not an object)" in out
    assert "ok; unreadable: energy_j" in out


def test_the_console_says_why_power_is_null():
    def power_line(reason):
        s = dict(copy.deepcopy(REAL_SHAPE), unavailable={"power_w": reason, "energy_j": reason})
        with console.console.capture() as captured:
            console.print_summary(s, "out")
        return [x for x in captured.get().splitlines() if x.startswith(("power", "energy/step"))]

    gap = ("sampled (VDD_IN, VDD_SYS_GPU), but the samples leave a gap inside the measured window longer than the "
           "gap rule allows (a source that stopped answering)")
    lines = power_line(gap)
    assert all("not measured" not in x and "gap" in x for x in lines), lines
    assert all("not measured on this machine" in x for x in power_line("no sensor in use gives it (groups: cpu)"))


# ---- the other readers: calibrate and maxbatch ---------------------------------------------------------------


@needs_predictor
def test_calibration_skips_a_summary_that_is_not_one(tmp_path):
    from mtbench.predict.fit import read_summaries

    write_jobs(tmp_path, [copy.deepcopy(REAL_SHAPE)])
    for i, bad in enumerate(["[]", "null", json.dumps(dict(REAL_SHAPE, step_time_s=5))]):
        _write(tmp_path / f"bad{i}" / "summary.json", bad)
    assert [s["batch_size"] for s in read_summaries(tmp_path)] == [2]


def test_a_probe_whose_summary_is_not_one_stops_the_search_with_the_reason(tmp_path, monkeypatch):
    from mtbench.campaign import maxbatch

    def fake_run(cmd, stdout, stderr, env):
        _write(tmp_path / "b2" / "summary.json", "[]")
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(maxbatch.subprocess, "run", fake_run)
    p = maxbatch.probe_in_subprocess(["model=squeezenet"], 2, tmp_path / "b2")
    assert not p.fits and p.kind == "error" and "JSON an array, not an object" in p.message


def test_a_schema_1_summary_is_still_read_beside_a_schema_2_one(tmp_path):
    """The bump to mtbench.summary/2 (issue 24: the run's record, `noise`) leaves older summaries readable: a sweep
    folder holding both reports both, and a /2 summary's new fields are type-checked like the others."""
    from mtbench.results.files import SCHEMA

    old = copy.deepcopy(REAL_SHAPE)
    assert old["schema"] == "mtbench.summary/1" and SCHEMA == "mtbench.summary/2"
    new = dict(copy.deepcopy(REAL_SHAPE), schema=SCHEMA, batch_size=4, started_at="2026-12-01T22:35:35+00:00",
               noise={"noisy": False, "step_cv": 0.01, "reasons": [], "busy_other_pct": 2.0})
    write_jobs(tmp_path, [old, new])
    assert reader.read_summary(tmp_path / "0-squeezenet-b2")["schema"] == "mtbench.summary/1"
    assert reader.checked(reader.read_summary(tmp_path / "1-squeezenet-b4"))["_unreadable"] == {}
    make_report(tmp_path)
    text = (tmp_path / "report" / "README.md").read_text()
    assert "| 0-squeezenet-b2 | squeezenet | 2 |" in text and "| 1-squeezenet-b4 | squeezenet | 4 |" in text
    assert "unreadable" not in text
    broken = reader.checked(dict(new, noise={"noisy": "yes"}))
    assert broken["noise"] is None and broken["_unreadable"]["noise"].startswith("an object where null or {noisy")
