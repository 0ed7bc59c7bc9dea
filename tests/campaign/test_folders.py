"""Result folders are claimed before a run writes there: two runs into one folder never overwrite each other."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from mtbench.campaign.folders import CLAIM, free_dir
from tests.conftest import REPO
from tests.helpers.env import child_env

JOB = ["model=squeezenet", "batch=1", "device=cpu", "warmup=0", "memory.breakdown=false"]


def cli(*args, cwd=REPO, **kw):
    env = child_env()
    return subprocess.run([sys.executable, "-m", "mtbench", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, **kw)


def snapshot(folder):
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != CLAIM}


def test_a_default_folder_taken_gives_way_to_the_next_free_name(tmp_path):
    base = str(tmp_path / "outputs" / "day" / "12-00-00-squeezenet-b1")
    assert free_dir(base) == base
    assert free_dir(base) == base + "-2"  # the same second, another run
    assert free_dir(base) == base + "-3"
    assert all(os.path.isdir(p) for p in (base, base + "-2", base + "-3"))


@pytest.mark.slow
def test_two_default_runs_started_together_keep_both_results(tmp_path):
    env = child_env()
    cmd = [sys.executable, "-m", "mtbench", *JOB, "steps=2", f"lock_dir={tmp_path}"]
    runs = [subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    for run in runs:
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
    summaries = sorted((tmp_path / "outputs").rglob("summary.json"))
    assert len(summaries) == 2, summaries


@pytest.mark.slow
def test_a_second_sweep_into_a_finished_sweeps_folder_is_refused_and_replaces_nothing(tmp_path):
    first = cli("-m", *JOB, "steps=1,2", f"hydra.sweep.dir={tmp_path}", f"lock_dir={tmp_path}")
    assert first.returncode == 0, first.stderr
    before = snapshot(tmp_path)
    assert "0-squeezenet-b1/summary.json" in before
    second = cli("-m", *JOB, "steps=3,4", f"hydra.sweep.dir={tmp_path}", f"lock_dir={tmp_path}")
    assert second.returncode == 2, second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and f"hydra.sweep.dir={tmp_path} already holds the results of another run (pid" in lines[0]
    assert "resume=true" in lines[0]
    assert snapshot(tmp_path) == before  # not a byte, not a timestamp changed
    resumed = cli("-m", *JOB, "steps=1,2", f"hydra.sweep.dir={tmp_path}", f"lock_dir={tmp_path}", "resume=true")
    assert resumed.returncode == 0, resumed.stderr


def test_a_run_into_a_folder_another_run_is_writing_is_refused(tmp_path):
    env = child_env()
    first = subprocess.Popen([sys.executable, "-m", "mtbench", *JOB, "steps=100000", f"hydra.run.dir={tmp_path}",
                              f"lock_dir={tmp_path}"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / ".hydra").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        second = cli(*JOB, "steps=1", f"hydra.run.dir={tmp_path}", f"lock_dir={tmp_path}", "resume=true")
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"is being written by another mtbench run (pid {first.pid}" in lines[0], lines
    finally:
        first.terminate()
        first.communicate(timeout=60)
    assert not (tmp_path / "summary.json").exists() or first.returncode == 143


@pytest.mark.slow
@pytest.mark.parametrize("resume", [False, True])
def test_an_explicit_run_folder_with_results_needs_resume(tmp_path, resume):
    first = cli(*JOB, "steps=1", f"hydra.run.dir={tmp_path}", f"lock_dir={tmp_path}")
    assert first.returncode == 0, first.stderr
    again = cli(*JOB, "steps=1", f"hydra.run.dir={tmp_path}", f"lock_dir={tmp_path}", f"resume={str(resume).lower()}")
    assert again.returncode == (0 if resume else 2), again.stderr
    if resume:
        assert "holds this job's result" in again.stdout


@pytest.fixture
def full_disk(tmp_path):
    """A file system with no room left: a 256 KiB tmpfs, filled (root and mount(2) needed, else a skip)."""
    mount = tmp_path / "full"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.strip()[:120]}")
    try:
        fd = os.open(mount / "fill", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, bytes(4096))
        except OSError:
            pass
        finally:
            os.close(fd)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_full_disk_at_start_is_one_line_and_leaves_no_claim(full_disk, monkeypatch):
    """Issue 51 item 10: a run folder on a full file system ended in Hydra's traceback (its first write of the
    config) and could leave a 0-byte claim; now one line before Hydra starts, for an explicit folder and the
    default alike."""
    from mtbench.campaign.folders import claim_explicit_dirs
    from mtbench.errors import UsageError

    with pytest.raises(UsageError, match=rf"hydra.run.dir={full_disk}/run cannot be written \(No space left on "
                                         r"device\); allowed: a folder on a file system with room"):
        claim_explicit_dirs([f"hydra.run.dir={full_disk}/run"])
    assert os.listdir(full_disk / "run") == []  # no claim, no probe left
    monkeypatch.chdir(full_disk)
    with pytest.raises(UsageError, match=r"the results go to multirun/ in the current folder .*, which cannot be "
                                         r"written \(No space left on device\)"):
        claim_explicit_dirs(["-m", "batch=1,2"])
    assert sorted(os.listdir(full_disk)) == ["fill", "run"]  # the default folder it made is gone again
