"""Predictor accuracy and cost on this machine, side by side with measurement (issues 10, 21).

    python benchmarks/predict_accuracy.py [--sweep DIR] [--batches 2,8,32] [--batches-for MODEL=B,B,B]
        [--models a,b,...] [--held-out a,b,...] [--steps 5] [--passes N] [--no-speed]
        [--maxbatch [--maxbatch-repeats N]]
    python benchmarks/predict_accuracy.py --all-models   # every model at batch 8: how it traced, peak, FLOPs

Every model of conf/model, BERT at its own batches (about 35 minutes on 2 cores; a folder that holds some of the
jobs gets only the rest):

    python benchmarks/predict_accuracy.py --sweep DIR --batches-for bert=1,2,4 \
        --models alexnet,bert,bidaf,char_rnn,dcgan,densenet100,densenet40,dqn,inceptionv1,mobilenetv2,resnet101,\
resnet152,resnet50,seq2seq,squeezenet,vgg16,vgg19,xception \
        --held-out densenet40,mobilenetv2,resnet101,vgg19,xception,bidaf,dqn,seq2seq

Calibration and evaluation are disjoint by model: the --held-out models are only predicted, the sweep's other
models only calibrate (profiled jobs: their ops.csv gives the per-op times of the per-op-class time model).

1. Runs a CPU sweep (default: the 12 CNNs at batch 2, 8, 32; warm-up 1, --steps measured steps) through mtbench's
   runner, each job in a fresh process that also records its resident memory before the model was built; with
   --sweep, the jobs already in the folder are not run again. Run it alone on the machine (the 12 CNNs: about 25
   minutes on 2 cores).
2. Traces every job on fake tensors, calibrates on the calibration models' jobs (`mtbench calibrate`'s fit) and
   predicts the held-out ones.
3. Memory: predicted training memory (tensors + runtime) against the measured one (peak resident memory over
   the measured steps less the resident memory before the model was built); goal median error <= 3 %, worst
   <= 8 %. Time: mean absolute percentage error of the step time; goal <= 10 %. Beside each held-out job, and
   over the sweep, how far the machine's own speed moved (machine_reference, timed before and after each job): on
   a VM whose neighbours change its speed, a step-time error within that movement is the machine's, not the
   predictor's. With --passes N the sweep runs N times, one pass after the other (the later passes unprofiled,
   into DIR-pass2 ...), and each job's step time is the fastest pass's: a job a neighbour slowed down in one pass
   is measured again minutes later; each pass's own MAPE is printed beside.
4. Speed: BERT at batch 64 predicted in a fresh process: wall time (goal <= 10 s) and peak resident memory
   (goal <= 1 GB), also printed less the process's memory after importing torch (the predictor's own part); then
   the whole command as a user types it, `python -m mtbench predict model=bert batch=64 target=tx2`, twice, timed by
   GNU time (`/usr/bin/time`: its maximum resident is the command's largest process's, started from GNU time's small
   process, not from this one's; where GNU time is not installed, the line says so), and the largest sum of the PSS
   of its processes (the command forks a tracer process, whose pages are largely the command's), sampled.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CNNS = ("alexnet", "densenet100", "densenet40", "inceptionv1", "mobilenetv2", "resnet101", "resnet152", "resnet50",
        "squeezenet", "vgg16", "vgg19", "xception")

SPEED_CHILD = r"""
import sys, time
import torch
from mtbench.device.peak import current_rss_bytes, hwm_bytes, ru_maxrss_bytes
base = current_rss_bytes()
t0 = time.monotonic()
from mtbench.predict.predictor import Predictor
p = Predictor(target_name="none", device="cpu").predict("bert", 64)
wall = time.monotonic() - t0
# VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a child started from a large parent (vfork) reports
# the parent's size (1.79 GB measured beside 0.72 GB in this process's own memory)
peak = hwm_bytes() or ru_maxrss_bytes()
print(wall, peak, base, p.tensors_bytes, p.flops)
"""


def _largest_summed_pss(proc: subprocess.Popen) -> int:
    """The largest sum of PSS (a shared page counted once over its sharers) over `proc`'s descendants while it runs:
    the command and the tracer process it forks, whose pages are largely its parent's. Sampled every 0.2 s from
    /proc alone (psutil's scan of every process, ten times a second, took a core's share the command then lacked)."""
    from mtbench.sampling.procfs import descendants

    largest = 0
    while proc.poll() is None:
        largest = max(largest, sum(_pss(pid) for pid in descendants(proc.pid) or ()))
        time.sleep(0.2)
    return largest


def _pss(pid: int) -> int:
    """A process's PSS from the kernel's own sum (/proc/PID/smaps_rollup: reading every mapping's smaps, as psutil
    does, takes a core's tenth of a second on a 700 MB process and slowed the command it measured); 0 once gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def command_as_typed(runs: int = 2, sweep_compute_s: Optional[float] = None) -> None:
    """`python -m mtbench predict model=bert batch=64 target=tx2` as typed, in an empty folder, under GNU time; the
    machine's reference (machine_reference) just before each run is printed with it, against `sweep_compute_s` (the
    median of the sweep's jobs) where given: a slow hour of the machine is told apart from a slow command."""
    argv = ["predict", "model=bert", "batch=64", "target=tx2"]
    if not os.path.isfile("/usr/bin/time"):
        print("speed, the command as typed: not measured: GNU time (/usr/bin/time) is not installed")
        return
    for _ in range(runs):
        compute_s = machine_reference()["compute_s"]
        against = f", {pct(compute_s, sweep_compute_s):+.0f} % against the sweep's median" if sweep_compute_s else ""
        with tempfile.TemporaryDirectory() as here:
            # its output into files, not pipes this process would read only at the end (a full pipe blocks it)
            with open(os.path.join(here, "out"), "w+") as stdout, open(os.path.join(here, "err"), "w+") as stderr:
                proc = subprocess.Popen(["/usr/bin/time", "-f", "%e %M", sys.executable, "-m", "mtbench", *argv],
                                        stdout=stdout, stderr=stderr, cwd=here, start_new_session=True,
                                        env={**os.environ, "PYTHONPATH": str(REPO)})
                try:
                    pss = _largest_summed_pss(proc)
                    proc.wait()
                except BaseException:  # Ctrl-C or SIGTERM here: GNU time passes on no signal, the command goes too
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    raise
                stdout.seek(0)
                stderr.seek(0)
                out = subprocess.CompletedProcess(proc.args, proc.returncode, stdout.read(), stderr.read())
        lines = out.stderr.strip().splitlines()  # the command's own lines, then GNU time's
        words = lines[-1].split() if lines else []
        if out.returncode != 0 or len(words) != 2:
            print(f"speed, the command as typed: failed ({out.returncode}):", lines[-1:])
            return
        warned = lines[:-1]  # the command writes nothing else there: any line is a warning
        print(f"speed, `mtbench {' '.join(argv)}` as typed: {float(words[0]):.2f} s (goal <= 10), maximum resident "
              f"{int(words[1]):,} KiB = {int(words[1]) * 1024 / 1e9:.2f} GB (goal <= 1; its largest process), "
              f"its processes' summed PSS at most "
              f"{f'{pss / 1e9:.2f} GB' if pss else 'n/a (no /proc/PID/smaps_rollup or task children here)'} "
              f"(sampled every 0.2 s), "
              f"{'on stderr: ' + ' | '.join(warned) if warned else 'no warning on the console'}; the machine's "
              f"reference just before: a small convolution's step {compute_s * 1e3:.2f} ms{against}")


def machine_reference(repeats: int = 7, each: int = 10) -> dict:
    """How fast this machine runs now: the median over `repeats` of the seconds `each` fixed small training steps
    take (a 3x3 convolution of 64 channels on 8 x 16 x 16, forward and backward: compute-bound), and of `each` passes
    over 64 MiB (in-place scale: bandwidth-bound), with torch's threads as the jobs have them; about 0.6 s in all.
    The same figures before and after each job of a sweep say how much the machine's speed (its neighbours on a VM)
    moved under the jobs."""
    import torch

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(64, 64, 3, padding=1)
    x = torch.randn(8, 64, 16, 16)
    block = torch.ones(16 << 20)  # 64 MiB of float32

    def timed(fn) -> float:
        fn()  # warm: oneDNN's primitives, the block's pages
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def step() -> None:
        for _ in range(each):
            conv(x).square().mean().backward()

    def stream() -> None:
        for _ in range(each):
            block.mul_(1.0)

    return {"compute_s": timed(step), "stream_s": timed(stream)}


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


def run_sweep(jobs, folder: Path, steps: int = 3, profiled=()) -> None:
    """Each (model, batch) job of `jobs` in a fresh process (so that its memory before the model is its own),
    profiled where the model is in `profiled` (the calibration models: ops.csv holds the per-op times the time model
    is fitted on; their summaries' unprofiled reference steps are the step time); the held-out models run plain, so
    that no profiler's time or memory is in what the predictions are compared with. A job whose summary is already
    in `folder` is not run again (a sweep goes on where it stopped, or grows by models). The machine's reference
    figures (machine_reference), taken in this process just before and just after each job, go into the job's
    summary as `bench_machine_reference` (not in the job's process: its memory before the model is measured)."""
    from mtbench.errors import UsageError
    from mtbench.predict.fit import read_summaries

    try:
        done = {(s["model"], int(s["batch_size"])) for s in read_summaries(folder)}
    except UsageError:  # no folder yet, or none of its jobs succeeded
        done = set()
    start = len(list(folder.iterdir())) if folder.is_dir() else 0
    for i, (model, batch) in enumerate((j for j in jobs if j not in done), start=start):
        job_dir = folder / f"{i}-{model}-b{batch}"
        code = f"from benchmarks.predict_accuracy import run_job_child; run_job_child({model!r}, {batch}, " \
               f"{str(job_dir)!r}, steps={steps}, profile={model in profiled})"
        reference = {"before": machine_reference()}
        subprocess.run([sys.executable, "-c", code], check=False, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
        reference["after"] = machine_reference()
        path = job_dir / "summary.json"
        if path.is_file():
            data = json.loads(path.read_text())
            data["bench_machine_reference"] = reference
            path.write_text(json.dumps(data, indent=2))


def job_references(runs) -> dict:
    """{(model, batch): {"compute_s" and "stream_s": (the mean of its before and after figures, how far after moved
    from before in %)}} of the jobs whose summaries hold the machine's reference from both sides."""
    refs = {}
    for s in runs:
        ref = s.get("bench_machine_reference") or {}
        if "before" in ref and "after" in ref:
            refs[(s["model"], int(s["batch_size"]))] = {
                k: ((ref["before"][k] + ref["after"][k]) / 2, abs(ref["after"][k] / ref["before"][k] - 1) * 100)
                for k in ("compute_s", "stream_s")}
    return refs


def machine_drift(runs) -> tuple:
    """({(model, batch): (compute %, stream %)}, one line): each job's machine reference (the mean of its before and
    after figures) against the median over the sweep's jobs, in % (+: the machine ran that much slower), and the
    line that says how far the machine's speed moved over the sweep and within its jobs."""
    refs = job_references(runs)
    if len(refs) < 2:
        return {}, "the machine's reference: not in this sweep's summaries (a sweep made before they were recorded)"
    med = {k: statistics.median(r[k][0] for r in refs.values()) for k in ("compute_s", "stream_s")}
    out = {job: tuple(pct(r[k][0], med[k]) for k in ("compute_s", "stream_s")) for job, r in refs.items()}
    parts = []
    for k, name in (("compute_s", "a small convolution's step"), ("stream_s", "a pass over 64 MiB")):
        values = [r[k][0] for r in refs.values()]
        parts.append(f"{name} {min(values) * 1e3:.2f}-{max(values) * 1e3:.2f} ms over the sweep's {len(refs)} jobs "
                     f"(spread {(max(values) - min(values)) / med[k] * 100:.0f} % of the median), after against "
                     f"before a job: median {statistics.median(r[k][1] for r in refs.values()):.0f} %")
    return out, "the machine's reference (machine_reference): " + "; ".join(parts)


def pass_folder(folder: Path, k: int) -> Path:
    """Where pass `k` of a sweep runs (1: the sweep's own folder; a later pass a sibling, `DIR-passK`)."""
    return folder if k == 1 else folder.with_name(f"{folder.name}-pass{k}")


def fastest_pass(passes, stat: str, only: int = 0) -> list:
    """The first pass's summaries, each job's step time the fastest (by `stat`) of its passes' (`only` = K: pass
    K's): on a VM whose neighbours slow whole jobs down for minutes, a pass run later measures each job again, and
    the fastest holds least of them. Everything else of a job (memory, its per-op profile, which a calibration
    job's per-class times are scaled from) stays the first pass's; a held-out job's step statistics and machine
    reference come whole from the pass chosen. `bench_pass` says which pass that is (1-based). A job missing from
    the later passes keeps its own."""
    import copy

    from mtbench.predict.profiled import step_seconds

    later = {}
    for k, runs in enumerate(passes[1:], start=2):
        for s in runs:
            if not only or k == only:
                later.setdefault((s["model"], int(s["batch_size"])), []).append((k, s))
    out = []
    for s in passes[0]:
        best_k, best_s, best = 1, step_seconds(s, stat), s
        for k, x in later.get((s["model"], int(s["batch_size"])), []):
            x_s = step_seconds(x, stat)
            if x_s and (best_s is None or only or x_s < best_s):
                best_k, best_s, best = k, x_s, x
        s = copy.deepcopy(s)
        s["bench_pass"] = best_k
        reference = (s.get("profile") or {}).get("unprofiled_step_time_s") if s.get("profiled") else None
        # a profiled job's own step time is the profiler's: the plain one it is scaled to is its reference steps'
        if best_k != 1 and isinstance(reference, dict) and reference.get(stat):
            reference[stat] = best_s
        elif best_k != 1:
            s["step_time_s"] = dict(best["step_time_s"])
            s["bench_machine_reference"] = best.get("bench_machine_reference")
        out.append(s)
    return out


def calibrate_on(predictor, folder: Path, fit_runs, stat: str) -> list:
    """`predictor` calibrated on `fit_runs` of the sweep in `folder` (`mtbench calibrate`'s fit, loaded as a stored
    calibration is); the fit's report lines."""
    from mtbench.predict.calibration import load
    from mtbench.predict.fit import calibrate

    with tempfile.TemporaryDirectory() as tmp:
        cal_path = Path(tmp) / "cal.json"
        cal, _, report = calibrate(folder, out=str(cal_path), summaries=fit_runs, predictor=predictor,
                                   time_stat=stat)
        predictor.calibration = load(cal.key, cal_path)
    return report


def held_out_mape(predictor, folder: Path, runs, held_out, stat: str) -> float:
    """The held-out jobs' step-time MAPE with the predictor calibrated on `runs`' other jobs (its calibration
    restored after)."""
    from mtbench.predict.calibration import mape_pct
    from mtbench.predict.fit import split_by_model
    from mtbench.predict.profiled import step_seconds

    kept = predictor.calibration
    fit_runs, test_runs = split_by_model(runs, [m for m in held_out if any(s["model"] == m for s in runs)])
    try:
        calibrate_on(predictor, folder, fit_runs, stat)
        predicted = [predictor.predict(s["model"], int(s["batch_size"])).step_time_s for s in test_runs]
        return mape_pct(predicted, [step_seconds(s, stat) for s in test_runs])
    finally:
        predictor.calibration = kept


def sweep_jobs(models, batches: str, batches_for) -> list:
    """(model, batch) of the sweep: `batches` for every model, or a model's own from --batches-for MODEL=B,B,B."""
    own = {}
    for item in batches_for:
        model, _, values = item.partition("=")
        if not values:
            raise SystemExit(f"--batches-for {item!r}: expected MODEL=B,B,B (e.g. bert=1,2,4)")
        own[model] = values
    return [(m, int(b)) for m in models for b in own.get(m, batches).split(",")]


def check_models(models, held_out) -> None:
    """Exit with one line where a name of --models or --held-out is not a model of conf/model (a misspelt held-out
    model would silently leave the model it meant to hold out among the calibration models)."""
    from mtbench.config import group_options

    known = group_options("model")
    for flag, names in (("--models", models), ("--held-out", held_out)):
        unknown = [m for m in names if m not in known]
        if unknown:
            raise SystemExit(f"{flag}: unknown model {', '.join(map(repr, unknown))}; "
                             f"the models of conf/model: {', '.join(known)}")


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


HELD_OUT = ("densenet40", "mobilenetv2", "resnet101", "vgg19", "xception")  # evaluated; the other CNNs calibrate
MAXBATCH_MODELS = ("resnet50", "vgg16", "mobilenetv2", "densenet40")


def quiet() -> str:
    """The machine's load: the 1-minute load average, also per core (a quiet machine: well under 1)."""
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return f"load average {os.getloadavg()[0]:.2f} ({load:.2f} per core)"


def _warm_prober() -> None:
    """What the first probe of a process pays once (torchvision's import, Hydra's first compose: 1.4 s on the VM of
    docs/benchmarks.md), paid before either search is timed: both searches run in this one process, the guided
    one first, and `mtbench maxbatch` pays it once whichever search it runs."""
    import importlib

    from hydra import compose, initialize_config_dir

    from mtbench import config

    for module in ("torchvision", "mtbench.job.isolation"):  # what run_isolated imports, and run_isolated
        importlib.import_module(module)

    with initialize_config_dir(config_dir=str(config.conf_dir()), version_base="1.3"):
        compose(config_name="config", overrides=[f"model={MAXBATCH_MODELS[0]}"])


def maxbatch_comparison(models, repeats: int = 1, confirm_above: bool = False) -> None:
    """Guided (a small probe, the predicted max batch, then probes) against the full search, both as
    `mtbench maxbatch` runs them (--start 2) and timed in this one run: `repeats` times each, the order of the two
    alternating (guided first, then full first, ...), each search's median time compared (with its range where
    repeated: a probe's time moves by a third between runs on the VM of docs/benchmarks.md)."""
    from mtbench.campaign.maxbatch import guided, probe_isolated, search

    print(f"\nmax batch, target=nano device=cpu, {repeats} run(s) of each search, order alternating ({quiet()}):")
    print(f"{'model':<12} {'full':>6} {'probes':>6} {'s':>6} {'pred':>6} {'guided':>6} {'over':>6} {'probes':>6} "
          f"{'s':>6} {'same':>5} {'speed-up':>8}  {'full s, each':<18} guided s, each")
    args = argparse.Namespace(start=2, limit=4096, tolerance=0.05, confirm_above=confirm_above)
    _warm_prober()
    for model in models:
        fulls, guideds, predictions = [], [], []
        for run in range(repeats):
            with tempfile.TemporaryDirectory() as tmp:
                overrides = [f"model={model}", "target=nano", "device=cpu"]
                n = iter(range(10 ** 6))

                def prober(batch: int):
                    return probe_isolated(overrides, batch, Path(tmp) / f"{next(n)}-b{batch}")

                def run_guided():
                    said = io.StringIO()
                    with contextlib.redirect_stdout(said):  # its "predicted max batch: ..." line
                        guideds.append(guided(model, "nano", overrides[1:], prober, args))
                    predicted = re.search(r"predicted max batch: (\d+)", said.getvalue())
                    if not predicted:
                        print(f"  {model}: {said.getvalue().strip()}")
                    predictions.append(predicted.group(1) if predicted else "none")

                for which in ("guided", "full") if run % 2 == 0 else ("full", "guided"):
                    if which == "full":
                        fulls.append(search(prober, start=args.start, model=model))
                    else:
                        run_guided()
        full, g = fulls[-1], guideds[-1]
        same = all(abs(x.max_batch - f.max_batch) <= max(1, 0.05 * f.max_batch) for x, f in zip(guideds, fulls))
        full_s, guided_s = (statistics.median(x.seconds for x in runs) for runs in (fulls, guideds))
        each = [" ".join(f"{x.seconds:.0f}" for x in runs) for runs in (fulls, guideds)]
        over = f"{g.first_failing_batch}{'*' if g.inferred else ''}"
        print(f"{model:<12} {full.max_batch:>6} {len(full.probes):>6} {full_s:>6.0f} "
              f"{'/'.join(sorted(set(predictions))):>6} {g.max_batch:>6} {over:>6} {len(g.probes):>6} "
              f"{guided_s:>6.0f} {str(same):>5} {full_s / max(guided_s, 1e-9):>7.1f}x  {each[0]:<18} {each[1]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", help="the sweep folder: reused where it holds summaries, else the sweep runs into it")
    ap.add_argument("--batches", default="2,8,32")
    ap.add_argument("--batches-for", action="append", default=[], metavar="MODEL=B,B,B",
                    help="a model's own batches (repeatable), e.g. bert=1,2,4: BERT at 32 needs about 10 GB")
    ap.add_argument("--models", default=",".join(CNNS))
    ap.add_argument("--held-out", default=",".join(HELD_OUT),
                    help="models evaluated (never calibrated on); the sweep's other models calibrate")
    ap.add_argument("--steps", type=int, default=5, help="measured steps per job (their spread is printed)")
    ap.add_argument("--no-speed", action="store_true", help="skip the BERT speed check")
    ap.add_argument("--time-stat", choices=("median", "min"), default="median",
                    help="the step-time statistic calibrated on and compared with (`mtbench calibrate time_stat=`): "
                         "min, the fastest measured step, holds less of what other processes add")
    ap.add_argument("--passes", type=int, default=1, metavar="N",
                    help="run the sweep N times, one pass after the other (pass K into DIR-passK, unprofiled): each "
                         "job's step time is the fastest of its passes' (memory stays the first pass's); the "
                         "held-out step-time MAPE of each pass alone is printed too")
    ap.add_argument("--maxbatch-repeats", type=int, default=1, metavar="N",
                    help="with --maxbatch: run each search N times, the order alternating, and compare medians")
    ap.add_argument("--maxbatch", action="store_true",
                    help="also compare guided and full maxbatch (target=nano, device=cpu) for " +
                         ", ".join(MAXBATCH_MODELS))
    ap.add_argument("--confirm-above", action="store_true",
                    help="with --maxbatch: the guided search probes the step above its answer in every case "
                         "(`mtbench maxbatch --confirm-above`)")
    ap.add_argument("--all-models", action="store_true",
                    help="only predict every model of conf/model at batch 8 for target none and tx2 (how each traced)")
    args = ap.parse_args()
    if args.passes < 1:
        ap.error(f"--passes {args.passes}: must be 1 or more")
    if args.maxbatch_repeats < 1:
        ap.error(f"--maxbatch-repeats {args.maxbatch_repeats}: must be 1 or more")

    from mtbench.predict.calibration import mape_pct
    from mtbench.predict.fit import measured_training_bytes, read_summaries, split_by_model
    from mtbench.predict.predictor import Predictor

    if args.all_models:
        return all_models()
    models, held_out = args.models.split(","), [m for m in args.held_out.split(",") if m]
    check_models(models, held_out)
    folder = Path(args.sweep) if args.sweep else Path(tempfile.mkdtemp(prefix="mtbench-predict-")) / "sweep"
    print(f"before the sweep: {quiet()}")
    jobs = sweep_jobs(models, args.batches, args.batches_for)
    run_sweep(jobs, folder, steps=args.steps, profiled=[m for m in models if m not in held_out])
    for k in range(2, args.passes + 1):
        print(f"pass {k} of {args.passes} into {pass_folder(folder, k)}: {quiet()}")
        run_sweep(jobs, pass_folder(folder, k), steps=args.steps)
    print(f"after the sweep: {quiet()}")

    def sweep_runs(where: Path) -> list:
        found = sorted(read_summaries(where), key=lambda s: (s["model"], s["batch_size"]))
        return [s for s in found if (s["model"], int(s["batch_size"])) in set(jobs)]

    passes = [sweep_runs(pass_folder(folder, k)) for k in range(1, args.passes + 1)]
    runs = fastest_pass(passes, args.time_stat) if args.passes > 1 else passes[0]
    fit_runs, test_runs = split_by_model(runs, [m for m in held_out if any(s["model"] == m for s in runs)])
    predictor = Predictor(target_name="none", device="cpu", overrides=("warmup=1", f"steps={args.steps}"),
                          stored_calibration=False)
    t0 = time.monotonic()
    for s in runs:
        predictor.trace(s["model"], int(s["batch_size"]))
    trace_s = time.monotonic() - t0
    report = calibrate_on(predictor, folder, fit_runs, args.time_stat)
    fit_models = sorted({s["model"] for s in fit_runs})
    print(f"\ntraced {len(runs)} jobs in {trace_s:.0f} s; calibrated on {len(fit_runs)} runs of "
          f"{', '.join(fit_models)}:\n  " + "\n  ".join(report))

    header = (f"{'model':<12} {'batch':>5} {'meas s':>8} {'spread':>7} {'pred s':>8} {'err %':>7} {'roofln s':>8} "
              f"{'meas MiB':>9} {'pred MiB':>9} {'err %':>7} {'tensors':>8} {'machine':>11}")
    drift, drift_line = machine_drift(runs)
    print(f"\nheld-out models ({', '.join(sorted({s['model'] for s in test_runs}))}), never calibrated on; "
          f"spread = (max - min) / median of the job's measured steps; machine = the machine's reference around the "
          f"job against the sweep's median, compute/stream % (+: slower)\n" + header + "\n" + "-" * len(header))
    mem_err, time_pred, time_meas, spread = [], [], [], []
    paired = []  # (step-time error %, the machine's slowdown % around the job) where the sweep timed it
    for s in test_runs:
        job = (s["model"], int(s["batch_size"]))
        p = predictor.predict(*job)
        meas_b = measured_training_bytes(s)
        st = s["step_time_s"]
        e_mem = pct(p.peak_bytes, meas_b) if meas_b else float("nan")
        measured_s = st[args.time_stat]
        e_time = pct(p.step_time_s, measured_s)
        if job in drift:
            paired.append((e_time, sum(drift[job]) / 2))
        mem_err.append(abs(e_mem))
        time_pred.append(p.step_time_s)
        time_meas.append(measured_s)
        spread.append((st["max"] - st["min"]) / st["median"] * 100)
        print(f"{s['model']:<12} {s['batch_size']:>5} {measured_s:>8.3f} {spread[-1]:>6.0f}% {p.step_time_s:>8.3f} "
              f"{e_time:>+7.1f} {p.roofline_s or float('nan'):>8.3f} {meas_b / 2**20:>9.1f} "
              f"{p.peak_bytes / 2**20:>9.1f} {e_mem:>+7.1f} {p.tensors_bytes / 2**20:>8.1f} "
              f"{'%+.0f/%+.0f' % drift[job] if job in drift else 'n/a':>11}")
    print(f"\nheld out, {len(test_runs)} runs: step time MAPE {mape_pct(time_pred, time_meas):.1f} % (goal <= 10; "
          f"median spread of the measured steps {statistics.median(spread):.0f} %)   |   training memory MAPE "
          f"{statistics.mean(mem_err):.1f} %, median {statistics.median(mem_err):.1f} % (goal <= 3), worst "
          f"{max(mem_err):.1f} % (goal <= 8)")
    kinds = {"CNNs": [i for i, s in enumerate(test_runs) if s["model"] in CNNS],
             "the other models": [i for i, s in enumerate(test_runs) if s["model"] not in CNNS]}
    if all(kinds.values()):
        print("  by kind: " + "; ".join(
            f"{name} ({len(ix)} runs): step time MAPE "
            f"{mape_pct([time_pred[i] for i in ix], [time_meas[i] for i in ix]):.1f} %, memory median "
            f"{statistics.median([mem_err[i] for i in ix]):.1f} %, worst {max(mem_err[i] for i in ix):.1f} %"
            for name, ix in kinds.items()))
    if args.passes > 1:
        chosen = [sum(1 for s in test_runs if s.get("bench_pass") == k) for k in range(1, args.passes + 1)]
        alone = [held_out_mape(predictor, folder, fastest_pass(passes, args.time_stat, k), held_out,
                               args.time_stat)
                 for k in range(1, args.passes + 1)]
        print(f"  {args.passes} passes, each job's step time the fastest pass's (held-out jobs per pass: "
              f"{', '.join(map(str, chosen))}); each pass's step times alone: step time MAPE "
              + ", ".join(f"pass {k} {e:.1f} %" for k, e in enumerate(alone, start=1)))
    print(drift_line)
    if len(paired) >= 3 and len({d for _, d in paired}) > 1 and len({e for e, _ in paired}) > 1:
        import numpy as np

        r = float(np.corrcoef([e for e, _ in paired], [d for _, d in paired])[0, 1])
        print(f"  the held-out step-time errors against the machine's slowdown around each job (the mean of its two "
              f"reference figures): Pearson r {r:+.2f} over {len(paired)} jobs (near -1: the machine's speed, not "
              f"the predictor, made the misses)")
    print(f"after the predictions: {quiet()}")
    if args.maxbatch:  # from a fresh process: this one ran autograd (the traces), and each probe is a fork
        subprocess.run([sys.executable, "-c", "from benchmarks.predict_accuracy import MAXBATCH_MODELS, "
                        "maxbatch_comparison; "
                        f"maxbatch_comparison(MAXBATCH_MODELS, {args.maxbatch_repeats}, {args.confirm_above})"],
                       check=False, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
        print("  over: the guided search's smallest batch that does not fit; *: not probed, ruled out by the "
              "headroom the probe at the answer measured and the trace's growth (--confirm-above probes it)")

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
        refs = job_references(runs).values()
        command_as_typed(sweep_compute_s=statistics.median(r["compute_s"][0] for r in refs) if refs else None)


if __name__ == "__main__":
    from mtbench.job.signals import install_terminate_handlers

    install_terminate_handlers()  # SIGTERM (`timeout`, `kill`) as Ctrl-C: the running job child goes with it
    main()
