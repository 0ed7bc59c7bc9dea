"""`mtbench report` on a generated multirun folder with a failed job and a job without power."""
from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from mtbench.errors import UsageError
from mtbench.report import make_report
from mtbench.job.run import run_job
from tests.conftest import REPO, compose_cfg, mtbench_cli
from tests.fake_sysfs import make_tx2
from tests.sampling.test_telemetry import TX2_POWER
from tests.helpers.env import child_env

OOM = ["model.workload._target_=tests.fake_workloads.OutOfMemory", "~model.workload.net",
       "~model.workload.optimizer", "~model.workload.input_shape", "~model.workload.num_classes"]


@pytest.fixture
def sweep(tmp_path, monkeypatch):
    from mtbench import config

    monkeypatch.setattr(config, "ALLOWED_TARGET_PREFIXES", config.ALLOWED_TARGET_PREFIXES + ("tests.",))
    make_tx2(tmp_path / "tx2", TX2_POWER)
    jetson = ["sampler=jetson", f"sampler.sysfs_root={tmp_path / 'tx2'}"]
    root = tmp_path / "multirun"
    run_job(compose_cfg(["model=squeezenet", "batch=2"] + jetson), root / "0-squeezenet-b2")
    run_job(compose_cfg(["model=squeezenet", "batch=4"] + jetson), root / "1-squeezenet-b4")
    run_job(compose_cfg(["model=densenet40", "batch=2"]), root / "2-densenet40-b2")  # no power sensor
    run_job(compose_cfg(["model=densenet40", "batch=4"] + OOM), root / "3-densenet40-b4")  # fails: OOM
    return root


@pytest.mark.slow
def test_report_of_a_sweep(sweep):
    out = make_report(sweep)
    with open(out / "summary.csv") as f:
        rows = {r["job"]: r for r in csv.DictReader(f)}
    assert len(rows) == 4
    assert rows["3-densenet40-b4"]["success"] == "False" and rows["3-densenet40-b4"]["failure.kind"] == "oom"
    assert rows["0-squeezenet-b2"]["power_w.VDD_IN"] == "9"
    assert rows["2-densenet40-b2"]["power_w"] == ""  # null, not 0
    assert float(rows["1-squeezenet-b4"]["step_time_s.median"]) > 0
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) >= 5 and all(p.stat().st_size > 10_000 for p in pngs)
    text = (out / "README.md").read_text()
    assert "**oom**" in text and "3-densenet40-b4" in text and "not measured on this machine" in text


@pytest.mark.slow
def test_report_cli(sweep, tmp_path):
    proc = mtbench_cli("report", str(sweep))
    assert proc.returncode == 0, proc.stderr
    assert (sweep / "report" / "summary.csv").exists()
    assert "3-densenet40-b4" in (sweep / "report" / "report.html").read_text()  # the page too
    bad = mtbench_cli("report", str(tmp_path / "nowhere"))
    assert bad.returncode == 2 and bad.stderr.strip().startswith("mtbench: error: report:")


def test_report_of_an_empty_folder(tmp_path):
    with pytest.raises(UsageError, match="no summary.json"):
        make_report(tmp_path)


