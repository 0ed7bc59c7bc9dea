"""`mtbench predict` (one job or `-m` lists, a table, predict.json / predict.csv) and `mtbench calibrate DIR`."""
from __future__ import annotations

import argparse
import csv
import gc
import io
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from mtbench.errors import UsageError
from mtbench.results.files import atomic_write

PREDICT_USAGE = ("mtbench predict model=NAME batch=N [target=T] [device=cpu|cuda|auto] [max_batch=true|false] "
                 "[calibration=FILE] [out=DIR] [other overrides]   (-m: comma lists of models and batches)")
CALIBRATE_USAGE = ("mtbench calibrate DIR [target=T] [out=FILE] [time_stat=median|min] [profile=true|false] "
                   "[overrides the sweep ran with, e.g. model.workload.seq_len=128]")
_OWN_KEYS = ("model", "batch", "target", "device", "max_batch", "calibration", "out", "time_stat")
CALIBRATE_KEYS = ("target", "out", "time_stat", "profile")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = PREDICT_USAGE
    parser.add_argument("-m", "--multirun", action="store_true", help="comma lists of models and batches")
    parser.add_argument("settings", nargs="*", metavar="key=value",
                        help=f"{', '.join(k + '=' for k in _OWN_KEYS)} and overrides of the config")


def split_settings(items: List[str], usage: str,
                   keys: Tuple[str, ...] = _OWN_KEYS) -> Tuple[Dict[str, str], List[str], List[str]]:
    """(our key=value settings, other overrides for the config, arguments that are not key=value)."""
    own, rest, positional = {}, [], []
    for arg in items:
        key, sep, value = arg.partition("=")
        if not sep:
            positional.append(arg)
        elif key in keys:
            own[key] = value
        else:
            rest.append(arg)
    return own, rest, positional


def _batches(text: str, sweep: bool) -> List[int]:
    from mtbench.config import positive_int

    values = text.split(",")
    if len(values) > 1 and not sweep:
        raise UsageError(f"batch={text!r} is a list; a list needs -m (mtbench predict -m ...)")
    return [positive_int("batch", v) for v in values]


def _bool(key: str, text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise UsageError(f"{key}={text!r} is not known; allowed: true, false")
    return text.lower() == "true"


def main_predict(argv: Optional[List[str]] = None) -> int:
    """`mtbench predict ...`; returns the exit status (0, or 2 after a one-line error)."""
    from mtbench.commands.registry import call

    return call("predict", argv)


def main_calibrate(argv: Optional[List[str]] = None) -> int:
    """`mtbench calibrate DIR ...`; returns the exit status (0, or 2 after a one-line error)."""
    from mtbench.commands.registry import call

    return call("calibrate", argv)


def run(args: argparse.Namespace) -> int:
    # the imports and the configuration make half a million objects that live as long as the command: the cyclic
    # collector, scanning them all each time they grow by a quarter, is left off until they are made and then
    # frozen (gc.freeze: never scanned again), which a forked tracer inherits without touching their pages
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _run(args)
    finally:
        gc.unfreeze()  # where the command ran inside another program (a test), its objects are collected again
        if enabled:
            gc.enable()


def _run(args: argparse.Namespace) -> int:
    from mtbench.predict import require_torch

    require_torch()
    sweep = args.multirun
    own, rest, positional = split_settings(args.settings, PREDICT_USAGE)
    if positional:
        raise UsageError(f"{positional[0]!r} is not key=value; usage: {PREDICT_USAGE}")
    if "model" not in own or "batch" not in own:
        raise UsageError(f"model= and batch= are required; usage: {PREDICT_USAGE}")
    models = own["model"].split(",")
    if len(models) > 1 and not sweep:
        raise UsageError(f"model={own['model']!r} is a list; a list needs -m (mtbench predict -m ...)")
    batches = _batches(own["batch"], sweep)
    want_max = _bool("max_batch", own.get("max_batch", "true"))
    from mtbench.config import group_options

    target = own.get("target", "none")
    if target not in group_options("target"):
        raise UsageError(f"target={target!r} is not known; allowed: {', '.join(group_options('target'))}")
    for m in models:
        if m not in group_options("model"):
            raise UsageError(f"model={m!r} is not known; allowed: {', '.join(group_options('model'))}")
    if own.get("calibration") and not Path(own["calibration"]).is_file():
        raise UsageError(f"calibration={own['calibration']!r} is not a file; allowed: a file `mtbench calibrate` "
                         f"wrote")
    from mtbench.campaign.folders import dated_dir, writable_folder
    from mtbench.predict.predictor import Predictor

    # the scheme of docs/results.md; refused before the traces where it cannot take the results
    out_dir = writable_folder(Path(own.get("out") or dated_dir("predict")), "out=")
    predictor = Predictor(target_name=target, device=own.get("device", "auto"), overrides=tuple(rest),
                          calibration_path=own.get("calibration"), first_model=models[0])
    from mtbench.predict.tracers import warm_imports

    warm_imports()  # what a trace imports on first use
    for model in models:
        predictor.prepare(model)  # its configs
    gc.freeze()
    gc.enable()  # the traces' own garbage (reference cycles among fake tensors) is collected as it comes
    beside = _tracers(predictor) if want_max else None
    try:
        rows = run_predictions(predictor, models, batches, want_max, beside)
    finally:
        if beside is not None:
            beside.close()
    print_table(rows, predictor)
    write(rows, out_dir)
    print(f"results in {out_dir} (predict.json, predict.csv)")
    return 0


def _tracers(predictor):
    """A tracer process beside this one for the max-batch searches (their rounds trace two batches), forked before
    this process traces (after the imports and the configs it needs); None where the target has no budget, one core
    is usable, or the tracer cannot run autograd (it ran in this process already) or was not ready within
    tracers.READY_TIMEOUT_S."""
    import os

    from mtbench.predict.tracers import TracerDied, Tracers

    if predictor.target.memory_budget_bytes is None or len(os.sched_getaffinity(0)) < 2:
        return None
    try:
        return Tracers(lambda: predictor, 1)
    except TracerDied:  # autograd ran here already (a caller's), or no answer in time: the searches trace here
        return None


def run_predictions(predictor, models: List[str], batches: List[int], want_max: bool, beside=None) -> list:
    """One row per model and batch (with a progress bar on a terminal: tracing a model takes seconds); `beside`:
    tracers.Tracers for the max-batch searches."""
    from mtbench.results.live import WorkProgress

    with WorkProgress("predicting", len(models) * len(batches)) as progress:
        return _run_predictions(predictor, models, batches, want_max, progress, beside)


def _run_predictions(predictor, models: List[str], batches: List[int], want_max: bool, progress,
                     beside=None) -> list:
    from mtbench.predict.predictor import failed

    rows = []
    for model in models:
        best = None
        for batch in batches:
            progress.item(f"{model} batch {batch}")
            try:
                row = predictor.predict(model, batch)
            except UsageError:
                raise
            except Exception as exc:  # one model the predictor cannot trace: its rows say why, the rest go on
                row = failed(model, batch, predictor.target.name, predictor.device, exc)
            rows.append(row)
        if want_max and predictor.target.memory_budget_bytes is not None and rows[-1].error is None:
            try:
                progress.note(f"{model}: the largest batch within the budget")
                anchor = max(r.batch_size for r in rows if r.model == model and r.error is None)
                best, note = predictor.max_batch(model, anchor, beside)
            except Exception as exc:
                best, note = None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            for row in rows:
                if row.model == model:
                    row.max_batch, row.max_batch_note = best, note
    return rows


def _mib(n) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.0f}"


