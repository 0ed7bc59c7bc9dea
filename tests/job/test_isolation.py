"""Each job in a process of its own: a job the kernel kills, a segfault or a real out-of-memory is a recorded
failure, and the sweep goes on."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import REPO, ctrl_c_raises, mtbench_cli
from tests.helpers.run_if import run_if
from tests.helpers.compose import FAKE as FAKE_JOB
from tests.helpers.env import child_env

FAKE = FAKE_JOB


def isolated(out_dir, *overrides: str) -> subprocess.CompletedProcess:
    env = child_env()
    return subprocess.run([sys.executable, str(REPO / "tests" / "isolated_job.py"), str(out_dir), *overrides],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("name, number", [("SIGSEGV", 11), ("SIGKILL", 9)])
def test_a_job_whose_process_dies_is_recorded_as_killed(tmp_path, name, number):
    proc = isolated(tmp_path / "job", *FAKE, "model.workload._target_=tests.fake_workloads.Signalled",
                    f"+model.workload.signal={name}", "steps=3")
    assert proc.returncode == 0, proc.stderr
    returned = json.loads(proc.stdout.strip().splitlines()[-1])
    on_disk = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert returned == on_disk
    # SIGKILL without a rise of the kernel's oom_kill count is "killed", not "oom"
    assert on_disk["failure"] == {"kind": "killed", "message": f"the job's process was killed by signal {number} ({name})"}
    assert on_disk["success"] is False and on_disk["model"] == "squeezenet" and on_disk["device"] == "cpu"
    assert on_disk["data"] == "synthetic" and on_disk["env"]["versions"]["torch"]
    assert on_disk["cpu_util_pct"] is None and "died" in on_disk["unavailable"]["cpu_util_pct"]


@pytest.mark.slow
def test_the_job_runs_in_a_child_and_its_peak_memory_is_its_own(tmp_path):
    proc = isolated(tmp_path / "job", "model=squeezenet", "batch=1")
    s = json.loads(proc.stdout.strip().splitlines()[-1])
    assert s["success"], proc.stderr
    assert s["env"]["versions"]["torch"] and s["mem_peak_source"] == "process_rss"


@pytest.mark.slow
def test_real_cpu_out_of_memory_is_oom(tmp_path):
    proc = mtbench_cli("model=squeezenet", "batch=1000000000", "device=cpu", "warmup=0", "steps=1",
                       "hydra.run.dir=" + str(tmp_path / "oom-job"))
    assert proc.returncode == 1, proc.stderr
    s = json.loads((tmp_path / "oom-job" / "summary.json").read_text())
    assert s["failure"]["kind"] == "oom", s["failure"]
    assert "can't allocate memory" in s["failure"]["message"]


@pytest.mark.slow
def test_a_sweep_goes_on_past_a_job_killed_by_sigkill(tmp_path):
    """The real failure: the middle job's process is killed from outside, as the OOM killer would."""
    env = child_env()
    sweep = subprocess.Popen(
        [sys.executable, "-m", "mtbench", "-m", "model=squeezenet", "batch=1", "device=cpu", "warmup=0",
         "steps=1,100000,2", "memory.breakdown=false", f"hydra.sweep.dir={tmp_path}"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    parent = psutil.Process(sweep.pid)
    out = []
    for line in sweep.stdout:
        out.append(line)
        if line.startswith("[job 2 of 3]"):  # job 1's process has been joined: any child now is job 2's
            deadline = time.monotonic() + 120
            victim = None
            while victim is None and time.monotonic() < deadline:
                kids = parent.children()
                victim = kids[0] if kids else None
                time.sleep(0.01)
            assert victim is not None, "job 2's process never started"
            time.sleep(1.0)  # let it build and start training
            os.kill(victim.pid, signal.SIGKILL)
            break
    rest, err = sweep.communicate(timeout=300)
    out.append(rest)
    stdout = "".join(out)
    assert sweep.returncode == 0, err
    summaries = {p.parent.name: json.loads(p.read_text()) for p in tmp_path.rglob("summary.json")}
    assert sorted(summaries) == ["0-squeezenet-b1", "1-squeezenet-b1", "2-squeezenet-b1"]
    assert summaries["0-squeezenet-b1"]["success"] and summaries["2-squeezenet-b1"]["success"]
    assert summaries["1-squeezenet-b1"]["failure"]["kind"] == "killed"
    assert "SIGKILL" in summaries["1-squeezenet-b1"]["failure"]["message"]
    assert "[job 3 of 3]" in stdout and "sweep:" in stdout and "killed" in stdout


@pytest.mark.slow
def test_ctrl_c_to_the_parent_reaches_the_job(tmp_path):
    env = child_env()
    with ctrl_c_raises():
        proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "isolated_job.py"), str(tmp_path / "job"),
                                 *FAKE, "model.workload._target_=tests.fake_workloads.BusyLoop", "steps=1000",
                                 f"+model.workload.ready_file={tmp_path / 'ready'}"],
                                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:  # the job is in its steps
        time.sleep(0.02)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    s = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert s["failure"]["kind"] == "interrupted" and s["measured_steps"] >= 1, s["failure"]


