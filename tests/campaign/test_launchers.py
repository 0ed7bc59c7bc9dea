"""Sweeps through Hydra's launchers (README "Fleets"): submitit (SLURM; `submitit_local` here) and Ray (a local
cluster here). Each writes one job folder per job, with the same files and summary keys as a basic-launcher job.

Skipped where the extra is not installed: `pip install -e '.[slurm]'`, `pip install -e '.[ray]'`.
"""
from __future__ import annotations

import csv
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Set

import psutil
import pytest

from tests.conftest import REPO, mtbench_cli
from tests.helpers.run_if import run_if
from tests.helpers.env import child_env

# two jobs of the smallest CNN (two are enough to see them take turns on the CPU's lock); one thread each, because
# submitit_local starts both at once; no memory breakdown (its tracked step is tested elsewhere)
SWEEP = ["-m", "model=squeezenet", "batch=1,2", "device=cpu", "warmup=0", "steps=1", "memory.breakdown=false"]
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def has_plugin(name: str) -> bool:
    try:
        return importlib.util.find_spec(f"hydra_plugins.{name}") is not None
    except ModuleNotFoundError:
        return False


def job_files(job_dir: Path) -> Set[str]:
    return {str(p.relative_to(job_dir)) for p in job_dir.rglob("*") if p.is_file()}


def jobs_of(sweep_dir: Path) -> Dict[int, Path]:
    """batch size -> job folder, for every folder of the sweep that holds a summary."""
    return {json.loads(p.read_text())["batch_size"]: p.parent for p in sweep_dir.rglob("summary.json")}


@pytest.fixture(scope="module")
def basic_job(tmp_path_factory) -> Path:
    sweep_dir = tmp_path_factory.mktemp("basic")
    proc = run_sweep(SWEEP[:2] + ["batch=1"] + SWEEP[3:], sweep_dir)
    assert proc.returncode == 0, proc.stderr
    (job,) = jobs_of(sweep_dir).values()
    return job


def run_sweep(args, sweep_dir: Path, *extra: str):
    saved = {k: os.environ.get(k) for k in ONE_THREAD}
    os.environ.update(ONE_THREAD)
    try:
        return mtbench_cli(*args, *extra, f"hydra.sweep.dir={sweep_dir}", timeout=600)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def step_window_s(job: Path):
    """(first start, last end) of the job's steps, on CLOCK_MONOTONIC (one clock for every process)."""
    with (job / "steps.csv").open() as f:
        rows = list(csv.DictReader(f))
    return float(rows[0]["start_s"]), float(rows[-1]["end_s"])


def assert_like_basic(sweep_dir: Path, basic_job: Path) -> None:
    jobs = jobs_of(sweep_dir)
    assert sorted(jobs) == [1, 2], sorted(sweep_dir.rglob("*"))
    reference = json.loads((basic_job / "summary.json").read_text())
    for batch, job in jobs.items():
        assert job_files(job) == job_files(basic_job), job
        summary = json.loads((job / "summary.json").read_text())
        assert summary["success"], summary.get("failure")
        assert set(summary) == set(reference)
        assert job.name == f"{batch - 1}-squeezenet-b{batch}"  # the basic launcher's subdir pattern


@pytest.mark.slow
@run_if(plugin="hydra_submitit_launcher", why="pip install -e '.[slurm]'")
def test_submitit_local_sweep_writes_basic_job_folders(tmp_path, basic_job):
    refused = run_sweep(SWEEP, tmp_path / "refused", "hydra/launcher=submitit_local")
    assert refused.returncode == 2 and "allow_parallel=true" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    # submitit_local starts both jobs at once: each waits for the CPU's lock, so no two measure together
    proc = run_sweep(SWEEP, tmp_path, "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10",
                     "allow_parallel=true")
    assert proc.returncode == 0, proc.stderr
    assert_like_basic(tmp_path, basic_job)
    windows = sorted(step_window_s(job) for job in jobs_of(tmp_path).values())
    assert all(end <= next_start for (_, end), (next_start, _) in zip(windows, windows[1:])), windows


