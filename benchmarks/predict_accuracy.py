"""Predictor accuracy and cost on this machine, side by side with measurement (issue 10).

    python benchmarks/predict_accuracy.py [--sweep DIR] [--batches 2,8,32] [--models a,b,...] [--no-speed]
    python benchmarks/predict_accuracy.py --all-models   # every model at batch 8: how it traced, peak, FLOPs

1. Runs (or, with --sweep, reuses) a CPU sweep of the 12 CNNs at batch 2, 8, 32 (warm-up 1, 3 measured steps)
   through mtbench's runner, each job in a fresh process that also records its resident memory before the
   model was built. Run it under the heavy lock (about 25 minutes on 2 busy cores).
2. Traces every job on fake tensors, then splits the (model, batch) runs in two halves (alternating in
   (model, batch) order), calibrates on one (`mtbench calibrate`'s fit) and predicts the other.
3. Memory: predicted training memory (tensors + runtime) against the measured one (peak resident memory over
   the measured steps less the resident memory before the model was built); goal median error <= 5 %, worst
   <= 10 %. Time: mean absolute percentage error of the step time; goal <= 15 %.
4. Speed: BERT at batch 64 predicted in a fresh process: wall time (goal <= 10 s) and peak resident memory
   (goal <= 1 GB), also printed less the process's memory after importing torch (the predictor's own part).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CNNS = ("alexnet", "densenet100", "densenet40", "inceptionv1", "mobilenetv2", "resnet101", "resnet152", "resnet50",
        "squeezenet", "vgg16", "vgg19", "xception")

SPEED_CHILD = r"""
import resource, sys, time
import torch
from mtbench.device.peak import current_rss_bytes
base = current_rss_bytes()
t0 = time.monotonic()
from mtbench.predict.predictor import Predictor
p = Predictor(target_name="none", device="cpu").predict("bert", 64)
wall = time.monotonic() - t0
print(wall, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, base, p.tensors_bytes, p.flops)
"""


def run_job_child(model: str, batch: int, out_dir: str, steps: int = 3, profile: bool = True) -> None:
    """One job through mtbench's runner in this (fresh) process, as a sweep's job; the summary also gets the
    resident memory before the model was built (mem_runtime_bytes) where the runner does not record it."""
    from hydra import compose, initialize_config_dir

    from mtbench.config import conf_dir
    from mtbench.device.peak import release_memory
    from mtbench.device.peak import current_rss_bytes
    from mtbench.job.run import run_job

    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model={model}", f"batch={batch}", "device=cpu",
                                                        "warmup=1", f"steps={steps}", f"profile={str(profile).lower()}"])
    import torch

    release_memory(torch.device("cpu"))
    before = current_rss_bytes()
    summary = run_job(cfg, Path(out_dir))
    path = Path(out_dir) / "summary.json"
    if summary.get("mem_runtime_bytes") is None and path.is_file():
        data = json.loads(path.read_text())
        data["mem_runtime_bytes"] = before
        path.write_text(json.dumps(data, indent=2))
    print(f"{model} b{batch}: step {summary['step_time_s']['median']:.3f} s, peak {summary['mem_peak_bytes']} B, "
          f"before the model {before} B", flush=True)


def run_sweep(models, batches, folder: Path, steps: int = 3, profiled=()) -> None:
    """Each (model, batch) job in a fresh process (so that its memory before the model is its own), profiled
    where the model is in `profiled` (the calibration models: ops.csv holds the per-op times the time model is
    fitted on; their summaries' unprofiled reference steps are the step time); the held-out models run plain, so
    that no profiler's time or memory is in what the predictions are compared with."""
    for i, (model, batch) in enumerate((m, int(b)) for m in models for b in batches.split(",")):
        code = f"from benchmarks.predict_accuracy import run_job_child; run_job_child({model!r}, {batch}, " \
               f"{str(folder / f'{i}-{model}-b{batch}')!r}, steps={steps}, profile={model in profiled})"
        subprocess.run([sys.executable, "-c", code], check=False, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)})


def pct(pred: float, meas: float) -> float:
    return (pred - meas) / meas * 100.0


