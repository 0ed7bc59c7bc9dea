"""The `logger` group (issue 24): csv, tensorboard, mlflow and wandb, each read back with the tool's own reader
(TensorBoard's EventAccumulator, mlflow.get_run on the file store, `wandb leet inspect`), and a logger that fails is
one warning, never a failed job."""
from __future__ import annotations

import csv
import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtbench.commands.cli import main
from mtbench.job.run import run_job
from mtbench.results import loggers
from tests.conftest import compose_cfg
from tests.helpers.env import child_env

CHILD = """import json, os, sys
from pathlib import Path
from mtbench.results import loggers
cfg, folder = json.loads(sys.argv[1]), Path(sys.argv[2])
returned = loggers.log_job(cfg, folder, json.loads((folder / "summary.json").read_text()))
print(json.dumps({"returned": returned, "opt_in_left": "MLFLOW_ALLOW_FILE_STORE" in os.environ}))
"""


def _log_in_child(cfg: dict, folder: Path, cwd=None) -> dict:
    """The logger as a job runs it: in the job's own process (here a child), so that the tracker's threads (wandb's
    service manager, OpenTelemetry exporters) end with that process and do not linger in the test process, where
    they took the GIL from later timing tests (test_telemetry's 5 ms sampler)."""
    env = child_env()
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg), str(folder)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    """One real job (a warm-up step and 3 measured ones) run with logger=csv: the job itself calls the logger."""
    out = tmp_path_factory.mktemp("logged") / "job"
    run_job(compose_cfg(["model=squeezenet", "batch=1", "warmup=1", "steps=3", "logger=csv"]), out)
    return out


@pytest.fixture
def copy_of(job, tmp_path):
    """A copy of the job's folder, for a logger to write into."""
    target = tmp_path / "12-00-00-squeezenet-b1"
    shutil.copytree(job, target)
    return target


def _steps(out: Path):
    with open(out / "steps.csv", newline="") as f:
        return list(csv.DictReader(f))


def _summary(out: Path):
    return json.loads((out / "summary.json").read_text())


def test_csv_is_tidy_long_form_one_row_per_step_and_metric(job):
    with open(job / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["step", "warmup", "metric", "value"]
    steps = _steps(job)
    durations = {(r["step"], r["warmup"]): float(r["value"]) for r in rows if r["metric"] == "duration_s"}
    assert durations == {(s["index"], s["warmup"]): pytest.approx(float(s["duration_s"])) for s in steps}
    assert [s["warmup"] for s in steps] == ["1", "0", "0", "0"]
    metrics = {r["metric"] for r in rows}
    assert {"duration_s", "cpu_util_pct", "process_cpu_pct", "loss", "mem_rss_bytes"} <= metrics
    assert "gpu_util_pct" not in metrics and "power_w" not in metrics  # not measured on a CPU: absent, never 0
    assert all(r["value"] != "" for r in rows)
    rss = [r["value"] for r in rows if r["metric"] == "mem_rss_bytes"]
    assert all(v.isdigit() for v in rss)  # bytes stay whole numbers


def test_tensorboard_read_back_with_its_event_accumulator(copy_of):
    pytest.importorskip("tensorboard", reason="logger=tensorboard needs the tensorboard package")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    with gzip.open(copy_of / "trace.json.gz", "wt") as f:  # as profile=true leaves it (job/profile.py)
        json.dump({"traceEvents": []}, f)
    assert loggers.log_job({"logger": {"name": "tensorboard", "save_dir": None}}, copy_of, _summary(copy_of)) is None
    events = EventAccumulator(str(copy_of / "tensorboard"))
    events.Reload()
    steps = _steps(copy_of)
    measured = events.Scalars("step/duration_s")
    assert [e.step for e in measured] == [int(s["index"]) for s in steps if s["warmup"] == "0"]
    assert [e.value for e in measured] == pytest.approx([float(s["duration_s"]) for s in steps if s["warmup"] == "0"],
                                                        rel=1e-6)
    assert [e.step for e in events.Scalars("warmup/duration_s")] == [0]
    assert {"step/cpu_util_pct", "step/mem_rss_bytes", "summary/step_time_s.median"} <= set(events.Tags()["scalars"])
    assert events.Scalars("summary/step_time_s.median")[0].value == \
        pytest.approx(_summary(copy_of)["step_time_s"]["median"], rel=1e-6)
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["batch"].number_value == 1 and start.hparams["model.name"].string_value == "squeezenet"
    traces = list((copy_of / "tensorboard" / "plugins" / "profile").glob("*/*.pt.trace.json.gz"))
    assert len(traces) == 1 and traces[0].read_bytes() == (copy_of / "trace.json.gz").read_bytes()


def test_tensorboard_in_a_folder_shared_by_jobs(copy_of, tmp_path):
    pytest.importorskip("tensorboard", reason="logger=tensorboard needs the tensorboard package")
    shared = tmp_path / "tb"
    loggers.log_job({"logger": {"name": "tensorboard", "save_dir": str(shared)}}, copy_of, _summary(copy_of))
    assert list((shared / copy_of.name).glob("events.out.tfevents.*")) and not (copy_of / "tensorboard").exists()


def _mlflow_runs(uri: str):
    import mlflow

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # mlflow 3.x's file store is read on this opt-in too
    try:
        mlflow.set_tracking_uri(uri)
        return [mlflow.get_run(r.info.run_id)
                for r in mlflow.search_runs(experiment_names=["mtbench"], output_format="list")]
    finally:
        os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)


