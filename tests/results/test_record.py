"""A run records itself (issue 24): when it ran (UTC), mtbench's version and git state, the software stack's versions
and the command line, in every summary.json (a dead job's too); the schema is mtbench.summary/2."""
from __future__ import annotations

import datetime
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import mtbench
from mtbench.results import record
from tests.conftest import REPO, compose_cfg

UTC = datetime.timezone.utc


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_a_jobs_summary_records_when_and_how_it_ran(run, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["mtbench", "model=squeezenet", "batch=1", "+note=two words"])
    before = datetime.datetime.now(UTC)
    summary = run(["model=squeezenet", "batch=1"])
    after = datetime.datetime.now(UTC)
    started, finished = (datetime.datetime.fromisoformat(summary[k]) for k in ("started_at", "finished_at"))
    assert started.utcoffset() == finished.utcoffset() == datetime.timedelta(0)  # UTC, and says so
    assert before <= started <= finished <= after
    assert summary["schema"] == "mtbench.summary/2"
    assert summary["mtbench_version"] == mtbench.__version__
    versions = summary["versions"]
    assert (versions["torch"], versions["cuda"]) == (torch.__version__, torch.version.cuda)
    assert versions["cudnn"] == (torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
    # a null version has its reason (no NVML on a CPU machine), never a made-up value
    assert versions["nvml_driver"] is not None or summary["unavailable"]["versions.nvml_driver"]
    assert summary["command_line"] == "mtbench model=squeezenet batch=1 '+note=two words'"
    if (REPO / ".git").exists():  # a checkout (a worktree's .git is a file): its commit and state
        assert summary["git"]["commit"] == _git(REPO, "rev-parse", "HEAD")
        assert summary["git"]["dirty"] is bool(_git(REPO, "status", "--porcelain", "--untracked-files=no"))
    else:
        assert summary["git"] is None and summary["unavailable"]["git"]
    on_disk = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert {k: on_disk[k] for k in ("started_at", "finished_at", "git", "versions", "command_line")} == \
        {k: summary[k] for k in ("started_at", "finished_at", "git", "versions", "command_line")}


def test_git_state_of_a_clean_a_dirty_and_no_checkout(tmp_path):
    assert record.git_state(tmp_path) == (None, f"mtbench does not run from a git checkout ({tmp_path} has no .git)")
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-qm", "one")
    (tmp_path / "outputs").mkdir()  # results beside the code are untracked: the tree is still clean
    (tmp_path / "outputs" / "summary.json").write_text("{}")
    head = _git(tmp_path, "rev-parse", "HEAD")
    assert record.git_state(tmp_path) == ({"commit": head, "dirty": False}, None)
    (tmp_path / "a.py").write_text("x = 2\n")
    assert record.git_state(tmp_path) == ({"commit": head, "dirty": True}, None)


def test_a_checkout_git_cannot_read_is_null_with_the_reason(tmp_path):
    (tmp_path / ".git").write_text("gitdir: /nonexistent/worktree\n")  # a worktree whose repository is gone
    git, why = record.git_state(tmp_path)
    assert git is None and why.startswith(f"git could not read {tmp_path}: ") and "\n" not in why


def test_the_nvml_driver_version_from_pynvml_or_why_not(monkeypatch):
    calls = []
    nv = types.ModuleType("pynvml")  # nvidia-ml-py >= 11.5 returns str; older releases bytes
    nv.nvmlInit = lambda: calls.append("init")
    nv.nvmlShutdown = lambda: calls.append("shutdown")
    nv.nvmlSystemGetDriverVersion = lambda: b"550.54.15"
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    assert record.nvml_driver_version() == ("550.54.15", None) and calls == ["init", "shutdown"]

    class NVMLError_LibraryNotFound(Exception):  # noqa: N801 - pynvml's name, as a machine without a driver raises
        pass

    def no_library():
        raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")

    nv.nvmlInit = no_library
    version, why = record.nvml_driver_version()
    assert version is None
    assert why == "NVML gives no driver version here: NVMLError_LibraryNotFound: NVML Shared Library Not Found"


def test_a_dead_jobs_summary_records_its_start_and_end(tmp_path):
    from mtbench.job import isolation

    cfg = compose_cfg(["model=squeezenet", "batch=1"])
    started = record.utc_now()
    summary = isolation._summary_of_dead_job(cfg, tmp_path, -9, {}, {}, started)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["started_at"] == started <= written["finished_at"]
    assert written["schema"] == "mtbench.summary/2" and written["versions"]["torch"] == torch.__version__
    assert summary["failure"]["kind"] == "killed"


def test_the_record_without_torch_loaded_says_why(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch")  # mtbench-sample's process never loads torch
    keys, reasons = record.run_record(None, argv=["mtbench-sample", "--", "python", "train.py"])
    assert keys["versions"]["torch"] is None and reasons["versions.torch"] == "torch was not loaded by this process"
    assert reasons["started_at"] == "the job's start was not recorded"
    assert keys["command_line"] == "mtbench-sample -- python train.py"


@pytest.mark.parametrize("argv, line", [(["mtbench", "a=1"], "mtbench a=1"),
                                        (["mtbench", "x=it's"], "mtbench 'x=it'\"'\"'s'"),
                                        (["mtbench", ""], "mtbench ''")])
def test_the_command_line_is_quoted_as_a_shell_would_need_it(argv, line):
    assert record.command_line(argv) == line
