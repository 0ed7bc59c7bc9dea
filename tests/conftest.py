from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import List

import pytest
from hydra.core.global_hydra import GlobalHydra
from hydra import initialize_config_dir

from mtbench import config
from tests.helpers.compose import FAKE, FAST, REPO, compose_cfg  # noqa: F401 - the tests import them from here
from tests.helpers.env import child_env

# the tests' jobs take their device locks in a folder of their own: an mtbench run elsewhere on this machine
# (a benchmark) neither waits for them nor makes them wait, and neither do the jobs of another pytest-xdist worker:
# each worker has a folder of its own; tests of the lock itself set lock_dir. Made in pytest's configure hook, so
# only by pytest's own processes: a job a test starts may import this module (its workload a class of a test module
# that imports from here), and one killed there would leave a folder of its own behind; it takes its test's folder
# from the environment instead. Removed when pytest ends in the process that made it, and at its exit where it ends
# otherwise (one per worker and run would pile up in /tmp); a child forked from it, which inherits the exit
# handler, leaves it to its maker.
_LOCKS = None


def pytest_configure(config) -> None:
    global _LOCKS
    if os.environ.get("PYTEST_XDIST_WORKER") or "MTBENCH_LOCK_DIR" not in os.environ:
        _LOCKS = (os.getpid(), tempfile.mkdtemp(prefix="mtbench-test-locks-"))
        os.environ["MTBENCH_LOCK_DIR"] = _LOCKS[1]


def _remove_locks() -> None:
    if _LOCKS is not None and os.getpid() == _LOCKS[0]:
        shutil.rmtree(_LOCKS[1], ignore_errors=True)


atexit.register(_remove_locks)


def pytest_unconfigure(config) -> None:
    """The test locks' folder goes when pytest ends (an xdist worker may end without running exit handlers)."""
    _remove_locks()


# pytest-xdist's workers share the cores: one intra-op thread each (and in the jobs they start), set before torch is
# imported; two workers with an OpenMP team each spin on each other's cores. A test of the thread count sets its own.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, "1")


@pytest.fixture()
def hydra_conf():
    """Hydra initialized on conf/ for compose() in the test (presets, experiments), cleared before and after."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config.conf_dir()), version_base="1.3"):
        yield
    GlobalHydra.instance().clear()


@pytest.fixture
def run(tmp_path, monkeypatch):
    """run(["model=alexnet", "batch=2"], name="job") -> summary dict, results in tmp_path/name."""
    monkeypatch.setattr(config, "ALLOWED_TARGET_PREFIXES", config.ALLOWED_TARGET_PREFIXES + ("tests.",))

    from mtbench.job.run import run_job

    def _run(overrides: List[str], name: str = "job") -> dict:
        out = tmp_path / name
        summary = run_job(compose_cfg(overrides), out)
        assert json.loads((out / "summary.json").read_text())["model"] == summary["model"]
        return summary

    return _run


def _predictor_reason() -> str:
    from mtbench.workload.breakdown import unavailable_reason

    return unavailable_reason() or ""


# the predictor (and memory.select's predicted plans, mtbench predict, calibrate) traces with MemTracker: torch >= 2.5
needs_predictor = pytest.mark.skipif(bool(_predictor_reason()), reason=f"the predictor {_predictor_reason()}")


def as_nobody() -> List[str]:
    """The command prefix that runs a program as user nobody (as a shared board's user), or a skip with the reason:
    not root, no setpriv, or an interpreter that nobody cannot start (a Python built under /root)."""
    if shutil.which("setpriv") is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv to run as another user")
    prefix = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    probe = subprocess.run(prefix + [sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"user nobody cannot start this interpreter: {probe.stderr.strip()[:200]}")
    return prefix


def mtbench_cli(*args: str, cwd=None, timeout: float = 600) -> subprocess.CompletedProcess:
    env = child_env()
    return subprocess.run(
        [sys.executable, "-m", "mtbench", *args],
        cwd=cwd or REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )


@contextlib.contextmanager
def ctrl_c_raises():
    """In the block SIGINT raises KeyboardInterrupt here, and children started in it get SIGINT's default, however
    pytest itself was started: a shell without job control starts a background job (`pytest &` in a script) with
    SIGINT ignored, and its children inherit that."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a caught signal is reset to default on exec
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: one worker per core this process may run on, at most 4 (each worker imports torch, ~0.5 GB)."""
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))