@pytest.mark.slow
@run_if(plugin="hydra_ray_launcher", why="pip install -e '.[ray]'")
def test_ray_sweep_on_a_local_cluster_lands_on_the_board_resource(tmp_path, basic_job):
    # the local cluster plays one board: it offers the custom resource `orin_nano: 1` and each job asks for
    # it, as on a fleet where every board joins with `ray start --resources='{"orin_nano": 1}'`
    proc = run_sweep(SWEEP, tmp_path, "hydra/launcher=ray",
                     "+hydra.launcher.ray.init.num_cpus=2",
                     "+hydra.launcher.ray.init.include_dashboard=false",
                     "+hydra.launcher.ray.init.resources={orin_nano:1}",
                     "+hydra.launcher.ray.remote.resources={orin_nano:1}", "allow_parallel=true")
    assert proc.returncode == 0, proc.stderr
    assert_like_basic(tmp_path, basic_job)
    # one unit of `orin_nano` on the node: the jobs ran one after another, though 2 CPUs would allow two
    windows = sorted(step_window_s(job) for job in jobs_of(tmp_path).values())
    assert all(end <= next_start for (_, end), (next_start, _) in zip(windows, windows[1:])), windows


@pytest.mark.slow
@run_if(plugin="hydra_submitit_launcher", why="pip install -e '.[slurm]'")
def test_sigterm_to_a_submitit_local_sweep_stops_its_jobs_and_nothing_outlives_it(tmp_path):
    """Issue 51 item 2: `kill <mtbench's pid>` during a submitit_local sweep exited 143 at once with no line, and
    both jobs (submitit's workers ignore SIGTERM) trained on under ppid 1 and finished "success". Now the jobs
    record "terminated", the command says so, and no process it started outlives it."""
    env = child_env()
    sweep = subprocess.Popen(
        [sys.executable, "-m", "mtbench", "-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10",
         "allow_parallel=true", "model=squeezenet", "batch=1,2", "device=cpu", "warmup=0", "steps=100000",
         "memory.breakdown=false", f"hydra.sweep.dir={tmp_path}", f"lock_dir={tmp_path}"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    tree: list = []
    try:
        # one job trains, one waits for the lock: its worker's log (submitit's *_log.out) says when it measures.
        # Its CPU time alone did not tell: on a slow VM the imports took 3 s of CPU before the job's handlers
        # were in place, and the signal then left no summary
        deadline = time.monotonic() + 240
        measuring = False
        while not measuring and time.monotonic() < deadline and sweep.poll() is None:
            time.sleep(0.2)
            measuring = any(": measure" in log.read_text(errors="replace") for log in tmp_path.rglob("*_log.out"))
        assert measuring, "no job trained"
        time.sleep(1.0)  # a few of its steps (squeezenet at batch 1: tens of ms each)
        # mtbench > submitit's local wrapper > its worker > the job's process (> its sampling process)
        tree = psutil.Process(sweep.pid).children(recursive=True)
        sweep.send_signal(signal.SIGTERM)  # to mtbench alone, as `kill PID` does
        _, err = sweep.communicate(timeout=180)
        outliving = [p.pid for p in tree if _running(p)]
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
        for proc in tree:  # the test's own leftovers, should the command have left any
            try:
                proc.kill()
            except psutil.Error:
                pass
    assert sweep.returncode == 143 and "mtbench: terminated by SIGTERM" in err, err[-3000:]
    assert outliving == [], err[-3000:]
    summaries = [json.loads(p.read_text()) for p in tmp_path.rglob("summary.json")]
    assert summaries and all(s["failure"]["kind"] == "terminated" for s in summaries), summaries
    assert max(s["measured_steps"] for s in summaries) >= 1


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False

