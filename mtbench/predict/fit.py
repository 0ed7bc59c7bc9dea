"""`mtbench calibrate DIR`: trace every job of a sweep, fit the time model and the runtime memory, store them."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from mtbench.errors import UsageError
from mtbench.results.reader import UnreadableSummary, checked, read_summary_file
from mtbench.predict import calibration, opcost, profiled
from mtbench.predict.calibration import Calibration
from mtbench.predict.trace import transient_bytes


def read_summaries(folder: Path) -> List[Dict[str, Any]]:
    """Successful jobs' summary.json under `folder` (a sweep or one run), in a stable order."""
    if not folder.is_dir():
        raise UsageError(f"{folder} is not a folder; allowed: a run or sweep folder holding summary.json files")
    out = []
    for path in sorted(folder.rglob("summary.json")):
        try:
            s = checked(read_summary_file(path, require_schema=False))  # as before: no schema key needed
        except UnreadableSummary:
            continue  # not a result to fit
        if s.get("success") and (s.get("step_time_s") or {}).get("median"):
            s["_path"] = str(path)
            out.append(s)
    if not out:
        raise UsageError(f"{folder} holds no summary.json of a successful job; run a sweep there first")
    return out


def measured_training_bytes(s: Dict[str, Any]) -> Optional[int]:
    """A job's training memory as a budget compares it and the predictor predicts it: on CPU the training memory
    less the runtime's own memory before the model was built (mem_training_bytes - budget_runtime_bytes,
    device/budget.py), in older summaries the resident peak less the resident memory then (mem_peak_bytes -
    mem_runtime_bytes, which also counts file-backed pages and glibc's holes); on CUDA the allocator's peak. None
    where the summary lacks it."""
    peak = s.get("mem_peak_bytes")
    if peak is None:
        return None
    if s.get("mem_peak_source") == "cuda_allocator":
        return int(peak)
    training, runtime = s.get("mem_training_bytes"), s.get("budget_runtime_bytes")
    if s.get("mem_training_source") == "rss_hwm_less_file" and training is not None and runtime is not None:
        return int(training) - int(runtime)
    before = s.get("mem_runtime_bytes")
    if s.get("mem_peak_source") != "process_rss" or before is None:
        return None
    return int(peak) - int(before)


