"""power.*: applied before the model is built, read back, clamps said, restored however the job ends (issue 22)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from mtbench.device import power, power_sysfs
from mtbench.errors import UsageError
from tests.conftest import REPO
from tests.fake_nvml import FakeGpu, fake_pynvml
from tests.fake_sysfs import install_fake_nvpmodel, kernel_write, make_power_board
from tests.helpers.run_if import run_if
from tests.helpers.compose import FAKE as FAKE_JOB
from tests.helpers.env import child_env

CPU = types.SimpleNamespace(type="cpu", index=None)
FAKE = [*FAKE_JOB, "batch=1"]


def files_of(root: Path) -> dict:
    """Every regular file's text under the tree's sys/ and var/ (links not followed): the state to compare."""
    out = {}
    for base in ("sys", "var"):
        for dirpath, _, names in os.walk(root / base):
            for name in names:
                p = Path(dirpath) / name
                if not p.is_symlink():
                    out[str(p.relative_to(root))] = p.read_text()
    return out


@pytest.fixture
def board(tmp_path, monkeypatch):
    """An Orin tree in MAXN, the fake nvpmodel first on PATH, the kernel's clamping rules on every write."""
    root = tmp_path / "root"
    make_power_board(root, "orin")
    install_fake_nvpmodel(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(power_sysfs, "write_attr", kernel_write(power_sysfs.write_attr))
    return root


def control(root, out, device=CPU, **keys) -> power.PowerControl:
    cfg = OmegaConf.create({"power": {**keys, "sysfs_root": str(root)}, "sampler": {}})
    return power.PowerControl(cfg, out, device)


def test_mode_clocks_lock_applied_read_back_and_restored(board, tmp_path):
    before = files_of(board)
    ctl = control(board, tmp_path / "job", nvpmodel="MODE_15W", gpu_max_hz=612000000, lock_clocks=True,
                  cpu_max_khz=729600, governor="performance")
    ctl.apply()
    s = ctl.summary()
    assert s["read_back"]["nvpmodel"] == {"id": 1, "name": "MODE_15W"}
    assert s["read_back"]["gpu_max_hz"] == s["read_back"]["gpu_min_hz"] == 612000000  # locked as jetson_clocks
    assert s["read_back"]["cpu_max_khz"] == 729600 and s["read_back"]["governor"] == "performance"
    assert (board / "sys/devices/system/cpu/cpufreq/policy0/scaling_min_freq").read_text() == "729600\n"
    assert (board / "sys/devices/system/cpu/cpu5/online").read_text() == "0\n"  # MODE_15W: 4 cores
    assert s["clamped"] == [] and (tmp_path / "job" / power.RECORD).exists()
    ctl.restore()
    assert files_of(board) == before and not (tmp_path / "job" / power.RECORD).exists()


def test_a_clamped_clock_is_said_in_one_line_and_the_read_back_figure_kept(board, tmp_path, capsys):
    ctl = control(board, tmp_path / "job", gpu_max_hz=1000000000, cpu_max_khz=9999999)
    ctl.apply()
    s = ctl.summary()
    assert s["read_back"]["gpu_max_hz"] == 918000000 and s["read_back"]["cpu_max_khz"] == 2201600
    assert s["clamped"] == ["cpu_max_khz", "gpu_max_hz"]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["mtbench: power: power.cpu_max_khz=9999999 asked, the board set 2201600; the job runs at 2201600",
                   "mtbench: power: power.gpu_max_hz=1000000000 asked, the board set 918000000; the job runs at "
                   "918000000"]
    ctl.restore()


@pytest.mark.parametrize("keys, message", [
    ({"nvpmodel": "MAXQ"}, "power.nvpmodel='MAXQ' is not a mode of this board; allowed: 0 (MAXN), 1 (MODE_15W), 2 "
                           "(MODE_30W)"),
    ({"cpu_cores": 9}, "power.cpu_cores=9 is out of range; allowed: 1-8"),
    ({"governor": "turbo"}, "power.governor='turbo' is not known; allowed: interactive"),
    ({"gpu_power_limit_w": 100}, "need a CUDA GPU"),
])
def test_a_value_the_board_does_not_have_changes_nothing(board, tmp_path, keys, message):
    before = files_of(board)
    with pytest.raises(UsageError, match=None) as info:
        control(board, tmp_path / "job", **keys).apply()
    assert message in str(info.value) and "\n" not in str(info.value)
    assert files_of(board) == before and not (tmp_path / "job" / power.RECORD).exists()


@run_if(not_root=True, why="root may write a read-only file")
def test_without_write_access_one_line_and_nothing_changed(board, tmp_path):
    target = board / "sys/devices/platform/17000000.ga10b/devfreq/17000000.ga10b/max_freq"
    target.chmod(0o444)
    before = files_of(board)
    with pytest.raises(UsageError, match="need write access to .*max_freq .*run as root"):
        control(board, tmp_path / "job", gpu_max_hz=612000000).apply()
    assert files_of(board) == before


def test_a_link_planted_at_a_clock_file_is_refused_and_its_target_untouched(board, tmp_path):
    outside = tmp_path / "precious"
    outside.write_text("keep\n")
    gpu = board / "sys/devices/platform/17000000.ga10b/devfreq/17000000.ga10b"
    (gpu / "max_freq").unlink()
    (gpu / "max_freq").symlink_to(outside)
    ctl = control(board, tmp_path / "job", gpu_max_hz=612000000)
    with pytest.raises(UsageError, match="symbolic link, refused"):
        ctl.apply()
    ctl.restore()
    assert outside.read_text() == "keep\n"


def test_cpu_cores_set_this_processs_affinity_and_threads_for_real(tmp_path):
    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    ctl = control(tmp_path / "not-a-jetson", tmp_path / "job", cpu_cores=1)
    ctl.apply()
    try:
        assert len(os.sched_getaffinity(0)) == 1 and torch.get_num_threads() == 1
        assert ctl.summary()["read_back"]["cpu_cores"] == [min(affinity)]
    finally:
        ctl.restore()
    assert os.sched_getaffinity(0) == affinity and torch.get_num_threads() == threads


def test_cpu_cores_on_a_tx2_take_cores_offline_as_nvpmodel_does(tmp_path, monkeypatch):
    root = tmp_path / "root"
    make_power_board(root, "tx2")
    before = files_of(root)
    ctl = control(root, tmp_path / "job", cpu_cores=[0, 3])
    ctl.apply()
    assert ctl.summary()["read_back"]["cpus_online"] == [0, 3]
    ctl.restore()
    assert files_of(root) == before


def test_nvml_power_limit_and_locked_clocks_set_read_back_restored(tmp_path, monkeypatch):
    gpu = FakeGpu()
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([gpu]))
    cuda = types.SimpleNamespace(type="cuda", index=0)
    ctl = control(tmp_path, tmp_path / "job", device=cuda, gpu_power_limit_w=250, gpu_locked_clocks_mhz=[900, 1400])
    ctl.apply()
    assert gpu.power_limit_mw == 250_000 and gpu.locked_clocks_mhz == (900, 1400)
    assert ctl.summary()["read_back"] == {"gpu_power_limit_w": 250.0, "gpu_locked_clocks_mhz": [900, 1400]}
    ctl.restore()
    assert gpu.power_limit_mw == 700_000 and gpu.locked_clocks_mhz is None


