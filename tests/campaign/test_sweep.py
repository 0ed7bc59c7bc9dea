"""One measurement per device at a time (a lock across processes), and resuming a sweep that was killed."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys

import pytest

from mtbench.results.reader import field_problems
from tests.conftest import REPO, mtbench_cli
from tests.helpers.lock import held_lock
from tests.helpers.env import child_env

JOB = ["model=squeezenet", "batch=1", "device=cpu", "warmup=1", "steps=4", "memory.breakdown=false"]


def _cli(*args: str) -> subprocess.Popen:
    env = child_env()
    return subprocess.Popen([sys.executable, "-m", "mtbench", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _window(job_dir) -> tuple:
    with open(job_dir / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    return min(float(r["start_s"]) for r in rows), max(float(r["end_s"]) for r in rows)


def _said_waiting(proc: subprocess.Popen) -> str:
    """stderr up to the line that says the job waits for the lock (or all of it, if the job ended first)."""
    said = ""
    for line in proc.stderr:
        said += line
        if f"waiting for cpu: another mtbench job (pid {os.getpid()}: " in line:
            break
    return said


@pytest.mark.slow
def test_two_runs_on_one_cpu_do_not_overlap_their_steps(tmp_path):
    # the test holds the lock until both jobs wait for it: the two then meet at the lock however slowly each started
    held = held_lock(tmp_path, str(os.getpid()).encode())  # a live process: the holder a waiting job names
    try:
        runs = [_cli(*JOB, f"lock_dir={tmp_path}", f"hydra.run.dir={tmp_path / name}") for name in ("a", "b")]
        said = [_said_waiting(p) for p in runs]
        assert all("waiting for cpu" in s for s in said), said
    finally:
        os.close(held)
    errs = [s + p.communicate(timeout=300)[1] for s, p in zip(said, runs)]
    assert [p.returncode for p in runs] == [0, 0], errs
    (a0, a1), (b0, b1) = _window(tmp_path / "a"), _window(tmp_path / "b")
    assert a1 <= b0 or b1 <= a0, ((a0, a1), (b0, b1))  # steps.csv times are CLOCK_MONOTONIC, one clock


@pytest.mark.slow
def test_device_lock_fail_is_one_line(tmp_path):
    held = held_lock(tmp_path, str(os.getpid()).encode())  # a live process: the holder a waiting job names
    try:
        proc = mtbench_cli(*JOB, "device_lock=fail", f"lock_dir={tmp_path}", f"hydra.run.dir={tmp_path / 'run'}")
    finally:
        os.close(held)
    assert proc.returncode == 2
    line = proc.stderr.strip()  # the holder named with its command (this test's own)
    assert "\n" not in line and line.startswith(f"mtbench: error: cpu is being measured by another mtbench job (pid "
                                               f"{os.getpid()}: ")
    assert line.endswith("); device_lock=wait waits for it, device_lock=off measures anyway"), line
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.slow
def test_a_killed_sweep_resumes_with_the_jobs_it_had_not_finished(tmp_path):
    sweep_args = ["-m", "model=squeezenet", "batch=1,2,3", "device=cpu", "warmup=0", "steps=1",
                  "memory.breakdown=false", f"hydra.sweep.dir={tmp_path}", f"lock_dir={tmp_path}"]
    sweep = _cli(*sweep_args)
    for line in sweep.stdout:
        if line.startswith("[job 3 of 3]"):  # jobs 1 and 2 are done
            os.kill(sweep.pid, signal.SIGKILL)  # its job's process dies with it (PR_SET_PDEATHSIG)
            break
    sweep.communicate(timeout=60)
    done = {p.parent.name: p.stat().st_mtime_ns for p in tmp_path.rglob("summary.json")}
    assert sorted(done) == ["0-squeezenet-b1", "1-squeezenet-b2"]

    resumed = _cli(*sweep_args, "resume=true")
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    assert out.count("not run again") == 2
    summaries = {p.parent.name: p for p in tmp_path.rglob("summary.json")}
    assert len(summaries) == 3
    assert all(json.loads(p.read_text())["success"] for p in summaries.values())
    assert {name: summaries[name].stat().st_mtime_ns for name in done} == done  # the finished two untouched


@pytest.mark.slow
def test_resume_runs_again_a_job_whose_summary_is_not_a_finished_result(tmp_path):
    """Issue 19 item 5: a summary.json that is `[]`, `null` or hand-edited (a string where a number was) does not
    crash a resumed sweep: each job runs again, said in one line."""
    sweep_args = ["-m", "model=squeezenet", "batch=1,2,3", "device=cpu", "warmup=0", "steps=1",
                  "memory.breakdown=false", f"hydra.sweep.dir={tmp_path}", f"lock_dir={tmp_path}"]
    first = mtbench_cli(*sweep_args)
    assert first.returncode == 0, first.stderr
    jobs = {p.parent.name: p for p in tmp_path.rglob("summary.json")}
    assert all(field_problems(json.loads(p.read_text())) == {} for p in jobs.values())  # real ones pass the check
    edited = json.loads(jobs["2-squeezenet-b3"].read_text())
    edited["step_time_s"]["median"] = "0.1 s"
    jobs["0-squeezenet-b1"].write_text("[]")
    jobs["1-squeezenet-b2"].write_text("null")
    jobs["2-squeezenet-b3"].write_text(json.dumps(edited))

    resumed = mtbench_cli(*sweep_args, "resume=true")
    assert resumed.returncode == 0, resumed.stderr
    assert "Traceback" not in resumed.stderr
    said = [line.strip() for line in resumed.stdout.splitlines() if "holds no finished result" in line]
    assert said == [
        f"resume: {tmp_path / '0-squeezenet-b1'} holds no finished result of this configuration (JSON an array, "
        "not an object); running it again",
        f"resume: {tmp_path / '1-squeezenet-b2'} holds no finished result of this configuration (JSON null, not an "
        "object); running it again",
        f"resume: {tmp_path / '2-squeezenet-b3'} holds no finished result of this configuration (step_time_s: an "
        "object where null or {median, mean, min, max, p90: numbers} was expected); running it again"], resumed.stdout
    assert all(json.loads(p.read_text())["success"] for p in jobs.values())