def _busy_job(tmp_path, steps: int, seconds: float, signum: int, disposition) -> subprocess.Popen:
    """isolated_job.py running BusyLoop steps in a session of its own (it touches tmp_path/ready at each step),
    started with `signum` at `disposition` (set in this process around the start: the child inherits it)."""
    previous = signal.signal(signum, disposition)
    try:
        return subprocess.Popen([sys.executable, str(REPO / "tests" / "isolated_job.py"), str(tmp_path / "job"),
                                 *FAKE, "model.workload._target_=tests.fake_workloads.BusyLoop", f"steps={steps}",
                                 f"+model.workload.seconds={seconds}",
                                 f"+model.workload.ready_file={tmp_path / 'ready'}"],
                                cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    finally:
        signal.signal(signum, previous)


@pytest.mark.slow
def test_a_job_started_with_ctrl_c_ignored_keeps_ignoring_it(tmp_path):
    """A script's `mtbench ... &` (or nohup) starts with SIGINT ignored, and Ctrl-C on the terminal still reaches
    its process group: neither the sweep's process nor the job's may end on it."""
    proc = _busy_job(tmp_path, 20, 0.05, signal.SIGINT, signal.SIG_IGN)  # ignored stays ignored across exec
    deadline = time.monotonic() + 120
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)  # as the terminal does: the whole group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    s = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert s["success"] is True and s["measured_steps"] == 20, s["failure"]


@pytest.mark.slow
def test_a_crash_while_releasing_keeps_the_jobs_results(tmp_path):
    proc = isolated(tmp_path / "job", *FAKE, "model.workload._target_=tests.fake_workloads.CrashOnClose", "steps=3")
    assert proc.returncode == 0, proc.stderr
    s = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert s["success"] is True and s["measured_steps"] == 3, s["failure"]


def test_a_deferred_ctrl_c_goes_to_the_job_handler_once():
    from mtbench.job.signals import stop_signals_deferred as _sigint_deferred

    calls = []

    def on_sigint(signum, frame):  # as a job's process handles it: the first ends the job, later ones do nothing
        calls.append(signum)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with pytest.raises(KeyboardInterrupt):
            with _sigint_deferred():
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
        assert calls == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # the forwarded second one changes nothing
    finally:
        signal.signal(signal.SIGINT, previous)


def test_resume_runs_an_interrupted_job_again(tmp_path):
    from mtbench.commands.cli import finished_summary
    from tests.conftest import compose_cfg
    from omegaconf import OmegaConf

    cfg = compose_cfg(["model=squeezenet", "batch=1"])
    config = OmegaConf.to_container(cfg, resolve=True)
    for failure, finished in ((None, True), ({"kind": "oom", "message": "x"}, True),
                              ({"kind": "interrupted", "message": "interrupted by the user (Ctrl-C)"}, False)):
        (tmp_path / "summary.json").write_text(json.dumps({"success": failure is None, "failure": failure,
                                                           "config": config}))
        assert (finished_summary(str(tmp_path), cfg) is not None) == finished, failure
    (tmp_path / "summary.json").write_text(json.dumps({"success": True, "failure": None, "config": dict(config, batch=2)}))
    assert finished_summary(str(tmp_path), cfg) is None  # another configuration


