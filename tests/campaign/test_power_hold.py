"""Power settings across runs (issue 22): the restore file a crashed run leaves, one restore per sweep, the checks
before any job, the power presets and the weighted time-energy objective."""
from __future__ import annotations

import json
import math
import os
import signal
import stat
import subprocess
import sys
import time

import pytest
from hydra import compose
from omegaconf import OmegaConf

from mtbench.campaign import power_hold
from mtbench.campaign.resume import energy_time_cost_j, objective_value
from mtbench.config_overrides import check_overrides
from mtbench.device import power, power_record
from mtbench.errors import UsageError
from tests.conftest import REPO
from tests.fake_sysfs import install_fake_nvpmodel, make_power_board
from tests.device.test_power import files_of
from tests.helpers.env import child_env

BASIC = power_hold.IN_PROCESS[0]
STATUS = "var/lib/nvpmodel/status"
MAX_KHZ = "sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq"


@pytest.fixture
def board(tmp_path, monkeypatch):
    """An Orin tree in MAXN and an `nvpmodel` on PATH that logs each call, then runs the fake one."""
    root = tmp_path / "root"
    make_power_board(root, "orin")
    fake = install_fake_nvpmodel(tmp_path / "fake-bin")
    logger = tmp_path / "bin" / "nvpmodel"
    logger.parent.mkdir()
    logger.write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path / 'nvpmodel.log'}\nexec {fake} \"$@\"\n")
    logger.chmod(0o755)
    monkeypatch.setenv("PATH", f"{logger.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv(power_record.HOLD_ENV, raising=False)
    return root


def calls(tmp_path) -> list:
    log = tmp_path / "nvpmodel.log"
    return log.read_text().splitlines() if log.exists() else []


def cfg_of(root, lock_dir, **keys):
    return OmegaConf.create({"power": {**keys, "sysfs_root": str(root)}, "sampler": {}, "lock_dir": str(lock_dir)})


def job(root, lock_dir, out, **keys) -> power.PowerControl:
    ctl = power.PowerControl(cfg_of(root, lock_dir, **keys), out, None)
    ctl.apply()
    return ctl


def cli(tmp_path, *args, **popen):
    env = child_env(PATH=os.environ["PATH"])
    env.pop(power_record.HOLD_ENV, None)
    argv = [sys.executable, "-m", "mtbench", *args]
    if popen:
        return subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


TINY = ["model=squeezenet", "batch=1", "steps=1", "warmup=0", "device=cpu", "memory.breakdown=false"]


# -- the restore file a run that died leaves ---------------------------------------------------------------------

@pytest.mark.slow
def test_a_crashed_runs_settings_are_restored_by_the_next_run_which_says_so(board, tmp_path):
    before = files_of(board)
    locks = tmp_path / "locks"
    locks.mkdir()
    crash = ("import os, signal, sys; sys.path.insert(0, sys.argv[1]); from omegaconf import OmegaConf;"
             "from mtbench.device import power;"
             "cfg = OmegaConf.create({'power': {'sysfs_root': sys.argv[2], 'nvpmodel': 1, 'cpu_max_khz': 729600},"
             " 'sampler': {}, 'lock_dir': sys.argv[3]});"
             "power.PowerControl(cfg, sys.argv[4], None).apply(); os.kill(os.getpid(), signal.SIGKILL)")
    proc = subprocess.run([sys.executable, "-c", crash, str(REPO), str(board), str(locks), str(tmp_path / "job")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    record = board / power_record.FOLDER / power_record.NAME
    assert (board / STATUS).read_text() == "pmode:0001\n" and record.exists()  # the crash left them
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    pid = json.loads(record.read_text())["pid"]
    out = cli(tmp_path, *TINY, f"lock_dir={tmp_path}", f"power.sysfs_root={board}",  # another lock_dir, no knob
              f"hydra.run.dir={tmp_path / 'next'}")
    assert out.returncode == 0, out.stderr
    said = [line for line in out.stderr.splitlines() if "ended without restoring" in line]
    assert said == [f"mtbench: power: a run that ended without restoring the device (pid {pid}) left {record}: "
                    "restored the settings it recorded"], out.stderr
    assert files_of(board) == before and not record.exists()


def test_a_restore_file_this_user_must_not_trust_is_refused(board, tmp_path):
    locks = tmp_path / "locks"
    locks.mkdir()
    record = board / power_record.FOLDER / power_record.NAME
    record.parent.mkdir(parents=True)
    record.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(UsageError, match="power restore file .* is a symbolic link, refused"):
        job(board, locks, tmp_path / "job", nvpmodel=1)
    record.unlink()
    record.write_text(json.dumps({"root": str(board), "files": [[MAX_KHZ, "1"]], "pid": 1, "start": None}))
    record.chmod(0o666)
    with pytest.raises(UsageError, match="is writable by other users, refused"):
        job(board, locks, tmp_path / "job", nvpmodel=1)
    power_hold.SweepPower().before_job(cfg_of(board, locks), False, "")  # a run that changes nothing goes on
    if os.geteuid() == 0:
        record.chmod(0o600)
        os.chown(record, 65534, 65534)
        with pytest.raises(UsageError, match="belongs to uid 65534, not to this user"):
            job(board, locks, tmp_path / "job", nvpmodel=1)
    assert (board / MAX_KHZ).read_text() != "1\n" and calls(tmp_path) == []


def test_another_live_runs_settings_are_not_taken_over(board, tmp_path):
    locks = tmp_path / "locks"
    locks.mkdir()
    power_record.write(str(board / power_record.FOLDER / power_record.NAME),
                       {"root": str(board), "files": [], **power_record.owner(os.getppid())})
    with pytest.raises(UsageError, match=rf"another mtbench run \(pid {os.getppid()}\) has changed this device's"):
        job(board, locks, tmp_path / "job", nvpmodel=1)
    assert calls(tmp_path) == []


def test_runs_with_different_lock_dirs_share_the_devices_restore_file(board, tmp_path):
    """Run A caps the CPU with its lock_dir (a container's own /tmp) and holds the setting; run C, with another
    lock_dir, must not take A's cap for the device's original (it restored the board to A's cap once A ended):
    the restore file is the device's, one per sysfs root, and C stops with the line naming A."""
    before = files_of(board)
    hold = ("import sys; sys.path.insert(0, sys.argv[1]); from omegaconf import OmegaConf;"
            "from mtbench.device import power;"
            "cfg = OmegaConf.create({'power': {'sysfs_root': sys.argv[2], 'cpu_max_khz': 729600},"
            " 'sampler': {}, 'lock_dir': sys.argv[3]});"
            "ctl = power.PowerControl(cfg, sys.argv[4], None); ctl.apply(); print('applied', flush=True);"
            "sys.stdin.read(); ctl.restore()")
    (tmp_path / "a-locks").mkdir()
    (tmp_path / "c-locks").mkdir()
    a = subprocess.Popen([sys.executable, "-c", hold, str(REPO), str(board), str(tmp_path / "a-locks"),
                          str(tmp_path / "a")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert a.stdout.readline() == "applied\n"
        assert (board / MAX_KHZ).read_text() == "729600\n"
        with pytest.raises(UsageError, match=rf"another mtbench run \(pid {a.pid}\) has changed this device's"):
            job(board, tmp_path / "c-locks", tmp_path / "c", cpu_max_khz=1113600)
    finally:
        a.communicate("", timeout=120)
    assert a.returncode == 0 and files_of(board) == before  # A restored the board as it found it
    assert not (board / power_record.FOLDER / power_record.NAME).exists()
    folder = board / power_record.FOLDER
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


# -- one restore per sweep ---------------------------------------------------------------------------------------

def test_a_sweeps_jobs_keep_their_settings_and_the_sweep_restores_once(board, tmp_path, capsys, monkeypatch):
    before = files_of(board)
    locks = tmp_path / "locks"
    locks.mkdir()
    hold = power_hold.SweepPower()
    hold.before_job(cfg_of(board, locks, nvpmodel=1), True, BASIC)
    assert power_record.HOLD_ENV in os.environ
    for n in range(2):  # two models in MODE_15W: the mode is set once
        ctl = job(board, locks, tmp_path / f"job{n}", nvpmodel=1)
        ctl.restore()
        assert (board / STATUS).read_text() == "pmode:0001\n"  # kept between the jobs
        assert not (tmp_path / f"job{n}" / power.RECORD).exists()
    assert calls(tmp_path) == ["-m 1"]
    ctl = job(board, locks, tmp_path / "job2", cpu_max_khz=729600)  # other settings: the board as found, then these
    ctl.restore()
    assert calls(tmp_path) == ["-m 1", "-m 0"] and (board / STATUS).read_text() == "pmode:0000\n"
    assert (board / MAX_KHZ).read_text() == "729600\n"
    job(board, locks, tmp_path / "job3").restore()  # no power.* at all: the device as the sweep found it
    assert files_of(board) == before and calls(tmp_path) == ["-m 1", "-m 0"]
    ctl = job(board, locks, tmp_path / "job4", nvpmodel=2)
    hold.close()
    assert files_of(board) == before and not (board / power_record.FOLDER / power_record.NAME).exists()
    assert power_record.HOLD_ENV not in os.environ
    assert capsys.readouterr().err.count("the sweep has ended: restored the device's settings") == 1


@pytest.mark.slow
def test_a_cli_sweep_sets_the_mode_once_and_restores_it_once_at_its_end(board, tmp_path):
    before = files_of(board)
    out = cli(tmp_path, "-m", *TINY, "model=squeezenet,alexnet", f"power.sysfs_root={board}", "power.nvpmodel=1",
              f"lock_dir={tmp_path}", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert out.returncode == 0, out.stderr
    assert calls(tmp_path) == ["-m 1", "-m 0"]
    assert out.stderr.count("the sweep has ended: restored") == 1 and files_of(board) == before
    summaries = sorted((tmp_path / "sweep").rglob("summary.json"))
    assert [json.loads(p.read_text())["power_mode"]["read_back"]["nvpmodel"]["id"] for p in summaries] == [1, 1]


@pytest.mark.slow
def test_sigterm_to_a_sweep_restores_the_device(board, tmp_path):
    before = files_of(board)
    proc = cli(tmp_path, "-m", "model=vgg19", "batch=16", "steps=500", "warmup=0", "device=cpu", "batch=16,32",
               f"power.sysfs_root={board}", "power.nvpmodel=1", f"lock_dir={tmp_path}",
               f"hydra.sweep.dir={tmp_path / 'sweep'}", popen=True)
    deadline = time.monotonic() + 240
    while (board / STATUS).read_text() != "pmode:0001\n" and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert (board / STATUS).read_text() == "pmode:0001\n", proc.communicate()[1]
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 143, err
    assert "the sweep has ended: restored" in err and files_of(board) == before
    assert not (board / power_record.FOLDER / power_record.NAME).exists()


# -- checks before any job ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("tree, keys, message", [
    ("plain", ["power.gpu_max_hz=306000000,612000000"], "power.gpu_max_hz=306000000: no GPU devfreq node under"),
    ("plain", ["power.cpu_cores=1,64"], "power.cpu_cores=64 is out of range; allowed: 1-"),
    ("root", ["power.nvpmodel=0,7"], "power.nvpmodel=7 is not a mode of this board; allowed: 0 (MAXN), 1 (MODE_15W)"),
])
def test_a_sweeps_power_values_are_checked_before_any_job(board, tmp_path, tree, keys, message):
    before = files_of(board)
    out = cli(tmp_path, "-m", *TINY, f"power.sysfs_root={tmp_path / tree}", *keys, f"lock_dir={tmp_path}",
              f"hydra.sweep.dir={tmp_path / 'sweep'}")
    err = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(err) == 1 and err[0].startswith("mtbench: error: "), out.stderr
    assert message in err[0], err
    assert "[job 1 of" not in out.stdout and not list(tmp_path.rglob("summary.json"))
    assert files_of(board) == before and calls(tmp_path) == []


# -- presets -----------------------------------------------------------------------------------------------------

def test_powermodes_sweeps_the_boards_modes_times_models(hydra_conf, tmp_path):
    make_power_board(tmp_path / "tx2", "tx2")
    cfg = compose("config", overrides=["+experiment=powermodes", f"power.sysfs_root={tmp_path / 'tx2'}"],
                  return_hydra_config=True)
    params = dict(cfg.hydra.sweeper.params)
    assert list(params) == ["power.nvpmodel", "model"]  # the mode varies slowest: set once for all its models
    assert params["power.nvpmodel"] == "0,1,3" and params["model"] == "resnet50,mobilenetv2,squeezenet,char_rnn"
    assert list(cfg.sampler.sensors) == ["procfs", "jetson", "thermal"]
    check_overrides(["-m", "+experiment=powermodes", "model=resnet50", "power.nvpmodel=0,1"])


def test_cores_sweeps_core_counts_up_to_what_a_job_may_get(hydra_conf, tmp_path):
    cfg = compose("config", overrides=["+experiment=cores"], return_hydra_config=True)
    here = len(os.sched_getaffinity(0))
    counts = [int(c) for c in cfg.hydra.sweeper.params["power.cpu_cores"].split(",")]
    assert counts[0] == 1 and counts[-1] == here and cfg.device.name == "cpu" and cfg.batch == 8
    make_power_board(tmp_path / "orin", "orin")  # a Jetson: its cores, 8 on an AGX Orin
    cfg = compose("config", overrides=["+experiment=cores", f"power.sysfs_root={tmp_path / 'orin'}"],
                  return_hydra_config=True)
    assert cfg.hydra.sweeper.params["power.cpu_cores"] == "1,2,4,8"


# -- the weighted time-energy objective --------------------------------------------------------------------------

def summary(eta=0.5, top_w=60.0, energy=2.0, target=None):
    config = {"objective_eta": eta, "objective_max_power_w": top_w, "target": target or {"name": "none"}}
    return {"success": True, "batch_size": 2, "step_time_s": {"median": 0.1},
            "energy_j": None if energy is None else {"per_step_mean": energy}, "config": config}


def test_energy_time_cost_is_zeus_weighted_sum_per_sample():
    assert objective_value(summary(), "energy_time_cost_j") == pytest.approx((0.5 * 2 + 0.5 * 60 * 0.1) / 2)
    assert objective_value(summary(eta=1), "energy_time_cost_j") == pytest.approx(1.0)  # energy per sample alone
    assert objective_value(summary(eta=0), "energy_time_cost_j") == pytest.approx(3.0)  # max power x time alone
    assert energy_time_cost_j(summary(top_w=None, target={"max_power_w": 15})) == pytest.approx(
        (0.5 * 2 + 0.5 * 15 * 0.1) / 2)  # the target's max power where none is given
    assert objective_value(summary(energy=None), "energy_time_cost_j") == math.inf  # no power sensor: the worst


def test_energy_time_cost_without_a_max_power_is_one_line_before_any_job(tmp_path):
    out = cli(tmp_path, "-m", *TINY, "batch=1,2", "objective=energy_time_cost_j", "sampler=rapl",
              f"hydra.sweep.dir={tmp_path / 'sweep'}")
    err = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(err) == 1, out.stderr
    assert "objective=energy_time_cost_j weighs time by the device's max power, and none is known; allowed: " \
           "objective_max_power_w=W" in err[0]
    assert "[job 1 of" not in out.stdout


@pytest.mark.parametrize("override, allowed", [("objective_eta=2", "allowed: a number 0-1"),
                                               ("objective_max_power_w=-5", "allowed: null or a number of W > 0")])
def test_weights_out_of_range_are_refused(override, allowed):
    with pytest.raises(UsageError, match=allowed):
        check_overrides([override])


# -- the report where energy is not measured ---------------------------------------------------------------------

def test_without_energy_the_figure_is_time_against_the_one_knob_and_says_so(tmp_path):
    from mtbench.report.pareto import fig_pareto, knob_axis

    def one(cores, seconds, mode=0):
        return {"model": "resnet50", "batch_size": 8, "success": True, "step_time_s": {"median": seconds},
                "energy_j": None, "config": {"power": {"cpu_cores": cores, "nvpmodel": mode, "sysfs_root": None}}}

    jobs = [one(2, 1.1), one(1, 2.0)]
    assert knob_axis(jobs) == "cpu_cores"  # nvpmodel=0 is the same in both: a setting, not a knob
    assert knob_axis([one(1, 2.0), one(2, 1.1, mode=1)]) is None  # two knobs vary: one bar per setting
    assert knob_axis([one([0, 2], 2.0), one([0, 1], 1.1)]) is None  # core lists are not an axis
    assert fig_pareto(jobs, tmp_path) == ["pareto_resnet50.png"]
    assert (tmp_path / "pareto.md").read_text().splitlines()[-1] == (
        "resnet50: energy per sample is not measured here (no power sensor); pareto_resnet50.png shows median "
        "step time against power.cpu_cores instead.")


def test_nvpmodel_0_is_set_not_taken_for_unset(board, tmp_path):
    make_power_board(board, "orin", mode=1)
    ctl = job(board, tmp_path, tmp_path / "job", nvpmodel=0)
    assert (board / STATUS).read_text() == "pmode:0000\n" and calls(tmp_path) == ["-m 0"]
    assert ctl.summary()["asked"] == {"nvpmodel": 0}
    ctl.restore()
    assert (board / STATUS).read_text() == "pmode:0001\n"


def test_cores_alone_off_a_jetson_leave_no_machine_file_and_meet_no_other_run(tmp_path, monkeypatch):
    monkeypatch.delenv(power_record.HOLD_ENV, raising=False)
    record = tmp_path / "not-a-jetson" / power_record.FOLDER / power_record.NAME
    power_record.write(str(record), {"root": "/", "files": [], **power_record.owner(os.getppid())})  # another run's
    ctl = job(tmp_path / "not-a-jetson", tmp_path, tmp_path / "job", cpu_cores=1)  # changes only this process
    ctl.restore()
    assert json.loads(record.read_text())["pid"] == os.getppid()  # the other run's file, untouched
    monkeypatch.setenv(power_record.HOLD_ENV, json.dumps({"path": str(record), **power_record.owner()}))  # a sweep's
    job(tmp_path / "not-a-jetson", tmp_path, tmp_path / "job", cpu_cores=1).restore()
    job(tmp_path / "not-a-jetson", tmp_path, tmp_path / "job").restore()  # no power.* at all
    assert json.loads(record.read_text())["pid"] == os.getppid()
    monkeypatch.delenv(power_record.HOLD_ENV)
    record.unlink()
    job(tmp_path / "not-a-jetson", tmp_path, tmp_path / "job", cpu_cores=1).restore()
    assert not record.exists()
