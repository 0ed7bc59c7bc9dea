"""The loggers that hand a job to a tool of its own: TensorBoard, MLflow (extra `mlflow`) and W&B (extra `wandb`).

Each takes (settings, job folder, summary, steps) from `loggers.log_job`, which turns any error here into one
warning. Each tool's package is imported here only, when its logger is chosen.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import stat
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping

from mtbench.regular_files import GIB, read_regular
from mtbench.results.files import atomic_write_bytes
from mtbench.results.logger_rows import StepRow, flat_config, run_name, summary_metrics

MLFLOW_BATCH = {"metrics": 1000, "params": 100}  # MLflow's log_batch limits per call
MLFLOW_PARAM_CHARS = 6000  # MLflow's limit on a param's value (its key: 250)


def _needs(package: str, extra: str) -> RuntimeError:
    return RuntimeError(f"the {package} package is not installed (pip install 'mtbench[{extra}]' adds it)")


def _tag(warmup: bool, metric: str) -> str:
    """A per-step figure's name: step/<metric> for measured steps, warmup/<metric> for warm-up steps."""
    return f"{'warmup' if warmup else 'step'}/{metric}"


def _tags(summary: Mapping[str, Any], out_dir: Path) -> Dict[str, str]:
    git = summary.get("git") or {}
    failure = summary.get("failure") or {}
    tags = {"mtbench.version": summary.get("mtbench_version"), "mtbench.job_dir": str(out_dir),
            "mtbench.success": summary.get("success"), "mtbench.failure": failure.get("kind"),
            "mtbench.noisy": (summary.get("noise") or {}).get("noisy"), "git.commit": git.get("commit"),
            "git.dirty": git.get("dirty"), "model": summary.get("model"), "batch_size": summary.get("batch_size"),
            "device": summary.get("device")}
    return {k: str(v) for k, v in tags.items() if v is not None}


# ---------------------------------------------------------------------------------------------------------
# TensorBoard: per-step scalars, the summary as hparams (and as text), the profiler's trace for its profile plugin

def tensorboard(settings: Mapping[str, Any], out_dir: Path, summary: Mapping[str, Any], steps: List[StepRow]) -> None:
    try:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams
    except ImportError:
        raise _needs("tensorboard", "test") from None
    log_dir = Path(settings["save_dir"]) / run_name(out_dir) if settings.get("save_dir") else out_dir / "tensorboard"
    writer = SummaryWriter(log_dir=str(log_dir))
    try:
        for index, warmup, values in steps:
            for metric, value in values.items():
                writer.add_scalar(_tag(warmup, metric), value, index)
        figures = {f"summary/{k}": v for k, v in summary_metrics(summary).items()}
        config = {k: ("null" if v is None else v) for k, v in flat_config(summary).items()}
        # the hparams plugin's three records, in this run's own event file (add_hparams would start a second run)
        for record in hparams(config, figures):
            writer._get_file_writer().add_summary(record)
        for name, value in figures.items():
            writer.add_scalar(name, value, 0)
        writer.add_text("summary.json", "```\n" + json.dumps(summary, indent=2, default=str) + "\n```", 0)
    finally:
        writer.close()
    trace = out_dir / "trace.json.gz"
    if trace.is_file():  # profile=true: where TensorBoard's profile plugins look for a PyTorch trace
        plugin = log_dir / "plugins" / "profile" / time.strftime("%Y_%m_%d_%H_%M_%S")
        plugin.mkdir(parents=True, exist_ok=True)
        # read as a regular file of at most 1 GiB (never through a link), written as every result file is
        atomic_write_bytes(plugin / f"{platform.node() or 'host'}.pt.trace.json.gz", read_regular(str(trace), GIB))


def regular_files_under(folder: Path) -> Iterator[tuple]:
    """(path, its folder relative to `folder` or None) of every regular file under `folder`: a link (to a file or
    a folder, which another user may have planted in the job's folder) is never followed, nor uploaded."""
    for root, dirs, names in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(root, d)))
        rel = os.path.relpath(root, folder)
        for name in sorted(names):
            path = Path(root) / name
            if stat.S_ISREG(os.lstat(path).st_mode):
                yield path, (None if rel == "." else rel)


# ---------------------------------------------------------------------------------------------------------
# MLflow: one run per job; params = the config, metrics per step and the summary's, artifacts = the job's folder

