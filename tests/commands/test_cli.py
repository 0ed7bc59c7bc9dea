"""The command line: bad input ends in one line and a non-zero exit; a real -m sweep writes every job."""
from __future__ import annotations

import json

import pytest

from tests.conftest import mtbench_cli
from tests.helpers.env import child_env


@pytest.mark.parametrize(
    "args, needle",
    [
        (["model=nosuchnet"], "model='nosuchnet' is not known; allowed: alexnet"),
        (["batch=0"], "batch=0 is out of range; allowed: a whole number >= 1"),
        (["batch=-3"], "batch=-3 is out of range"),
        (["batch=abc"], "batch='abc' is not a whole number"),
        (["steps=0"], "steps=0 is out of range"),
        (["-m", "model=alexnet,nosuchnet"], "model='nosuchnet' is not known"),
        (["-m", "batch=4,0"], "batch=0 is out of range"),
        (["profile=maybe"], "profile='maybe' is not known; allowed: true, false"),
        (["sampler=nosuch"], "sampler='nosuch' is not known; allowed: auto, jetson, jtop, nvml, procfs, rapl"),
        (["data=nosuchdata"], "data='nosuchdata' is not known; allowed: atari, cifar10, iwslt15, shakespeare, squad, synthetic"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle, tmp_path):
    proc = mtbench_cli(*args, f"hydra.run.dir={tmp_path}", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"mtbench: error: {proc.stderr.strip()[16:]}"]
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not list(tmp_path.rglob("summary.json"))


@pytest.mark.slow
def test_missing_data_is_one_line_and_exit_2(tmp_path):
    proc = mtbench_cli("model=squeezenet", "batch=2", "device=cpu", "data=cifar10",
                       f"data.root={tmp_path / 'nothing'}", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "missing file" in lines[0] and "cifar-10-batches-py" in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_sweep_writes_one_summary_per_job(tmp_path):
    proc = mtbench_cli("-m", "model=squeezenet,densenet40", "batch=2", "device=cpu", "warmup=0", "steps=1",
                       f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    summaries = sorted(tmp_path.rglob("summary.json"))
    assert len(summaries) == 2
    models = {json.loads(p.read_text())["model"] for p in summaries}
    assert models == {"squeezenet", "densenet40"}
    assert all((p.parent / "steps.csv").exists() and (p.parent / "samples.csv").exists() for p in summaries)


def test_models_listing(tmp_path):
    proc = mtbench_cli("models")
    assert proc.returncode == 0, proc.stderr
    for name in ("alexnet", "vgg19", "densenet100", "mobilenetv2"):
        assert name in proc.stdout


@pytest.mark.slow
def test_ctrl_c_writes_an_interrupted_summary_and_exits_130(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    import psutil

    from tests.conftest import REPO, ctrl_c_raises

    env = child_env()
    with ctrl_c_raises():
        proc = subprocess.Popen([sys.executable, "-m", "mtbench", "model=vgg16", "batch=8", "device=cpu", "warmup=0",
                                 "steps=500", f"hydra.run.dir={tmp_path}"], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the job's process starts its sampling process just before it builds the model: wait for that one
    deadline = time.monotonic() + 180

    def sampling() -> bool:
        try:
            return any("mtbench.sampling.process" in " ".join(c.cmdline())
                       for c in psutil.Process(proc.pid).children(recursive=True))
        except psutil.Error:  # a process of the tree ended between the listing and the reading
            return False

    while not sampling() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sampling(), "the job's process never started its sampler"
    time.sleep(2.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["success"] is False and summary["failure"]["kind"] == "interrupted"


def test_the_end_table_lists_jobs_by_number(tmp_path):
    from mtbench.campaign.sweep import summaries_in_job_order

    for name in ("10-alexnet-b64", "2-alexnet-b4", "1-alexnet-b2", "0-alexnet-b1"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text("{}")
    assert [p.parent.name for p in summaries_in_job_order(tmp_path)] == [
        "0-alexnet-b1", "1-alexnet-b2", "2-alexnet-b4", "10-alexnet-b64"]


def test_help_lists_choices_not_bases():
    proc = mtbench_cli("--help")
    assert proc.returncode == 0, proc.stderr
    listing = proc.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    groups = {line.split(":")[0]: line for line in listing.splitlines() if ":" in line}
    assert "alexnet" in groups["model"] and "procfs" in groups["sampler"]
    assert "_cnn" not in proc.stdout and "_base" not in proc.stdout


def test_objective_is_what_a_sweeper_gets():
    import math

    from mtbench.commands.cli import objective_value

    ok = {"success": True, "batch_size": 4, "step_time_s": {"median": 0.5}, "throughput_samples_per_s": 8.0,
          "energy_j": {"per_step_mean": 2.0}}
    assert objective_value(ok, "step_time_s") == 0.5
    assert objective_value(ok, "throughput") == 8.0
    assert objective_value(ok, "energy_per_sample_j") == 0.5
    # without the figure, the worst value for the direction (Optuna < 3 ends the study on NaN)
    assert objective_value(dict(ok, energy_j=None), "energy_per_sample_j") == math.inf
    assert objective_value(dict(ok, success=False), "throughput") == -math.inf
    assert objective_value(dict(ok, success=False), "step_time_s") == math.inf


@pytest.mark.parametrize("args, needle", [
    (["device_lock=maybe"], "device_lock='maybe' is not known; allowed: wait, fail, off"),
    (["objective=speed"], "objective='speed' is not known; allowed: step_time_s, throughput, energy_per_sample_j"),
    (["-m", "objective=energy_per_sample_j", "batch=1,2"], "objective=energy_per_sample_j needs a power sensor"),
])
def test_run_settings_are_checked_before_any_job(args, needle, tmp_path):
    proc = mtbench_cli(*args, f"hydra.run.dir={tmp_path}", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_optuna_searches_batch_size_by_the_objective(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    proc = mtbench_cli("-m", "hydra/sweeper=optuna", "hydra.sweeper.direction=maximize", "hydra.sweeper.n_trials=2",
                       "hydra.sweeper.sampler.seed=7", "objective=throughput", "model=squeezenet", "device=cpu",
                       "warmup=0", "steps=1", "batch=choice(1,4,16,64)", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    summaries = [json.loads(p.read_text()) for p in tmp_path.rglob("summary.json")]
    assert len(summaries) == 2
    best = max(summaries, key=lambda s: s["throughput_samples_per_s"])
    assert f"Best parameters: {{'batch': {best['batch_size']}}}" in proc.stdout + proc.stderr


@pytest.mark.parametrize("launcher, parallel", [
    ({"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}, False),
    ({"_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", "n_jobs": -1}, True),
    ({"_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", "n_jobs": 1}, False),
    ({"_target_": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"}, True),
    ({"_target_": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"}, False),
    ({"_target_": "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher", "ray": {"init": {"address": None}}}, True),
    ({"_target_": "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher",
      "ray": {"init": {"address": "10.0.0.1:6379"}}}, False),
])
def test_launchers_that_run_jobs_at_once_here_need_allow_parallel(launcher, parallel):
    from omegaconf import OmegaConf

    from mtbench.campaign.sweep import sweep_problem

    for allow in (False, True):
        cfg = OmegaConf.create({"hydra": {"launcher": launcher}, "allow_parallel": allow, "objective": "step_time_s",
                                "sampler": {"sensors": ["procfs"]}})
        problem = sweep_problem(cfg)
        assert (problem is not None) == (parallel and not allow), problem
        assert problem is None or "allow_parallel=true runs them anyway" in problem


@pytest.mark.slow
def test_a_failed_trial_does_not_end_an_optuna_search(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    proc = mtbench_cli("-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=1", "model=squeezenet", "device=cpu",
                       "warmup=0", "steps=1", "batch=choice(1000000000)", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr  # the out-of-memory trial is the worst value, not a crash
    (summary,) = [json.loads(p.read_text()) for p in tmp_path.rglob("summary.json")]
    assert summary["failure"]["kind"] == "oom"


def test_help_of_subcommands_and_of_a_sweep():
    proc = mtbench_cli("report", "--help")
    assert proc.returncode == 0 and "usage: mtbench report DIR" in proc.stdout, proc.stderr
    proc = mtbench_cli("--help", "model=resnet50,vgg16")
    assert proc.returncode == 0 and "== Configuration groups ==" in proc.stdout, proc.stderr


@pytest.mark.parametrize("target", ["mtbench.commands.sample.os.system", "mtbench.commands.sample.subprocess.Popen"])
def test_a_target_outside_the_allowed_modules_is_one_line(target, tmp_path):
    proc = mtbench_cli("model=squeezenet", f"model.workload.net._target_={target}", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtbench: error:") and target in lines[0], lines
    assert not (tmp_path / "summary.json").exists()


def test_a_basic_sweep_composes_its_jobs_a_batch_at_a_time():
    """Issue 51 item 4: Hydra's basic sweeper composed every job before the first ran ("job 1 of N" after 96 s for
    400 jobs). A sweep on it gets hydra.sweeper.max_batch_size; one on another sweeper, or that sets it, does not."""
    from mtbench.commands.cli import SWEEP_BATCH, with_sweep_batches

    batched = f"hydra.sweeper.max_batch_size={SWEEP_BATCH}"
    assert with_sweep_batches(["-m", "model=alexnet", "batch=1,2"]) == ["-m", "model=alexnet", "batch=1,2", batched]
    assert with_sweep_batches(["model=alexnet"]) == ["model=alexnet"]  # one job: no sweeper
    assert batched not in with_sweep_batches(["-m", "hydra/sweeper=optuna", "batch=1,2"])
    assert with_sweep_batches(["-m", "hydra.sweeper.max_batch_size=2"]) == ["-m", "hydra.sweeper.max_batch_size=2"]


@pytest.mark.slow
def test_a_sweep_larger_than_a_batch_runs_every_job_once(tmp_path):
    """Nine jobs on the basic sweeper, composed eight and then one at a time: nine job folders, numbered in order,
    each a summary, and the console counts nine from the first."""
    proc = mtbench_cli("-m", "model=squeezenet", "batch=1,2,3", "steps=1,2,3", "warmup=0", "device=cpu",
                       "memory.breakdown=false", "data.image_size=8", "sampler.mode=thread",
                       f"hydra.sweep.dir={tmp_path}", f"lock_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[job 1 of 9]" in proc.stdout and "[job 9 of 9]" in proc.stdout
    folders = sorted(p.parent.name for p in tmp_path.rglob("summary.json"))
    assert len(folders) == 9 and sorted(int(f.split("-")[0]) for f in folders) == list(range(9))


@pytest.mark.parametrize("override", ["power.gpu_power_limit_w=-5", "until.loss=-1", "lock_timeout_s=0",
                                      "power.cpu_cores=0", "power.governor=a-b", "until.accuracy=2"])
def test_values_are_refused_under_python_dash_O(override):
    """Issue 52 item 3: the value rules were `assert`s, which `python -O` removes: every value then passed. Each is
    refused in one line under -O too."""
    import subprocess
    import sys

    from tests.conftest import REPO

    code = ("import sys; from mtbench.config_overrides import check_overrides; from mtbench.errors import UsageError\n"
            f"try:\n    check_overrides([{override!r}])\nexcept UsageError as exc:\n    print(exc); sys.exit(2)\n")
    proc = subprocess.run([sys.executable, "-O", "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=child_env())
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{override.split('=')[0]}=" in proc.stdout and "is not allowed" in proc.stdout
