from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List

import pytest
from hydra.core.global_hydra import GlobalHydra
from hydra import compose, initialize_config_dir

from mtbench import config
from mtbench.job.run import run_job

REPO = Path(__file__).resolve().parent.parent
# the tests' jobs take their device locks in a folder of their own: an mtbench run elsewhere on this machine
# (a benchmark) neither waits for them nor makes them wait; tests of the lock itself set lock_dir
os.environ.setdefault("MTBENCH_LOCK_DIR", tempfile.mkdtemp(prefix="mtbench-test-locks-"))
# fast defaults for tests: no warm-up, one measured step, CPU
FAST = ["device=cpu", "warmup=0", "steps=1"]


def compose_cfg(overrides: List[str]):
    with initialize_config_dir(config_dir=str(config.conf_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=FAST + list(overrides))


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
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
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
