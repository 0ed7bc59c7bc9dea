"""mtbench-sample around arbitrary commands: figures, exit codes, step markers, bad input."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from mtbench.results.files import REQUIRED_KEYS
from tests.conftest import REPO, as_nobody, ctrl_c_raises
from tests.helpers.env import child_env

BUSY = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < {s}: pass\n"
MARKED = """
import sys, time
from mtbench.marker import step
cpu = wall = 0.0
for i in range(5):
    with step():
        t, c = time.monotonic(), time.process_time()
        while time.monotonic() - t < 0.1:
            pass
        if i:  # the CPU the measured steps got (on a loaded machine a spinning loop is not always on a core)
            cpu, wall = cpu + time.process_time() - c, wall + time.monotonic() - t
    time.sleep(0.02)
print("truth", 100 * cpu / wall, file=sys.stderr)
raise SystemExit(3)
"""
# runs the command and prints "<wall s> <user s> <system s>" of its whole tree, as GNU time's "%e %U %S" does
# (the kernel's rusage of every waited-for descendant); used where /usr/bin/time is not installed
RUSAGE = ("import resource, subprocess, sys, time; t = time.monotonic(); subprocess.run(sys.argv[1:]); "
          "w = time.monotonic() - t; r = resource.getrusage(resource.RUSAGE_CHILDREN); "
          "print(w, r.ru_utime, r.ru_stime, file=sys.stderr)")
TIMER = ["/usr/bin/time", "-f", "%e %U %S"] if os.path.exists("/usr/bin/time") else [sys.executable, "-c", RUSAGE]


def timer_cpu_pct(stderr: str) -> float:
    """The tree's CPU in % of one core over its wall time, from TIMER's last line: the truth of the same run
    (on a machine other jobs load, a busy loop gets less than a full core)."""
    wall, user, system = next(map(float, line.split()) for line in reversed(stderr.splitlines())
                              if len(line.split()) == 3 and line.replace(".", "").replace(" ", "").isdigit())
    return 100 * (user + system) / wall


def sample(*args, timeout=120):
    env = child_env()
    return subprocess.run([sys.executable, "-m", "mtbench.commands.sample", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def test_busy_loop_is_sampled(tmp_path):
    proc = sample("--sensors", "none", "--out", str(tmp_path), "--", *TIMER, sys.executable, "-c", BUSY.format(s=1.0))
    assert proc.returncode == 0, proc.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    for key in REQUIRED_KEYS:
        assert key in s, key
    assert s["model"] is None and s["success"] is True and s["window"] == "whole run"
    assert s["sampler"]["samples"] >= 100  # of 200 asked: fidelity is benchmarks/sampler.py's, not a timed test
    # a single-threaded busy loop: one full core for the command's tree (where the machine has one free)
    assert s["process_cpu_pct"] == pytest.approx(timer_cpu_pct(proc.stderr), abs=10)
    assert s["cpu_util_pct"]["mean"] * len(s["cpu_util_pct"]["per_core"]) >= 85
    assert s["mem_peak_bytes"] > 1_000_000
    assert (tmp_path / "samples.csv").exists() and not (tmp_path / "steps.csv").exists()


def test_process_tree_through_a_shell(tmp_path):
    # the shell forks python as a child: its CPU is the tree's
    script = f"{sys.executable} -c '{BUSY.format(s=0.6)}' ; true"
    proc = sample("--sensors", "none", "--out", str(tmp_path), "--", *TIMER, "bash", "-c", script)
    assert proc.returncode == 0, proc.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["process_cpu_pct"] == pytest.approx(timer_cpu_pct(proc.stderr), abs=10)


def test_marked_steps_and_exit_code_pass_through(tmp_path):
    proc = sample("--sensors", "none", "--warmup", "1", "--out", str(tmp_path), "--", sys.executable, "-c", MARKED)
    assert proc.returncode == 3
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["success"] is False and s["exit_code"] == 3 and s["failure"]["kind"] == "error"
    assert s["warmup_steps"] == 1 and s["measured_steps"] == 4 and s["window"] == "marked steps"
    assert s["step_time_s"]["median"] == pytest.approx(0.1, abs=0.02)
    truth = float(next(line.split()[1] for line in proc.stderr.splitlines() if line.startswith("truth")))
    assert s["process_cpu_pct"] == pytest.approx(truth, abs=10)  # the figures cover the busy steps only
    with open(tmp_path / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["warmup"] for r in rows] == ["1", "0", "0", "0", "0"]


@pytest.mark.parametrize("args, needle", [
    ([], "no command given"),
    (["--sensors", "bogus", "--", "true"], "sensor 'bogus' is not known"),
    (["--sensors", "jetson", "--sysfs-root", "/nonexistent", "--", "true"], "sensor jetson"),
    (["--interval-ms", "0", "--", "true"], "--interval-ms=0.0 is out of range; allowed: 1 to 1000 ms"),
    (["--interval-ms", "0.001", "--", "true"], "--interval-ms=0.001 is out of range"),
    (["--interval-ms", "inf", "--", "true"], "--interval-ms=inf is out of range"),
    (["--interval-ms", "nan", "--", "true"], "--interval-ms=nan is out of range"),
    (["--interval-ms", "100000", "--", "true"], "--interval-ms=100000.0 is out of range"),
    (["--warmup", "x", "--", "true"], "argument --warmup: invalid int value: 'x'"),
])
def test_bad_input(args, needle, tmp_path):
    proc = sample("--out", str(tmp_path / "o"), *args)
    assert proc.returncode == 2
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_file_as_out_is_one_line(tmp_path):
    planted = tmp_path / "a-file"
    planted.write_text("keep me")
    proc = sample("--sensors", "none", "--out", str(planted), "--", "true")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"mtbench-sample: error: --out {planted} is an existing file; "
                                                "allowed: a folder, or a path where one can be created"]
    assert planted.read_text() == "keep me"


BAD_MARKS = """
import os
with open(os.environ["MTBENCH_STEP_FILE"], "a") as f:
    f.write("nan nan\\n5 1\\n3 3\\n1 inf\\njunk\\n")
