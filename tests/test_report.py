"""`mtbench report` on a generated multirun folder with a failed job and a job without power."""
from __future__ import annotations

import csv
import json

import pytest

from mtbench.errors import UsageError
from mtbench.report import make_report
from mtbench.runner import run_job
from tests.conftest import compose_cfg, mtbench_cli
from tests.fake_sysfs import make_tx2
from tests.test_telemetry import TX2_POWER

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


def test_report_cli(sweep, tmp_path):
    proc = mtbench_cli("report", str(sweep))
    assert proc.returncode == 0, proc.stderr
    assert (sweep / "report" / "summary.csv").exists()
    bad = mtbench_cli("report", str(tmp_path / "nowhere"))
    assert bad.returncode == 2 and bad.stderr.strip().startswith("mtbench: error: report:")


def test_report_of_an_empty_folder(tmp_path):
    with pytest.raises(UsageError, match="no summary.json"):
        make_report(tmp_path)


def test_sweep_prints_progress_and_a_table(tmp_path):
    proc = mtbench_cli("-m", "model=squeezenet", "batch=2,4", "device=cpu", "warmup=0", "steps=1",
                       f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert "[job 1 of 2] model=squeezenet batch=2" in proc.stdout
    assert "[job 2 of 2] model=squeezenet batch=4" in proc.stdout
    assert f"sweep: {tmp_path}" in proc.stdout and "1-squeezenet-b4" in proc.stdout
    assert len(list(tmp_path.rglob("summary.json"))) == 2
    json.loads(next(tmp_path.rglob("summary.json")).read_text())