@pytest.mark.parametrize("gpu, keys, message", [
    (FakeGpu(root=False), {"gpu_power_limit_w": 250}, "NVML refuses (Insufficient Permissions): setting it needs root"),
    (FakeGpu(), {"gpu_power_limit_w": 900}, "is not allowed by this GPU (NVML: Invalid Argument); allowed: 200-700 W"),
    (FakeGpu(architecture=4), {"gpu_locked_clocks_mhz": 1000}, "does not support it (NVML: Not Supported)"),
])
def test_nvml_refusals_are_one_line(tmp_path, monkeypatch, gpu, keys, message):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([gpu]))
    with pytest.raises(UsageError) as info:
        control(tmp_path, tmp_path / "job", device=types.SimpleNamespace(type="cuda", index=0), **keys).apply()
    assert message in str(info.value)
    assert gpu.power_limit_mw == 700_000


@pytest.mark.parametrize("workload, success", [("tests.fake_workloads.Interrupted", False),
                                               ("tests.fake_workloads.Broken", False), (None, True)])
def test_restored_after_success_failure_and_ctrl_c(board, run, workload, success):
    before = files_of(board)
    overrides = FAKE + ["steps=3", f"power.sysfs_root={board}", "power.nvpmodel=1", "power.gpu_max_hz=306000000"]
    if workload:
        overrides.append(f"model.workload._target_={workload}")
    else:
        overrides = [o for o in overrides if not o.startswith("~")]
    if workload and workload.endswith("Interrupted"):
        with pytest.raises(KeyboardInterrupt):
            run(overrides)
        summary = json.loads((board.parent / "job" / "summary.json").read_text())
    else:
        summary = run(overrides)
    assert summary["success"] is success
    assert summary["power_mode"]["read_back"]["nvpmodel"] == {"id": 1, "name": "MODE_15W"}
    assert summary["power_mode"]["read_back"]["gpu_max_hz"] == 306000000
    assert files_of(board) == before