@pytest.mark.slow
def test_sweep_prints_progress_and_a_table(tmp_path):
    proc = mtbench_cli("-m", "model=squeezenet", "batch=2,4", "device=cpu", "warmup=0", "steps=1",
                       f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert "[job 1 of 2] model=squeezenet batch=2" in proc.stdout
    assert "[job 2 of 2] model=squeezenet batch=4" in proc.stdout
    assert f"sweep: {tmp_path}" in proc.stdout and "1-squeezenet-b4" in proc.stdout
    assert len(list(tmp_path.rglob("summary.json"))) == 2
    json.loads(next(tmp_path.rglob("summary.json")).read_text())


def test_report_of_a_mtbench_sample_folder(tmp_path):
    """Issue 8 item 12: a `mtbench-sample` output (model and batch_size null) is reported, not a crash."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "mtbench.commands.sample", "--sensors", "none", "--out", str(out), "--",
                           sys.executable, "-c", "import time; time.sleep(0.2)"],
                          capture_output=True, text=True, env=child_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "summary.json").read_text())["batch_size"] is None
    report = make_report(tmp_path)
    with open(report / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["job"] == "run" and rows[0]["batch_size"] == ""
    text = (report / "README.md").read_text()
    assert "| run | None | None | host |" in text and "Without a batch size" in text


OPS = [["name", "device", "calls", "total_s", "share_of_step_time", "power_w_gpu0", "energy_j_gpu0", "energy_j",
        "cpu_util_pct", "gpu_util_pct"],
       ["volta_sgemm_128x64_nn", "cuda", 40, 0.020, 0.4, 250.0, 5.0, 5.0, "", 95.0],
       ["void at::native::vectorized_elementwise_kernel", "cuda", 80, 0.010, 0.2, 240.0, 2.4, 2.4, "", 90.0],
       ["aten::conv2d", "cpu", 40, 0.015, 0.3, "", "", "", 60.0, ""],  # host ops: time only on a GPU
       ["aten::addmm", "cpu", 40, 0.005, 0.1, "", "", "", 55.0, ""],
       ["[no op]", "", 0, 0.002, 0.04, 100.0, 0.2, 0.2, "", ""]]


def test_profile_figure_shows_kernel_energy_beside_host_rows(tmp_path, monkeypatch):
    """Issue 8 item 12: on a GPU the kernel rows have energy, the host rows do not: energy was measured."""
    from mtbench.report import figures as report

    job = tmp_path / "job"
    job.mkdir()
    (job / "ops.csv").write_text("\n".join(",".join(str(v) for v in row) for row in OPS) + "\n")
    said = []
    name = report.fig_profile({"_dir": "job", "model": "resnet50", "batch_size": 8, "profiled": True}, tmp_path,
                              tmp_path, not_measured=said)
    assert name and (tmp_path / name).stat().st_size > 10_000
    assert said == []  # energy measured: both panels
    # and where no row has energy (no power sensor), the time panel alone, the energy listed as not measured
    (job / "ops.csv").write_text("\n".join(",".join("" if i in (5, 6, 7) and k else str(v) for i, v in enumerate(row))
                                           for k, row in enumerate(OPS)) + "\n")
    report.fig_profile({"_dir": "job", "model": "resnet50", "batch_size": 8, "profiled": True,
                        "unavailable": {"energy_j": "no sensor in use gives it"}}, tmp_path, tmp_path,
                       not_measured=said)
    assert said == [("energy per operation (job)", "no sensor in use gives it")]


@pytest.mark.parametrize("plant", ["fifo", "total_s=abc", "no total_s"])
def test_a_planted_or_malformed_ops_csv_is_left_out_with_the_reason(tmp_path, plant):
    """Issue 51 items 3 and 10: a FIFO at ops.csv used to hang `mtbench report` for ever (only exists() was asked);
    a total_s that is not a number, or no such column, ended it in a traceback. Now the figure is left out and the
    report says why."""
    import os

    from mtbench.report import figures as report

    job = tmp_path / "job"
    job.mkdir()
    rows = [list(r) for r in OPS]
    if plant == "fifo":
        os.mkfifo(job / "ops.csv")
    else:
        if plant == "total_s=abc":
            rows[1][3] = "abc"
        else:
            rows = [r[:3] + r[4:] for r in rows]
        (job / "ops.csv").write_text("\n".join(",".join(str(v) for v in row) for row in rows) + "\n")
    said = []
    assert report.fig_profile({"_dir": "job", "model": "resnet50", "batch_size": 8, "profiled": True}, tmp_path,
                              tmp_path, not_measured=said) is None
    assert len(said) == 1 and said[0][0] == "operations (job)", said
    assert ("not a regular file" in said[0][1]) if plant == "fifo" else ("is not an ops.csv mtbench wrote" in said[0][1])