def calibrate(folder: Path, target: Optional[str] = None, out: Optional[str] = None,
              summaries: Optional[List[Dict[str, Any]]] = None,
              overrides: Tuple[str, ...] = (), predictor: Any = None,
              time_stat: str = "median", profile: bool = False) -> Tuple[Calibration, Path, List[str]]:
    """Fit and store the calibration of the sweep in `folder` (or of the given summaries).

    Each job is traced as `model=<its model> batch=<its batch>` plus `overrides` (the config overrides the
    sweep ran with, other than model and batch). A given `predictor` (its traces cached) is used as is.
    `time_stat` is the step-time statistic fitted: "median" (the summary's headline) or "min" (the fastest
    measured step: less of what other processes on a shared machine add). With `profile`, a job without an
    ops.csv is run again with profile=true (into its folder's `profiled/`) so that its per-op times are fitted."""
    if time_stat not in ("median", "min"):
        raise UsageError(f"time_stat={time_stat!r} is not known; allowed: median, min")
    from mtbench.predict.predictor import Predictor

    runs = summaries if summaries is not None else read_summaries(folder)
    types = sorted({str(s.get("device", "cpu")).split(":")[0] for s in runs})
    if len(types) != 1:
        raise UsageError(f"{folder} mixes devices {', '.join(types)}; calibrate one device's sweep at a time")
    device = types[0]
    targets = sorted({str(s.get("target") or "none") for s in runs})
    if target is None:
        if len(targets) != 1:
            raise UsageError(f"{folder} mixes targets {', '.join(targets)}; say which with target=T")
        target = targets[0]
    if predictor is None:
        predictor = Predictor(target_name=target, device=device, overrides=tuple(overrides), stored_calibration=False)
    predictor.calibration = None  # fit from the traces alone
    t = predictor.target
    scaled = device == "cuda" and t.peak_fp32_flops is not None and t.dram_bandwidth_bytes_per_s is not None
    x, y, residuals, used, report = [], [], [], [], []
    mem_x, mem_total = [], []
    op_rows, op_y, op_w, op_totals, op_profiled = [], [], [], [], 0
    for s in runs:
        model, batch = str(s["model"]), int(s["batch_size"])
        try:
            p = predictor.predict(model, batch, timed=False)
            timed = predictor.trace(model, batch, time_stat)[0]  # a padded job's: that statistic's batch
        except Exception as exc:  # a model the predictor cannot trace: calibrate on the others
            report.append(f"skipped {model} b{batch}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            continue
        # the step time's features from the trace a prediction times (Predictor.predict), the memory's from p's
        x.append(calibration.time_features(timed.flops, timed.bytes_moved, timed.ops,
                                           t.peak_fp32_flops if scaled else None,
                                           t.dram_bandwidth_bytes_per_s if scaled else None))
        y.append(float(s["step_time_s"][time_stat]))
        trace = predictor.trace(model, batch)[0]  # the one predict traced (cached)
        classes = timed.op_classes
        measured = measured_training_bytes(s)
        if measured is not None:  # less what the prediction adds beside the fit: the workload's arrays
            residuals.append(measured - p.tensors_bytes - predictor.held_outside(trace)[0])
            conv_w = trace.op_classes.get("conv", {}).get("weight_bytes", 0.0)
            mem_x.append(calibration.runtime_features(p.ops, transient_bytes(p.breakdown_bytes), conv_w))
            mem_total.append(measured)
        used.append(f"{model} b{batch}")
        step_s = profiled.step_seconds(s, time_stat)
        op_rows.append(opcost.step_features(classes))
        op_y.append(step_s)
        op_w.append(1.0 / step_s)
        op_totals.append(len(op_rows) - 1)
        if profile and profiled.ops_file(s) is None:
            profiled.run_profiled(s, overrides)
        per_class = profiled.class_seconds(s, time_stat)
        if per_class is not None:  # each class's measured time is a row of its own
            op_profiled += 1
            for cls, seconds in per_class.items():
                op_rows.append(opcost.class_features(classes, cls))
                op_y.append(seconds)
                op_w.append(1.0 / step_s)
    if not used:
        raise UsageError(f"no job of {folder} could be traced; see the lines above")
    xa, ya = np.array(x), np.array(y)
    coef = calibration.fit_nonnegative(xa, ya) if len(used) >= 2 else None
    fit_mape = calibration.mape_pct(xa @ coef, ya) if coef is not None else None
    op_coef = opcost.fit(op_rows, op_y, op_w) if len(used) >= 2 else None
    op_mape = None
    if op_coef is not None:
        rows = np.array([op_rows[i] for i in op_totals])
        op_mape = calibration.mape_pct(rows @ op_coef, [op_y[i] for i in op_totals])
    names = {str(s.get("env", {}).get("device_name")) for s in runs}
    cal = Calibration(
        key=calibration.calibration_key(target, device), target=target, device_type=device,
        device_name=", ".join(sorted(names)), source=str(folder), runs=len(used),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        time_coef=None if coef is None else [float(c) for c in coef], time_scaled=scaled,
        time_fit_mape_pct=fit_mape, runs_used=used, time_stat=time_stat,
        op_coef=None if op_coef is None else [float(c) for c in op_coef], op_features=list(opcost.FEATURES),
        op_fit_mape_pct=op_mape, op_profiled_runs=op_profiled, cache_bytes=int(getattr(predictor, "cache_bytes", 0)),
    )
    if len(residuals) >= 4:  # a constant, per op, per transient byte, per conv weight byte: relative error, all >= 0
        c = calibration.fit_nonnegative(np.array(mem_x), np.array(residuals, float),
                                        scale=np.array(mem_total, float))
        cal.non_tensor_bytes = int(c[0])
        cal.non_tensor_per_op_bytes, cal.non_tensor_per_transient_byte = float(c[1]), float(c[2])
        cal.non_tensor_per_conv_weight_byte = float(c[3])
    elif residuals:
        cal.non_tensor_bytes = max(0, int(np.median(residuals)))  # memory outside tensors is never below none
    if residuals:
        cal.runtime_spread_bytes = [int(min(residuals)), int(max(residuals))]
        cal.non_tensor_note = ("fitted to measured training memory less traced tensors: " +
                            ("libraries' pages, oneDNN primitives and scratch, allocator arenas" if device == "cpu"
                             else "allocations outside the traced ops (cuDNN workspace)"))
    else:
        cal.non_tensor_note = "not fitted: the summaries lack the memory before the model was built (mem_runtime_bytes)"
    report.append(f"{len(used)} runs of {cal.device_name} ({device}, target {target})")
    if coef is not None:
        terms = ", ".join(f"{n}={c:.3g}" for n, c in zip(calibration.TIME_FEATURES, coef))
        report.append(f"time: step_s = {terms}; fit MAPE {fit_mape:.1f} %")
        eff = cal.efficiencies()
        if scaled:
            report.append(f"efficiency: {eff['flops']} of peak FLOP/s, {eff['bandwidth']} of DRAM bandwidth")
    if op_coef is not None:
        report.append(f"time per op class ({op_profiled} of {len(used)} runs with per-op times): "
                      + opcost.describe(op_coef) + f"; fit MAPE {op_mape:.1f} %")
    if cal.non_tensor_bytes is not None:
        lo, hi = (v / 2**20 for v in cal.runtime_spread_bytes)
        report.append(f"runtime memory: {cal.non_tensor_bytes / 2**20:.1f} MiB + {cal.non_tensor_per_op_bytes / 1024:.1f} "
                      f"KiB per op + {cal.non_tensor_per_transient_byte:.3f} per transient tensor byte + "
                      f"{cal.non_tensor_per_conv_weight_byte:.3f} per convolution weight byte (measured less "
                      f"tensors: {lo:.1f} to {hi:.1f} MiB)")
    path = calibration.save(cal, Path(out) if out else None)
    return cal, path, report


def split_by_model(runs: List[Dict[str, Any]], held_out: Sequence[str]) -> Tuple[List[Dict[str, Any]],
                                                                                  List[Dict[str, Any]]]:
    """(calibration runs, evaluation runs): the runs of models in `held_out` are evaluated, every other model's
    runs calibrate; no model is on both sides (different models, not just different batches)."""
    held = set(held_out)
    unknown = held - {str(s["model"]) for s in runs}
    if unknown:
        raise UsageError(f"held-out model(s) {', '.join(sorted(unknown))} have no run; allowed: models of the sweep")
    fit = [s for s in runs if str(s["model"]) not in held]
    test = [s for s in runs if str(s["model"]) in held]
    if not fit:
        raise UsageError("every model of the sweep is held out; keep at least one to calibrate on")
    return fit, test