# a tracking server that accepts and never answers held a job ~16 minutes (MLflow's own 120 s x 7 retries): each
# request bounded here, unless the user set MLflow's variable
MLFLOW_HTTP = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
               "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}


@contextlib.contextmanager
def _file_store_allowed(uri: str) -> Iterator[None]:
    """MLflow 3.x refuses its file store unless MLFLOW_ALLOW_FILE_STORE=true (mtbench's default is that store); and
    every HTTP request bounded in time (MLFLOW_HTTP, where the user set none of MLflow's own)."""
    wanted = dict({k: v for k, v in MLFLOW_HTTP.items() if k not in os.environ},
                  **({"MLFLOW_ALLOW_FILE_STORE": "true"} if uri.startswith("file:") else {}))
    before = {k: os.environ.get(k) for k in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def mlflow_uri(settings: Mapping[str, Any]) -> str:
    """logger.tracking_uri, else MLFLOW_TRACKING_URI, else a file store ./mlruns (a path is made a file: URI)."""
    uri = settings.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI") or "mlruns"
    return uri if ":" in uri.split("/")[0] else Path(uri).resolve().as_uri()


def mlflow(settings: Mapping[str, Any], out_dir: Path, summary: Mapping[str, Any], steps: List[StepRow]) -> None:
    try:
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise _needs("mlflow-skinny", "mlflow") from None
    uri = mlflow_uri(settings)
    with _file_store_allowed(uri):
        client = MlflowClient(tracking_uri=uri)
        name = str(settings.get("experiment_name") or "mtbench")
        experiment = client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
        run_id = client.create_run(experiment_id, run_name=run_name(out_dir), tags=_tags(summary, out_dir)).info.run_id
        status = "FAILED"
        try:
            now_ms = int(time.time() * 1000)
            params = [Param(k[:250], ("null" if v is None else str(v))[:MLFLOW_PARAM_CHARS])
                      for k, v in flat_config(summary).items()]
            metrics = [Metric(_tag(warmup, m), v, now_ms, index) for index, warmup, values in steps
                       for m, v in values.items()]
            metrics += [Metric(f"summary/{k}", v, now_ms, 0) for k, v in summary_metrics(summary).items()]
            for i in range(0, len(params), MLFLOW_BATCH["params"]):
                client.log_batch(run_id, params=params[i:i + MLFLOW_BATCH["params"]])
            for i in range(0, len(metrics), MLFLOW_BATCH["metrics"]):
                client.log_batch(run_id, metrics=metrics[i:i + MLFLOW_BATCH["metrics"]])
            store = Path(uri[len("file:"):]).resolve() if uri.startswith("file:") else None
            for path, folder in regular_files_under(out_dir):
                if store is not None and (path.resolve() == store or store in path.resolve().parents):
                    continue  # a store inside the job's folder is not copied into itself
                client.log_artifact(run_id, str(path), artifact_path=folder)
            status = "FINISHED" if summary.get("success") else "FAILED"
        finally:
            client.set_terminated(run_id, status)


# ---------------------------------------------------------------------------------------------------------
# Weights & Biases: offline by default (files under the job's folder; `wandb sync` uploads them later)

def wandb(settings: Mapping[str, Any], out_dir: Path, summary: Mapping[str, Any], steps: List[StepRow]) -> None:
    try:
        import wandb as wb
    except ImportError:
        raise _needs("wandb", "wandb") from None
    save_dir = Path(settings.get("save_dir") or out_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    run = wb.init(mode=str(settings.get("mode") or "offline"), project=str(settings.get("project") or "mtbench"),
                  entity=settings.get("entity"), dir=str(save_dir), name=run_name(out_dir),
                  config=summary.get("config") or {}, tags=[f"{k}={v}" for k, v in _tags(summary, out_dir).items()
                                                            if k in ("mtbench.version", "git.commit", "device")],
                  # mtbench measured the job; W&B's own system sampling and console capture would only add noise
                  settings=wb.Settings(silent=True, console="off", x_disable_stats=True, save_code=False))
    exit_code = 1
    try:
        for index, warmup, values in steps:
            run.log({_tag(warmup, m): v for m, v in values.items()}, step=index)
        run.summary.update({f"summary/{k}": v for k, v in summary_metrics(summary).items()})
        run.summary.update({"success": bool(summary.get("success")), "job_dir": str(out_dir)})
        exit_code = 0
    finally:
        run.finish(exit_code=exit_code)