@run_if(root=True, why="to act as a second user")
def test_the_device_lock_is_shared_by_every_user(tmp_path):
    import tempfile

    import torch

    from mtbench.job.lock import DeviceLock

    shared = tempfile.mkdtemp(dir="/tmp")
    os.chmod(shared, 0o1777)  # like /tmp itself
    try:
        lock = DeviceLock(torch.device("cpu"), "wait", shared)
        lock.acquire()
        lock.release()
        pid = os.fork()  # a second user: the lock code only (no torch op runs in this child)
        if pid == 0:
            code = 4
            try:
                os.setgid(65534)
                os.setuid(65534)  # nobody
                other = DeviceLock(torch.device("cpu"), "fail", shared)
                other.acquire()
                other.release()
                code = 0
            except Exception:
                code = 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0  # 3: the second user could not take the lock
    finally:
        for name in os.listdir(shared):
            os.unlink(os.path.join(shared, name))
        os.rmdir(shared)


def _memory_cgroup(tmp_name: str, limit_bytes: int):
    """A memory cgroup with a limit under this process's own (v1 or v2), or None where none can be made here."""
    try:
        lines = [line.rstrip("\n").split(":", 2) for line in open("/proc/self/cgroup")]
    except OSError:
        return None
    for _, controllers, path in lines:
        if controllers == "":
            base, limit_file = os.path.join("/sys/fs/cgroup", path.lstrip("/")), "memory.max"
        elif "memory" in controllers.split(","):
            base, limit_file = os.path.join("/sys/fs/cgroup/memory", path.lstrip("/")), "memory.limit_in_bytes"
        else:
            continue
        group = os.path.join(base, tmp_name)
        try:
            os.mkdir(group)
            with open(os.path.join(group, limit_file), "w") as f:
                f.write(str(limit_bytes))
            return group
        except OSError:
            try:
                os.rmdir(group)
            except OSError:
                pass
    return None