def print_table(rows: list, predictor) -> None:
    from rich.table import Table

    from mtbench.results.console import console

    t = predictor.target
    title = (f"mtbench predict: target {t.name} ({predictor.device}"
             + (f", budget {_mib(t.memory_budget_bytes)} MiB" if t.memory_budget_bytes else "") + ")")
    table = Table(title=title)
    for col in ("model", "batch", "peak MiB", "tensors", "runtime", "params", "grads", "opt", "acts", "inputs",
                "other", "GFLOP/step", "step s", "fits", "max batch"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for r in rows:
        if r.error:
            table.add_row(r.model, str(r.batch_size), "[red]failed[/red]", *[""] * 12)
            continue
        b = r.breakdown_bytes
        table.add_row(
            r.model, str(r.batch_size), _mib(r.peak_bytes), _mib(r.tensors_bytes), _mib(r.non_tensor_bytes),
            _mib(b.get("parameters")), _mib(b.get("gradients")), _mib(b.get("optimizer_state")),
            _mib(b.get("activations")), _mib(b.get("inputs")), _mib(b.get("other")), f"{r.flops / 1e9:,.1f}",
            "n/a" if r.step_time_s is None else f"{r.step_time_s:.3g}{'' if r.calibrated else '*'}",
            "" if r.fits is None else ("yes" if r.fits else "[red]no[/red]"),
            "" if r.max_batch is None else str(r.max_batch))
    console.print(table)
    for r in rows:
        if r.error:
            console.print(f"[red]{r.model} batch {r.batch_size}[/red]: {r.error}", markup=True, highlight=False)
    ok = [r for r in rows if not r.error]
    if ok:
        r = ok[0]
        console.print(f"tensors: traced on {r.traced}" + ("; CUDA caching allocator modelled (512-byte blocks, "
                      "2/20 MiB segments): peak = reserved segments + runtime" if r.device == "cuda" else ""))
        console.print(f"runtime: {r.non_tensor_note}")
        console.print(f"step time: {r.time_note}" + ("" if r.calibrated else "  (* not calibrated)"))


CSV_COLUMNS = ("model", "batch_size", "target", "device", "peak_bytes", "tensors_bytes", "allocator_reserved_bytes",
               "non_tensor_bytes", "parameters", "gradients", "optimizer_state", "activations", "inputs", "other",
               "budget_bytes", "fits", "flops", "forward_flops", "bytes_moved", "ops", "roofline_s", "step_time_s",
               "calibrated", "max_batch", "traced", "error")


def write(rows: list, out_dir: Path) -> None:
    from mtbench.predict.predictor import dumps

    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / "predict.json", dumps(rows))
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(CSV_COLUMNS)
    for r in rows:
        d = r.to_dict()
        d.update(r.breakdown_bytes or {})
        w.writerow(["" if d.get(c) is None else d.get(c) for c in CSV_COLUMNS])
    atomic_write(out_dir / "predict.csv", buf.getvalue())
