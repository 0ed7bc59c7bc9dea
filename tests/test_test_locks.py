"""The tests' own lock folders: made by pytest's processes only, so that a job a test starts leaves none behind."""
from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO
from tests.helpers.env import child_env

# a job whose workload is a class of a test module imports this package's conftest (tests/sampling/test_process.py's
# KillsTheSampler, which left one folder after each run of the suite) and may end where no exit handler runs
_KILLED_JOB = ("import os, tests.conftest; print(os.environ['MTBENCH_LOCK_DIR'], flush=True); "
               "os.kill(os.getpid(), 9)")


def test_a_job_that_imports_the_tests_conftest_and_is_killed_leaves_no_lock_folder(tmp_path):
    worker_locks = tmp_path / "worker-locks"
    worker_locks.mkdir()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = child_env(PYTEST_XDIST_WORKER="gw7", MTBENCH_LOCK_DIR=str(worker_locks), TMPDIR=str(scratch))
    proc = subprocess.run([sys.executable, "-c", _KILLED_JOB], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == -9, proc.stderr
    assert proc.stdout.strip() == str(worker_locks)  # the job takes its test's folder
    assert list(scratch.iterdir()) == []  # and makes none of its own
