"""mtbench-sample around arbitrary commands: figures, exit codes, step markers, bad input."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from mtbench.results import REQUIRED_KEYS
from tests.conftest import REPO

BUSY = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < {s}: pass\n"
MARKED = """
import time
from mtbench.marker import step
for i in range(5):
    with step():
        t = time.monotonic()
        while time.monotonic() - t < 0.1:
            pass
    time.sleep(0.02)
raise SystemExit(3)
"""


def sample(*args, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "mtbench.sample_cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def test_busy_loop_is_sampled(tmp_path):
    proc = sample("--sensors", "none", "--out", str(tmp_path), "--", sys.executable, "-c", BUSY.format(s=1.0))
    assert proc.returncode == 0, proc.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    for key in REQUIRED_KEYS:
        assert key in s, key
    assert s["model"] is None and s["success"] is True and s["window"] == "whole run"
    assert s["sampler"]["samples"] >= 150
    # a single-threaded busy loop: one full core for the command's tree
    assert s["process_cpu_pct"] == pytest.approx(100, abs=10)
    assert s["cpu_util_pct"]["mean"] * len(s["cpu_util_pct"]["per_core"]) >= 85
    assert s["mem_peak_bytes"] > 1_000_000
    assert (tmp_path / "samples.csv").exists() and not (tmp_path / "steps.csv").exists()


def test_process_tree_through_a_shell(tmp_path):
    # the shell forks python as a child: its CPU is the tree's
    script = f"{sys.executable} -c '{BUSY.format(s=0.6)}' ; true"
    proc = sample("--sensors", "none", "--out", str(tmp_path), "--", "bash", "-c", script)
    assert proc.returncode == 0, proc.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["process_cpu_pct"] > 70


def test_marked_steps_and_exit_code_pass_through(tmp_path):
    proc = sample("--sensors", "none", "--warmup", "1", "--out", str(tmp_path), "--", sys.executable, "-c", MARKED)
    assert proc.returncode == 3
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["success"] is False and s["exit_code"] == 3 and s["failure"]["kind"] == "error"
    assert s["warmup_steps"] == 1 and s["measured_steps"] == 4 and s["window"] == "marked steps"
    assert s["step_time_s"]["median"] == pytest.approx(0.1, abs=0.02)
    assert s["process_cpu_pct"] == pytest.approx(100, abs=10)  # the figures cover the busy steps only
    with open(tmp_path / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["warmup"] for r in rows] == ["1", "0", "0", "0", "0"]


@pytest.mark.parametrize("args, needle", [
    ([], "no command given"),
    (["--sensors", "bogus", "--", "true"], "sensor 'bogus' is not known"),
    (["--sensors", "jetson", "--sysfs-root", "/nonexistent", "--", "true"], "sensor jetson"),
    (["--interval-ms", "0", "--", "true"], "--interval-ms=0.0 is out of range"),
])
def test_bad_input(args, needle, tmp_path):
    proc = sample("--out", str(tmp_path / "o"), *args)
    assert proc.returncode == 2
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_unknown_command(tmp_path):
    proc = sample("--sensors", "none", "--out", str(tmp_path), "--", "no-such-program-xyz")
    assert proc.returncode == 2 and "cannot run 'no-such-program-xyz'" in proc.stderr


def test_marker_without_the_variable_does_nothing(monkeypatch, tmp_path):
    from mtbench import marker

    monkeypatch.delenv(marker.ENV, raising=False)
    with marker.step():
        pass
    monkeypatch.setenv(marker.ENV, str(tmp_path / "steps.txt"))
    with marker.step():
        pass
    start, end = map(float, (tmp_path / "steps.txt").read_text().split())
    assert 0 <= end - start < 0.1