@pytest.mark.slow
def test_mlflow_read_back_from_its_file_store(copy_of, tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="logger=mlflow needs mlflow-skinny (pip install 'mtbench[mlflow]')")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.chdir(tmp_path)  # the default store: ./mlruns, as MLflow's own default folder
    summary = _summary(copy_of)
    got = _log_in_child({"logger": {"name": "mlflow", "tracking_uri": None, "experiment_name": "mtbench"}},
                        copy_of, cwd=tmp_path)
    assert got == {"returned": None, "opt_in_left": False}  # the opt-in is the logger's own, not left behind
    uri = (tmp_path / "mlruns").as_uri()
    [run] = _mlflow_runs(uri)
    assert run.info.status == "FINISHED" and run.info.run_name == copy_of.name
    assert run.data.params["batch"] == "1" and run.data.params["model.name"] == "squeezenet"
    assert run.data.params["memory.budget_gb"] == "null"
    assert run.data.tags["mtbench.version"] == summary["mtbench_version"]
    assert run.data.metrics["summary/step_time_s.median"] == pytest.approx(summary["step_time_s"]["median"])
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    client = MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(run.info.run_id, "step/duration_s")
    steps = [s for s in _steps(copy_of) if s["warmup"] == "0"]
    assert sorted((m.step, m.value) for m in history) == \
        [(int(s["index"]), pytest.approx(float(s["duration_s"]))) for s in steps]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "steps.csv", "samples.csv", "metrics.csv"} <= artifacts


@pytest.mark.slow
def test_wandb_offline_read_back_with_wandbs_own_reader(copy_of, monkeypatch):
    pytest.importorskip("wandb", reason="logger=wandb needs wandb (pip install 'mtbench[wandb]')")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    summary = _summary(copy_of)
    got = _log_in_child({"logger": {"name": "wandb", "mode": "offline", "project": "mtbench", "entity": None,
                                    "save_dir": None}}, copy_of)
    assert got["returned"] is None
    [run_dir] = (copy_of / "wandb").glob("offline-run-*")
    wandb_cli = [sys.executable, "-c", "from wandb.cli.cli import cli; cli()", "leet", "inspect", "--json"]
    got = subprocess.run(wandb_cli + ["--summary", str(run_dir)], capture_output=True, text=True, timeout=120)
    if got.returncode != 0:
        pytest.skip(f"this wandb has no `wandb leet inspect` reader: {got.stderr.strip()[-200:]}")
    state = json.loads(got.stdout)
    assert state["state"] == "finished" and state["name"] == copy_of.name and state["project"] == "mtbench"
    assert state["config"]["batch"] == 1 and state["config"]["model"]["name"] == "squeezenet"
    assert state["summary"]["success"] is True
    assert state["summary"]["summary/step_time_s.median"] == pytest.approx(summary["step_time_s"]["median"])
    records = subprocess.run(wandb_cli + [str(run_dir)], capture_output=True, text=True, timeout=120).stdout
    history = [json.loads(line)["history"] for line in records.splitlines() if '"type":"history"' in line]
    logged = [(h["step"].get("num", 0), h["item"].get("step/duration_s")) for h in history]
    steps = [s for s in _steps(copy_of) if s["warmup"] == "0"]
    assert [(i, v) for i, v in logged if v is not None] == \
        [(int(s["index"]), pytest.approx(float(s["duration_s"]))) for s in steps]