@pytest.mark.slow
def test_the_kernels_oom_killer_is_recorded_as_oom(tmp_path):
    """The real failure: the job outgrows a memory cgroup's limit and the kernel's OOM killer kills it."""
    group = _memory_cgroup(f"mtbench-test-{os.getpid()}", 1_200_000_000)
    if group is None:
        pytest.skip("no memory cgroup can be made here (needs root and a writable memory controller)")
    try:
        env = child_env()
        # the sweep's own process holds torch's libraries (~0.5 GB); VGG16's (ImageNet form: 134M parameters)
        # weights, gradients and momentum 1.6 GB
        cmd = (f"echo $$ > {group}/cgroup.procs && exec {sys.executable} -m mtbench model=vgg16 batch=2 device=cpu "
               "model.workload.net.variant=imagenet "
               f"warmup=0 steps=1 hydra.run.dir={tmp_path / 'job'} lock_dir={tmp_path}")
        proc = subprocess.run(["sh", "-c", cmd], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        s = json.loads((tmp_path / "job" / "summary.json").read_text())
        assert proc.returncode == 1, proc.stderr
        assert s["failure"]["kind"] == "oom", s["failure"]
        assert "OOM killer" in s["failure"]["message"]
    finally:
        os.rmdir(group)


def _wait_for(path, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert path.exists(), f"{path} never appeared"


@pytest.mark.slow
@pytest.mark.parametrize("signame, code", [("SIGTERM", 143), ("SIGHUP", 129)])
def test_sigterm_to_a_running_job_keeps_its_measured_steps(tmp_path, signame, code):
    """What SLURM's preemption, Kubernetes, `timeout` and `kill` send, to the job's whole process group (as a
    scheduler does): the job records "terminated" with its steps and samples, the command exits 128 + signal."""
    # started as from a terminal: under `nohup` (this suite's too) SIGHUP is ignored, and the job rightly keeps it so
    proc = _busy_job(tmp_path, 1000, 0.02, signal.SIGHUP, signal.SIG_DFL)
    _wait_for(tmp_path / "ready")
    time.sleep(0.5)
    os.killpg(proc.pid, getattr(signal, signame))
    _, err = proc.communicate(timeout=60)  # SLURM's default grace time before SIGKILL is 30 s
    assert proc.returncode == code, err
    s = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert s["failure"]["kind"] == "terminated" and s["failure"]["signal"] == signame, s["failure"]
    assert s["measured_steps"] >= 1 and s["step_time_s"]["median"] > 0
    assert s["cpu_util_pct"] is not None, s.get("unavailable")  # the sampler's samples were kept
    rows = (tmp_path / "job" / "steps.csv").read_text().splitlines()
    assert len(rows) - 1 >= s["measured_steps"]
    assert len((tmp_path / "job" / "samples.csv").read_text().splitlines()) > 2


@pytest.mark.slow
def test_sigterm_to_the_jobs_own_process_is_a_recorded_result(tmp_path):
    """`kill <pid of the job's process>`: that job is "terminated" with its steps; the command that ran it goes on
    (exit 0 here: the job's summary is returned, as for a job that failed)."""
    env = child_env()
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "isolated_job.py"), str(tmp_path / "job"),
                             *FAKE, "model.workload._target_=tests.fake_workloads.BusyLoop", "steps=1000",
                             "+model.workload.seconds=0.02", f"+model.workload.ready_file={tmp_path / 'ready'}"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(tmp_path / "ready")
    time.sleep(0.5)
    (job,) = [c for c in psutil.Process(proc.pid).children() if c.name() != "python" or "sampling" not in
              " ".join(c.cmdline())]
    job.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    s = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert s["failure"]["kind"] == "terminated" and s["measured_steps"] >= 1, s["failure"]
    assert (tmp_path / "job" / "steps.csv").exists()


@pytest.mark.slow
def test_sigterm_to_a_sweep_keeps_the_running_jobs_summary_and_stops_it(tmp_path):
    env = child_env()
    sweep = subprocess.Popen(
        [sys.executable, "-m", "mtbench", "-m", "model=squeezenet", "batch=1", "device=cpu", "warmup=0",
         "steps=1,100000,2", "memory.breakdown=false", f"hydra.sweep.dir={tmp_path}", f"lock_dir={tmp_path}"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    for line in sweep.stdout:
        if line.startswith("[job 2 of 3]"):
            break
    deadline = time.monotonic() + 120
    kids = []
    while not kids and time.monotonic() < deadline:
        kids = [k for k in psutil.Process(sweep.pid).children() if "sampling" not in " ".join(k.cmdline())]
        time.sleep(0.05)
    assert kids, "job 2's process never started"
    # job 2 builds squeezenet and runs its steps (tens of ms each): wait for CPU time it spent, not wall time (a
    # loaded machine may take seconds to build the model)
    while kids[0].cpu_times().user < 3.0 and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(sweep.pid, signal.SIGTERM)
    _, err = sweep.communicate(timeout=60)
    assert sweep.returncode == 143, err
    summaries = {p.parent.name: json.loads(p.read_text()) for p in tmp_path.rglob("summary.json")}
    assert sorted(summaries) == ["0-squeezenet-b1", "1-squeezenet-b1"], err  # job 3 never started
    assert summaries["0-squeezenet-b1"]["success"]
    stopped = summaries["1-squeezenet-b1"]
    assert stopped["failure"]["kind"] == "terminated" and stopped["measured_steps"] >= 1, stopped["failure"]
    assert (tmp_path / "1-squeezenet-b1" / "steps.csv").exists()
    assert "mtbench: terminated by SIGTERM" in err


@pytest.mark.slow
def test_a_job_that_dies_records_the_budget_a_finished_one_records(tmp_path):
    """memory.budget_gb replaces the target's budget: a finished job recorded it, a job whose process died recorded
    the board's (issue 48). Both read device.budget.job_budget now."""
    budget = ["target=nano", "memory.budget_gb=1.25"]
    died = isolated(tmp_path / "died", *FAKE, "model.workload._target_=tests.fake_workloads.Signalled",
                    "+model.workload.signal=SIGKILL", "steps=3", *budget)
    assert died.returncode == 0, died.stderr
    finished = isolated(tmp_path / "finished", "model=squeezenet", "batch=1", "memory.breakdown=false", *budget)
    assert finished.returncode == 0, finished.stderr
    records = [json.loads((tmp_path / name / "summary.json").read_text()) for name in ("died", "finished")]
    assert records[0]["failure"]["kind"] == "killed" and records[1]["success"], records[1].get("failure")
    assert records[0]["budget_bytes"] == records[1]["budget_bytes"] == int(1.25 * 2**30)