from mtbench.marker import step
for i in range(3):
    with step():
        sum(range(10000))
"""


def test_bad_step_marks_are_refused_with_a_counted_warning(tmp_path):
    proc = sample("--sensors", "none", "--out", str(tmp_path), "--", sys.executable, "-c", BAD_MARKS)
    assert proc.returncode == 0, proc.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["measured_steps"] == 3 and s["window"] == "marked steps" and s["success"] is True
    assert s["step_time_s"]["min"] > 0 and s["step_time_s"]["max"] < 1
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "5 step mark(s)" in warnings[0] and "steps.txt" in warnings[0], proc.stderr
    with open(tmp_path / "steps.csv") as f:
        assert len(list(csv.DictReader(f))) == 3


def test_the_marker_never_raises_into_the_program(monkeypatch, tmp_path, capsys):
    from mtbench import marker

    monkeypatch.setattr(marker, "_warned", False)
    stale = tmp_path / "gone" / "steps.txt"  # an old run's folder, removed
    monkeypatch.setenv(marker.ENV, str(stale))
    for _ in range(3):
        with marker.step():
            pass
    assert not stale.parent.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write step marks" in err[0] and str(stale) in err[0]
    read_only = tmp_path / "ro.txt"
    read_only.write_text("")
    monkeypatch.setenv(marker.ENV, str(tmp_path))  # a folder, not a file: no write can succeed, even as root
    with marker.step():
        pass
    assert read_only.read_text() == "" and capsys.readouterr().err == ""  # warned once only


def test_the_marker_warns_on_a_read_only_step_file(tmp_path):
    # root writes any file: run the program as another user, as a shared board's user would
    import shutil
    import tempfile

    nobody = as_nobody()
    base = tempfile.mkdtemp(prefix="mtbench-marker-")
    try:
        os.chmod(base, 0o755)
        steps = os.path.join(base, "steps.txt")
        with open(steps, "w") as f:
            f.write("1.0 2.0\n")
        os.chmod(steps, 0o444)
        code = "from mtbench.marker import step\nfor i in range(2):\n    with step(): pass\nprint('done')"
        proc = subprocess.run([*nobody, sys.executable, "-c", code], env=child_env(MTBENCH_STEP_FILE=steps),
                              capture_output=True, text=True, timeout=60, cwd=base)
        assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr
        assert proc.stderr.count("cannot write step marks") == 1 and "PermissionError" in proc.stderr
        assert open(steps).read() == "1.0 2.0\n"
    finally:
        shutil.rmtree(base)


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


AWK_LOOP = 'for i in $(seq 25); do awk "BEGIN{for(i=0;i<1e6;i++)s+=i}"; done'


def test_short_lived_children_are_counted(tmp_path):
    """Issue 8 item 6: 25 awk processes of ~30 ms each, most born and reaped between two tree scans. The
    truth comes from the same run: GNU time (or the kernel's rusage) around the command, inside the tree."""
    proc = sample("--sensors", "none", "--out", str(tmp_path), "--", *TIMER, "bash", "-c", AWK_LOOP)
    assert proc.returncode == 0, proc.stderr
    measured = json.loads((tmp_path / "summary.json").read_text())["process_cpu_pct"]
    truth = timer_cpu_pct(proc.stderr)
    assert measured == pytest.approx(truth, abs=10), (measured, truth)


STUBBORN = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a program that ignores Ctrl-C and SIGTERM
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[1], "w").write(str(os.getpid()))
while True:
    time.sleep(0.05)