def all_models() -> None:
    """Every model of conf/model predicted at batch 8: how it was traced, its peak, FLOPs and the trace time."""
    from mtbench.config import group_options
    from mtbench.predict.predictor import Predictor

    for target in ("none", "tx2"):
        predictor = Predictor(target_name=target, device="cpu" if target == "none" else "cuda")
        for model in group_options("model"):
            try:
                p = predictor.predict(model, 8)
                print(f"{target:<5} {model:<12} peak {p.peak_bytes / 2**20:>8.1f} MiB  {p.flops / 1e9:>8.1f} GFLOP  "
                      f"trace {p.trace_s:>5.1f} s  {p.traced}", flush=True)
            except Exception as exc:
                print(f"{target:<5} {model:<12} FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:150]}",
                      flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", help="the sweep folder: reused where it holds summaries, else the sweep runs into it")
    ap.add_argument("--batches", default="2,8,32")
    ap.add_argument("--models", default=",".join(CNNS))
    ap.add_argument("--no-speed", action="store_true", help="skip the BERT speed check")
    ap.add_argument("--all-models", action="store_true",
                    help="only predict every model of conf/model at batch 8 for target none and tx2 (how each traced)")
    args = ap.parse_args()

    from mtbench.predict.calibration import load, mape_pct
    from mtbench.predict.fit import calibrate, measured_training_bytes, read_summaries
    from mtbench.predict.predictor import Predictor

    if args.all_models:
        return all_models()
    folder = Path(args.sweep) if args.sweep else Path(tempfile.mkdtemp(prefix="mtbench-predict-")) / "sweep"
    if not any(folder.rglob("summary.json")):
        run_sweep(args.models.split(","), args.batches, folder)
    runs = sorted(read_summaries(folder), key=lambda s: (s["model"], s["batch_size"]))
    runs = [s for s in runs if s["model"] in args.models.split(",")]
    predictor = Predictor(target_name="none", device="cpu", overrides=("warmup=1", "steps=3"))  # as the sweep ran
    t0 = time.monotonic()
    for s in runs:
        predictor.trace(s["model"], int(s["batch_size"]))
    trace_s = time.monotonic() - t0
    fit_half, test_half = runs[0::2], runs[1::2]
    with tempfile.TemporaryDirectory() as tmp:
        cal_path = Path(tmp) / "cal.json"
        cal, _, report = calibrate(folder, out=str(cal_path), summaries=fit_half, predictor=predictor)
        predictor.calibration = load(cal.key, cal_path)
    print(f"\ntraced {len(runs)} jobs in {trace_s:.0f} s; calibrated on {len(fit_half)}: " + "; ".join(report[-3:]))

    header = f"{'model':<12} {'batch':>5} {'half':>5} {'meas MiB':>9} {'pred MiB':>9} {'tensors':>8} {'err %':>7}" \
             f" {'meas s':>8} {'pred s':>8} {'err %':>7}"
    print("\n" + header + "\n" + "-" * len(header))
    mem_err, time_pred, time_meas, tensor_err, time_min, spread = [], [], [], [], [], []
    for s in runs:
        p = predictor.predict(s["model"], int(s["batch_size"]))
        meas_b = measured_training_bytes(s)
        meas_s = s["step_time_s"]["median"]
        half = "fit" if s in fit_half else "test"
        e_mem = pct(p.peak_bytes, meas_b) if meas_b else float("nan")
        e_time = pct(p.step_time_s, meas_s)
        if half == "test":
            mem_err.append(abs(e_mem))
            tensor_err.append(abs(pct(p.tensors_bytes, meas_b)))
            time_pred.append(p.step_time_s)
            time_meas.append(meas_s)
            time_min.append(s["step_time_s"]["min"])
            spread.append((s["step_time_s"]["max"] - s["step_time_s"]["min"]) / meas_s * 100)
        print(f"{s['model']:<12} {s['batch_size']:>5} {half:>5} {meas_b / 2**20:>9.1f} {p.peak_bytes / 2**20:>9.1f} "
              f"{p.tensors_bytes / 2**20:>8.1f} {e_mem:>+7.1f} {meas_s:>8.3f} {p.step_time_s:>8.3f} {e_time:>+7.1f}")
    print(f"\nmemory (test half, {len(mem_err)} runs): median |error| {statistics.median(mem_err):.1f} % (goal <= 5), "
          f"worst {max(mem_err):.1f} % (goal <= 10); tensors alone: median {statistics.median(tensor_err):.1f} %, "
          f"worst {max(tensor_err):.1f} %")
    print(f"runtime memory fitted on the other half: {cal.runtime_bytes / 2**20:.1f} MiB + "
          f"{cal.runtime_per_op_bytes / 1024:.1f} KiB per op + {cal.runtime_per_transient_byte:.3f} per transient "
          f"tensor byte (measured less tensors: {cal.runtime_spread_bytes[0] / 2**20:.1f} to "
          f"{cal.runtime_spread_bytes[1] / 2**20:.1f} MiB)")
    print(f"time (test half): MAPE {mape_pct(time_pred, time_meas):.1f} % (goal <= 15); the measured steps of one "
          f"job spread (max - min) / median {statistics.median(spread):.0f} % (median over jobs): this machine's noise")
    with tempfile.TemporaryDirectory() as tmp:  # the same, fitted to and compared with each job's fastest step
        cal_min, _, _ = calibrate(folder, out=str(Path(tmp) / "cal.json"), summaries=fit_half, predictor=predictor,
                                  time_stat="min")
        predictor.calibration = cal_min
        pred_min = [predictor.predict(s["model"], int(s["batch_size"])).step_time_s for s in test_half]
    print(f"time with time_stat=min (fit and compare the fastest step of each job): MAPE "
          f"{mape_pct(pred_min, time_min):.1f} %")
    steady = [i for i, s in enumerate(test_half) if s["step_time_s"]["max"] <= 1.2 * s["step_time_s"]["min"]]
    if steady:
        print(f"time on the {len(steady)} test jobs whose measured steps agree within 20 % (a quiet machine): "
              f"MAPE {mape_pct([time_pred[i] for i in steady], [time_meas[i] for i in steady]):.1f} % (median fit), "
              f"{mape_pct([pred_min[i] for i in steady], [time_min[i] for i in steady]):.1f} % (min fit)")

    if not args.no_speed:
        out = subprocess.run([sys.executable, "-c", SPEED_CHILD], capture_output=True, text=True, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
        if out.returncode != 0:
            print("speed: the BERT prediction failed:", out.stderr.strip().splitlines()[-1:])
        else:
            wall, maxrss, base, tensors, flops = out.stdout.split()[-5:]
            print(f"speed: BERT b64 predicted in {float(wall):.1f} s (goal <= 10); peak resident "
                  f"{int(maxrss) / 1e9:.2f} GB (goal <= 1), {(int(maxrss) - int(base)) / 1e9:.2f} GB over the "
                  f"process after importing torch; predicted tensors {int(tensors) / 2**30:.2f} GiB, "
                  f"{float(flops) / 1e12:.2f} TFLOP/step")


if __name__ == "__main__":
    main()