def _isolated(tmp_path, board, *overrides):
    env = child_env(PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    args = [sys.executable, str(REPO / "tests" / "isolated_job.py"), str(tmp_path / "job"), *FAKE,
            f"power.sysfs_root={board}", "power.nvpmodel=MODE_15W", "power.cpu_max_khz=729600", *overrides]
    return subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_the_parent_restores_what_a_job_killed_by_sigkill_set(board, tmp_path):
    before = files_of(board)
    proc = _isolated(tmp_path, board, "model.workload._target_=tests.fake_workloads.Signalled", "steps=3")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["failure"]["kind"] == "killed"
    assert "mtbench: power: restored the settings the job's process left in place" in err
    assert files_of(board) == before and not (tmp_path / "job" / power.RECORD).exists()


@pytest.mark.slow
def test_sigterm_to_the_sweep_restores_the_running_jobs_settings(board, tmp_path):
    before = files_of(board)
    ready = tmp_path / "ready"
    proc = _isolated(tmp_path, board, "model.workload._target_=tests.fake_workloads.BusyLoop", "steps=50",
                     "+model.workload.seconds=0.2", f"+model.workload.ready_file={ready}")
    deadline = time.monotonic() + 240
    while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert ready.exists(), proc.communicate()[1]
    assert (board / "var/lib/nvpmodel/status").read_text() == "pmode:0001\n"  # set while the job runs
    assert (board / "sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq").read_text() == "729600\n"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert json.loads((tmp_path / "job" / "summary.json").read_text())["failure"]["kind"] == "terminated"
    assert files_of(board) == before


def test_a_mode_that_needs_a_reboot_is_not_applied_and_the_job_does_not_run(board, tmp_path):
    """An Orin's GPU power gating cannot change while the GPU is up: nvpmodel asks for a reboot (its standard input
    is empty: no) and changes nothing. The job is not measured in a mode the board is not in: one line says so."""
    conf = board / "etc/nvpmodel.conf"
    conf.write_text(conf.read_text() + "\n< PARAM TYPE=FILE NAME=TPC_POWER_GATING >\n"
                    "TPC_PG_MASK /sys/devices/platform/gpu.0/tpc_pg_mask\n\n< POWER_MODEL ID=3 NAME=MODE_GATED >\n"
                    "CPU MAX_FREQ 1497600\nTPC_POWER_GATING TPC_PG_MASK 254\n")
    (board / "sys/devices/platform/gpu.0").mkdir(parents=True, exist_ok=True)
    (board / "sys/devices/platform/gpu.0/tpc_pg_mask").write_text("0\n")
    before = files_of(board)
    ctl = control(board, tmp_path / "job", nvpmodel="MODE_GATED")
    with pytest.raises(UsageError) as info:
        ctl.apply()
    message = str(info.value)
    assert "power.nvpmodel='MODE_GATED': mode 3 was not applied (NVPM WARN: Reboot required for changing to this " \
           "power mode: 3); the board stays in mode 0" in message and "\n" not in message
    ctl.restore()
    assert files_of(board) == before


@pytest.mark.parametrize("fields, says", [
    ({"files": [1, 2]}, "is not a restore record (files must be [path, value] pairs of texts); remove it; not "
                        "restored from it"),
    ({"nvpmodel": "3; reboot"}, "is not a restore record (nvpmodel must be a mode id)"),
    ({"nvml": [1]}, "is not a restore record (nvml must be a table of settings)"),
    ({"nvpmodel": 3}, "restoring nvpmodel mode 3 failed: [Errno 2] No such file or directory: 'nvpmodel'"),
])
def test_a_malformed_job_record_is_one_line_never_a_traceback(board, tmp_path, monkeypatch, capsys, fields, says):
    """Issue 51 item 10: a job's restore record with `"files": [1, 2]`, or an nvpmodel mode on a machine without
    the nvpmodel program, raised out of the restore (a traceback after a job that died); each is one line."""
    from mtbench.device import power_record

    empty = tmp_path / "no-programs"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    job = tmp_path / "job"
    job.mkdir()
    power_record.write(str(job / power.RECORD), {"root": str(board), "files": [], "nvpmodel": None, **fields})
    before = files_of(board)
    power.restore_left(job, str(board))
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err
    assert files_of(board) == before