"""


def test_second_ctrl_c_stops_the_command_and_writes_the_results(tmp_path):
    """Issue 8 item 11: a second Ctrl-C ends the command (TERM, then KILL) without a traceback; exit 130."""
    pid_file = tmp_path / "pid"
    env = child_env()
    with ctrl_c_raises():
        proc = subprocess.Popen([sys.executable, "-m", "mtbench.commands.sample", "--sensors", "none", "--kill-after-s",
                                 "0.5", "--out", str(tmp_path / "out"), "--", sys.executable, "-c", STUBBORN,
                                 str(pid_file)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                                start_new_session=True)  # its own process group, as a terminal's foreground job
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert s["failure"]["kind"] == "interrupted" and s["sampler"]["samples"] > 0


def test_system_memory_peak_is_reported(tmp_path):
    """Issue 9: MemTotal - MemAvailable, sampled; the peak over the run is in the summary."""
    proc = sample("--sensors", "none", "--out", str(tmp_path), "--", sys.executable, "-c",
                  "import time; b = bytearray(200 * 2**20); time.sleep(0.3)")
    assert proc.returncode == 0, proc.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    used_now = info["MemTotal"] - info["MemAvailable"]
    # a peak while 200 MiB were held: within what the machine holds, and near what it uses now + 200 MiB
    assert 0 < s["mem_system_peak_bytes"] <= info["MemTotal"]
    assert s["mem_system_peak_bytes"] > used_now - 2 * 2**30
    with open(tmp_path / "samples.csv") as f:
        used = [float(r["sys_mem_used_bytes"]) for r in csv.DictReader(f)]
    # one of the samples (those inside the run's window: a neighbour's memory after the command ended, sampled as
    # the sampler stopped, is not the command's peak)
    assert s["mem_system_peak_bytes"] in used and s["mem_system_peak_bytes"] >= min(used)


def test_the_board_is_recorded_from_the_sysfs_root(tmp_path):
    """Issue 9: mtbench-sample records the Jetson board and its core types, as a job does (reports group
    per-core figures by type from them); a machine that is no Jetson records null."""
    from tests.device.test_env import A57, DENVER2, TX2_RELEASE, make_jetson

    root = tmp_path / "root"
    make_jetson(root, "quill", TX2_RELEASE, [A57, DENVER2, DENVER2, A57, A57, A57], "17000000.gp10b", 2035200)
    proc = sample("--sensors", "none", "--sysfs-root", str(root), "--out", str(tmp_path / "tx2"), "--", "true")
    assert proc.returncode == 0, proc.stderr
    board = json.loads((tmp_path / "tx2" / "summary.json").read_text())["env"]["jetson"]
    assert board["board"] == "quill" and board["l4t"] == "32.7.1"
    assert [c["type"] for c in board["cpu_cores"]].count("denver2") == 2
    proc = sample("--sensors", "none", "--sysfs-root", str(tmp_path / "empty"), "--out", str(tmp_path / "pc"), "--",
                  "true")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "pc" / "summary.json").read_text())["env"]["jetson"] is None