def test_a_logger_that_fails_is_one_warning_and_the_job_stands(tmp_path, capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "mlflow" or m.startswith("mlflow.")] + ["mlflow"]:
        monkeypatch.setitem(sys.modules, name, None)  # mlflow not installed: `import mlflow...` raises ImportError
    monkeypatch.chdir(tmp_path)  # were it installed after all, its default store would land here
    out = tmp_path / "job"
    summary = run_job(compose_cfg(["model=squeezenet", "batch=1", "logger=mlflow"]), out)
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mtbench:")]
    assert err == [f"mtbench: warning: logger=mlflow could not log this job (RuntimeError: the mlflow-skinny package is "
                   f"not installed (pip install 'mtbench[mlflow]' adds it)); its results are in {out}"]
    assert summary["success"] and _summary(out)["success"] and (out / "steps.csv").is_file()


def test_a_broken_store_is_one_warning(copy_of, tmp_path, capsys):
    pytest.importorskip("mlflow", reason="logger=mlflow needs mlflow-skinny")
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the store's folder would be\n")
    line = loggers.log_job({"logger": {"name": "mlflow", "tracking_uri": str(blocker / "mlruns")}}, copy_of,
                           _summary(copy_of))
    assert line is not None and line.startswith("logger=mlflow could not log this job (")
    assert capsys.readouterr().err.count("mtbench: warning:") == 1


def test_an_unknown_logger_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["logger=neptune"])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1
    assert err[0] == "mtbench: error: logger='neptune' is not known; allowed: csv, mlflow, none, tensorboard, wandb"


SILENT_CHILD = """
import json, sys, time
from pathlib import Path
from mtbench.results import logger_backends, loggers
# the bounds as mtbench sets them, shortened so that the test takes seconds: one try of 1 s
logger_backends.MLFLOW_HTTP.update(MLFLOW_HTTP_REQUEST_TIMEOUT="1", MLFLOW_HTTP_REQUEST_MAX_RETRIES="0",
                                   MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR="0")
cfg, folder = json.loads(sys.argv[1]), Path(sys.argv[2])
began = time.monotonic()
returned = loggers.log_job(cfg, folder, json.loads((folder / "summary.json").read_text()))
print(json.dumps({"returned": returned, "seconds": time.monotonic() - began}))
"""


def test_a_tracking_server_that_never_answers_holds_the_job_seconds_not_minutes(copy_of):
    """Issue 51 item 1: a listener that accepts and never answers held the job ~16 minutes (MLflow's 120 s x 7
    retries). Each request is bounded (MLFLOW_HTTP, unless the user set MLflow's own): one warning, the files stand."""
    pytest.importorskip("mlflow", reason="logger=mlflow needs mlflow-skinny")
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel completes each handshake; nothing ever answers
        port = silent.getsockname()[1]
        env = child_env({k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP")})
        cfg = {"logger": {"name": "mlflow", "tracking_uri": f"http://127.0.0.1:{port}"}}
        proc = subprocess.run([sys.executable, "-c", SILENT_CHILD, json.dumps(cfg), str(copy_of)], env=env,
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["returned"].startswith("logger=mlflow could not log this job (") and result["seconds"] < 30, result
    assert _summary(copy_of)["success"]


def test_the_logger_runs_after_the_device_lock_and_outside_the_signals_deferral(tmp_path, monkeypatch):
    """Issue 51 item 1: the logger ran inside the device lock and the deferral of SIGTERM, so a slow one held every
    other user of the board and a SIGTERM did nothing."""
    import fcntl
    import signal

    from mtbench.job import run as run_module

    seen = {}

    def log_job(cfg, out_dir, summary):
        fd = os.open(tmp_path / "locks" / "mtbench-cpu.lock", os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError while the job holds it
            seen["lock_free"] = True
        finally:
            os.close(fd)
        seen["deferred"] = "stop_signals_deferred" in getattr(signal.getsignal(signal.SIGTERM), "__qualname__", "")
        seen["summary"] = summary["success"]

    monkeypatch.setattr(run_module.loggers, "log_job", log_job)
    (tmp_path / "locks").mkdir()
    run_job(compose_cfg(["model=squeezenet", "batch=1", "steps=1", "memory.breakdown=false",
                         f"lock_dir={tmp_path / 'locks'}", "logger=csv"]), tmp_path / "job")
    assert seen == {"lock_free": True, "deferred": False, "summary": True}
