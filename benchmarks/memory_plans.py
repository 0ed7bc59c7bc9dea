"""Training beyond memory, measured side by side: the largest batch within a budget with memory.plan=none, recompute
and auto, and the throughput at each of those batches relative to none at its own largest batch.

Per model, the budget is set so that plain training's largest batch is about 16 (issue 11: "target=nano, or a
budget that makes the plain max batch about 16"): two plain probes (batch 8 and 16) give the peak per sample, and
the budget is the batch-16 peak plus two samples' worth. On a CPU the budget holds the job's resident peak less
what the process held before the model was built (mtbench's CPU budget rule; a job held to a budget runs with
glibc's mmap threshold fixed, the calibration probes too). Each probe is a real short job (warmup=1 steps=1) in its
own process, as `mtbench maxbatch` runs them. After the searches, each plan is timed at its own largest batch
(a warm-up step, 3 measured, median), one job after the other, without the budget, and `none` once more held to
the budget, to show what the budget's allocator setting costs.

    python benchmarks/memory_plans.py [models=resnet50,vgg16,mobilenetv2,inceptionv1,squeezenet] [select=auto]
                                      [image_size=16] [out=DIR] [retime=MODEL,...] [malloc=cached] [torch_budget=1]
                                      [extra=OVERRIDE;OVERRIDE] [timed=defaults] [torch_only=0]

The defaults are mtbench's (select=auto, memory.cpu_malloc=auto in the searches). torch_budget=1 (default): a row of
torch's own automatic activation checkpointing under a memory budget beside mtbench's plans: the same model and
byte budget, the network through torch.compile with torch._functorch.config.activation_memory_budget (the min-cut
partitioner keeps that fraction of the activation memory and recomputes the rest). The fraction for a batch B is
what the budget leaves for activations at B, from the plain calibration probes (the peak at 8 and 16: a fixed part
and a per-sample slope): (budget - fixed) / (slope x B), at most 1. Each probe is a fresh interpreter (a compile per
batch; minutes for ResNet-50 on a small CPU); its peak is the resident high-water mark over 3 steps after two compiling
warm-up steps, less what was resident before those steps other than the held tensors (parameters, gradients, optimizer
state, batches): the compiler's own memory is not the training's. Where torch.compile fails here (inductor needs a C++
compiler), the row says why. extra: further config overrides for every job (e.g. a smaller width for a quick check).
timed=defaults (default): recompute and auto are timed as the jobs a user runs, held to the budget with every other
default (auto chooses memory.cpu_malloc: cached where the budget has room for its heap); timed=fixed: as before, each
plan fixed, without the budget, under malloc= (none is always timed so: plain training at its own largest batch).

malloc: memory.cpu_malloc of the throughput jobs (not of the searches, which run held to the budget: live). cached
(default): glibc keeps freed memory for the next tensors, as a board's GPU caching allocator does; with glibc's own
settings (malloc=glibc) which of a step's tensors are faulted in again page by page depends on the order of its
frees, and recomputation paid for it most (MobileNetV2 batch 56: 0.96 s a step against 0.60 s, 320,000 page faults).

image_size: the CNNs' input size (VGG keeps 32: its five pools need it); at 32 (CIFAR's) a run of the 5 models took 13-16
minutes on a 2-vCPU VM with select=probes (82-90 jobs). retime=resnet50,...: the throughput jobs again, for these
models, on the searches of the earlier run in out=DIR (a timing that another process disturbed). torch_only=1: torch's
rows alone, for models=, on the budgets and calibration probes of the earlier run in out=DIR (into torch_rows.json).
Goals: recompute >= 2x the plain largest batch on at least 4 of 5 models with throughput >= 0.7x; auto >= 4.33x on
at least 4 of 5 with throughput >= 0.7x (issue 26); no auto or recompute job over its budget. auto is probed first
at ceil(4.33 x plain) (the goal); only when that does not fit is its largest batch searched below it, so "auto >= Nx" means the goal batch fitted (its true largest batch
may be larger).
"""
from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra import compose, initialize_config_dir

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's mtbench, not an installed one

from mtbench.config import conf_dir  # noqa: E402
from mtbench.campaign.maxbatch import DOES_NOT_FIT, Probe, search  # noqa: E402
from mtbench.job.isolation import run_isolated  # noqa: E402

MODELS = ["resnet50", "vgg16", "mobilenetv2", "inceptionv1", "squeezenet"]
NEEDS_32 = {"vgg16", "vgg19"}  # five 2x2 pools: a 16x16 image would shrink to nothing
GOALS = {"recompute": 2.0, "auto": 4.33}


class Prober:
    """Runs probe jobs and keeps their summaries (the throughput at a batch comes from its probe)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.summaries: Dict[tuple, Dict[str, Any]] = {}
        self.jobs = 0

    def run(self, overrides: List[str], batch: int, name: str, warmup: int = 1, steps: int = 1) -> Dict[str, Any]:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = compose(config_name="config",
                          overrides=[*overrides, f"batch={batch}", f"warmup={warmup}", f"steps={steps}"])
        self.jobs += 1
        summary = run_isolated(cfg, self.out / name / f"b{batch}")
        self.summaries[(name, batch)] = summary
        return summary

    def fits(self, overrides: List[str], name: str):
        def fits_at(batch: int) -> Probe:
            began = time.monotonic()
            s = self.run(overrides, batch, name)
            failure = s.get("failure") or {}
            plan = (s.get("memory_plan") or {}).get("label")
            p = Probe(batch, bool(s.get("success")), failure.get("kind"), failure.get("message"),
                      compared_bytes(s), time.monotonic() - began, plan)
            print(f"    {name} batch {batch}: {'fits' if p.fits else p.kind} under {plan}, "
                  f"{_mib(p.peak_bytes)} MiB, {p.seconds:.0f} s", flush=True)
            return p

        return fits_at


def compared_bytes(summary: Dict[str, Any]) -> Optional[int]:
    """What the CPU budget holds: the resident peak less the memory held before the model was built."""
    peak, runtime = summary.get("mem_peak_bytes"), summary.get("mem_runtime_bytes")
    if peak is None:
        return None
    return int(peak) - int(runtime or 0)


def _mib(n: Optional[int]) -> str:
    return "n/a" if n is None else f"{n / 2**20:.0f}"


def plan_overrides(label: Optional[str]) -> Optional[List[str]]:
    """The fixed memory.plan that runs the plan named `label` (memory_plan.label), or None for a plan that no fixed
    setting expresses (recomputation and micro-batches together: only auto chooses that)."""
    if not label or label == "none":
        return ["memory.plan=none"]
    kind, _, n = label.partition("/")
    if "+" in label:
        return None
    if kind == "recompute":  # recompute/auto or recompute/auto@50% (the share of the activation bytes recomputed)
        segments, _, share = n.partition("@")
        return ["memory.plan=recompute", f"memory.recompute={segments}",
                f"memory.recompute_share={share.rstrip('%') or 100}"]
    if kind == "microbatch":
        return ["memory.plan=microbatch", f"memory.microbatch={n}"]
    return None


TIMED = {"warmup": 1, "steps": 3}  # the throughput jobs: the first step (block profiling, oneDNN primitive caches) untimed


def timed(prober: Prober, base: List[str], held: List[str], batch: int, label: Optional[str], name: str,
          setting: Optional[str] = None) -> Dict[str, Any]:
    """Samples/s of the plan `label` at `batch`: batch / median of the measured steps' times. Without the budget
    (a budgeted CPU job fixes glibc's mmap threshold, which costs page faults: measured apart as malloc_cost), so
    every plan runs under the allocator setting of `base` (its memory.cpu_malloc); a plan only auto expresses runs
    under auto and the budget (`held`: its probe steps are outside the measured steps). With `setting` (timed=defaults):
    the job a user runs, memory.plan=`setting` held to the budget with every other default (auto's choice of plan and
    of memory.cpu_malloc, its probes outside the measured steps)."""
    fixed = plan_overrides(label) if setting is None else None
    overrides = ([*base, *fixed] if fixed is not None else [*held, f"memory.plan={setting}"] if setting else
                 [*held, "memory.plan=auto", "memory.select=probes"])
    s = prober.run(overrides, batch, name, **TIMED)
    if not s.get("success"):
        failure = s.get("failure") or {}
        return {"batch": batch, "samples_per_s": None, "error": f"{failure.get('kind')}: {failure.get('message')}"}
    median = s["step_time_s"]["median"]
    ran = (s.get("memory_plan") or {}).get("label")
    print(f"    {name} batch {batch} under {ran}: {batch / median:.2f} samples/s (median of {s['measured_steps']} "
          f"steps, {median:.3f} s)", flush=True)
    return {"batch": batch, "samples_per_s": batch / median, "plan": ran, "under_budget": fixed is None,
            "step_time_s": s["step_time_s"], "cpu_malloc": (s.get("cpu_malloc") or {}).get("setting"),
            "cpu_malloc_because": ((s.get("memory_plan") or {}).get("cpu_malloc") or {}).get("chosen_because")}


def bench_model(model: str, prober: Prober, select: str, image_size: int, malloc: str = "cached"
                ) -> Dict[str, Any]:
    size = 32 if model in NEEDS_32 else image_size
    base = [f"model={model}", "device=cpu", f"data.image_size={size}", *EXTRA]
    began = time.monotonic()
    # the budget: plain training's peak at 16 plus two samples (per-sample slope from batch 8 to 16), measured as a
    # job held to a budget measures it (a budget far above the peak: the same allocator setting, nothing fails)
    calibrate = [*base, "memory.budget_gb=1000"]
    p8, p16 = (compared_bytes(prober.run(calibrate, b, f"{model}/calibrate")) for b in (8, 16))
    if p8 is None or p16 is None:
        return {"model": model, "error": "the calibration probes failed"}
    budget = int(p16 + 2 * max(0, p16 - p8) / 8)
    held = [*base, f"memory.budget_gb={budget / 2**30!r}"]
    row: Dict[str, Any] = {"model": model, "image_size": size, "budget_bytes": budget}
    plain = search(prober.fits([*held, "memory.plan=none"], f"{model}/none"), start=16, limit=64, tolerance=0.3)
    n0 = plain.max_batch
    row["none"] = {"max_batch": n0, "error": plain.error}
    if not n0:
        return row
    # recomputation alone; under the budget it takes the least share of the activation bytes that fits
    rec_fits = prober.fits([*held, "memory.plan=recompute", f"memory.select={select}"], f"{model}/recompute")
    rec = search(rec_fits, start=n0, limit=4 * n0, tolerance=0.3)
    if not rec.max_batch and not rec.error:  # not even plain's largest batch: how far below it
        rec = search(rec_fits, start=2, limit=n0 - 1, tolerance=0.3)
    row["recompute"] = {"max_batch": rec.max_batch, "limit_reached": rec.limit_reached, "error": rec.error,
                        "plan": (rec.probe_at(rec.max_batch).plan if rec.probe_at(rec.max_batch) else None)}
    goal = math.ceil(GOALS["auto"] * n0)
    auto_over = [*held, "memory.plan=auto", f"memory.select={select}"]
    fits = prober.fits(auto_over, f"{model}/auto")
    first = fits(goal)
    if first.fits:
        auto = {"max_batch": goal, "limit_reached": True, "plan": first.plan}
    elif first.kind in DOES_NOT_FIT:
        below = search(fits, start=n0, limit=goal - 1, tolerance=0.3)
        at = below.probe_at(below.max_batch)
        auto = {"max_batch": below.max_batch, "limit_reached": False, "plan": at.plan if at else None,
                "error": below.error}
    else:
        auto = {"max_batch": 0, "limit_reached": False, "plan": None, "error": f"{first.kind}: {first.message}"}
    at_goal = prober.summaries.get((f"{model}/auto", auto["max_batch"])) or {}
    auto["chosen_because"] = (at_goal.get("memory_plan") or {}).get("chosen_because")
    row["auto"] = auto
    if TORCH_BUDGET["on"]:
        row["torch_budget"] = torch_budget_search(base, budget, p8, p16, n0, goal, prober.out / model / "torch")
    row["search_seconds"] = time.monotonic() - began
    time_plans(row, prober, malloc)
    row["seconds"] = time.monotonic() - began
    return row


def time_plans(row: Dict[str, Any], prober: Prober, malloc: str = "cached") -> None:
    """Throughput, after the searches: each plan at its own largest batch, one job after the other, with glibc's
    malloc as `malloc` says (memory.cpu_malloc; a job held to the budget keeps its own: live)."""
    model, n0 = row["model"], row["none"]["max_batch"]
    common = [f"model={model}", "device=cpu", f"data.image_size={row['image_size']}", *EXTRA]
    held = [*common, f"memory.budget_gb={row['budget_bytes'] / 2**30!r}"]
    base = [*common, f"memory.cpu_malloc={malloc}"]
    row["timed_cpu_malloc"] = malloc
    for plan in ("none", "recompute", "auto"):
        p = row.get(plan) or {}
        if p.get("max_batch"):
            label = "none" if plan == "none" else p.get("plan")
            setting = plan if plan != "none" and TIMED_DEFAULTS["on"] else None
            p["timed"] = timed(prober, base, held, p["max_batch"], label, f"{model}/time-{plan}", setting)
            p["throughput"] = p["timed"]["samples_per_s"]
    # what recomputation itself costs, apart from the batch: none at recompute's batch (without the budget)
    nr = row["recompute"].get("max_batch")
    if nr and nr != n0 and row["recompute"].get("throughput"):
        same = timed(prober, base, held, nr, "none", f"{model}/time-none-at-recompute")
        row["recompute"]["none_at_same_batch"] = same["samples_per_s"]
    # what the budget's allocator setting (glibc's mmap threshold fixed) costs: none at its largest batch, held
    t = prober.run([*held, "memory.plan=none"], n0, f"{model}/time-none-held", **TIMED)
    held_tp = n0 / t["step_time_s"]["median"] if t.get("success") else None
    row["malloc_cost"] = {"held_samples_per_s": held_tp, "ratio": ratio(held_tp, row["none"]["throughput"])}
    row["timed_load_average"] = os.getloadavg()

# -- torch's own activation memory budget (torch.compile), beside mtbench's plans --------------------------------
TORCH_BUDGET = {"on": True}
TIMED_DEFAULTS = {"on": True}  # timed=defaults: recompute and auto timed as the budgeted default jobs
EXTRA: List[str] = []  # extra= overrides for every job
CHILD = "_torch_budget_probe"  # argv[1] of the fresh interpreter that runs one compiled probe


def activation_fraction(budget: int, p8: int, p16: int, batch: int) -> float:
    """The share of the activation memory that fits at `batch`: what the budget leaves above plain training's fixed
    part (the calibration probes' line through batch 8 and 16), over the activations' bytes at `batch`; in [0, 1]."""
    slope = max(1.0, (p16 - p8) / 8)
    fixed = p16 - 16 * slope
    return max(0.0, min(1.0, (budget - fixed) / (slope * batch)))


def torch_budget_probe(base: List[str], batch: int, fraction: float, malloc: str, out: Path) -> Dict[str, Any]:
    """One compiled probe in a fresh interpreter (no fork: inductor's compile workers): its JSON answer."""
    import subprocess

    spec = {"overrides": [*base, f"batch={batch}"], "fraction": fraction, "malloc": malloc}
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    done = subprocess.run([sys.executable, __file__, CHILD, json.dumps(spec)], capture_output=True, text=True,
                          timeout=3600, env={**os.environ, "PYTHONPATH": str(REPO)})
    (out / f"b{batch}-{malloc}.log").write_text(done.stdout + done.stderr)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"ok": False, "error": f"exit {done.returncode}: {tail[:300]}", "seconds": time.monotonic() - began}
    return {**json.loads(lines[-1]), "seconds": time.monotonic() - began}


def _held_bytes(workload: Any) -> int:
    """Tensors held between steps: parameters, gradients, optimizer state, the prepared batches."""
    import torch

    storages: Dict[int, int] = {}

    def add(t: Any) -> None:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            storages[st.data_ptr()] = st.nbytes()
        elif isinstance(t, (list, tuple)):
            for x in t:
                add(x)
        elif isinstance(t, dict):
            for x in t.values():
                add(x)

    for net in workload.modules():
        for p in net.parameters():
            add(p)
            add(p.grad)
        for b in net.buffers():
            add(b)
    add([v for st in workload.optimizer.state.values() for v in st.values()])
    add([v for v in vars(workload).values() if not isinstance(v, torch.nn.Module)])
    return int(sum(storages.values()))


def _child(spec: Dict[str, Any]) -> None:
    """The compiled probe: the job's workload with its network through torch.compile under the activation budget;
    two compiling warm-up steps, then 3 steps whose resident peak and times (median) count."""
    import torch
    import torch._functorch.config as functorch_config

    from mtbench.config import instantiate
    from mtbench.device import peak
    from mtbench.workload.base import SetupContext

    held_malloc = peak.set_cpu_malloc(spec["malloc"], budgeted=True)
    functorch_config.activation_memory_budget = float(spec["fraction"])
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=spec["overrides"])
    workload = instantiate(cfg.model.workload, "model.workload")
    workload.setup(SetupContext(torch.device("cpu"), int(cfg.batch), instantiate(cfg.data, "data"), seed=0,
                                batches=1))
    workload.net = torch.compile(workload.net)  # the optimizer holds the same parameters
    for _ in range(2):  # compiles the forward and the backward (the partitioner decides what is recomputed); the
        workload.step()  # second step still recompiled here (torch 2.14: the first measured step took 13x the next)
    before = peak.current_rss_bytes() or 0
    held = _held_bytes(workload)
    meter = peak.PeakMemory(torch.device("cpu"))
    meter.reset()
    times = []
    for _ in range(3):
        began = time.perf_counter()
        workload.step()
        times.append(time.perf_counter() - began)
    hwm = meter.read().get("mem_peak_bytes")
    compared = None if hwm is None else int(hwm) - (before - held)
    print(json.dumps({"ok": True, "peak_bytes": compared, "held_bytes": held, "step_times_s": times,
                      "cpu_malloc": (held_malloc or {}).get("setting"), "torch": torch.__version__}), flush=True)


def torch_budget_search(base: List[str], budget: int, p8: int, p16: int, n0: int, goal: int, out: Path
                        ) -> Dict[str, Any]:
    """The largest batch whose compiled step fits the budget, the fraction set per batch (activation_fraction):
    first at mtbench's goal (ceil(4.33 x plain)), else searched from plain's largest batch; then its throughput
    (the median of 3 steps after the compile, memory.cpu_malloc=cached as the other throughput jobs)."""
    def fits_at(batch: int) -> Probe:
        fraction = activation_fraction(budget, p8, p16, batch)
        r = torch_budget_probe(base, batch, fraction, "live", out)
        if not r.get("ok"):
            return Probe(batch, False, "error", r.get("error"), None, r["seconds"], f"budget {fraction:.2f}")
        ok = r["peak_bytes"] is not None and r["peak_bytes"] <= budget
        print(f"    torch budget batch {batch} (activation_memory_budget {fraction:.2f}): {'fits' if ok else 'over'}, "
              f"{_mib(r['peak_bytes'])} MiB, {r['seconds']:.0f} s", flush=True)
        return Probe(batch, ok, None if ok else "budget", None, r["peak_bytes"], r["seconds"], f"{fraction:.2f}")

    first = fits_at(goal)
    if first.kind == "error":
        return {"max_batch": None, "error": f"torch.compile failed here: {first.message}"}
    if first.fits:
        best, limit_reached = goal, True
    else:
        below = search(fits_at, start=n0, limit=goal - 1, tolerance=0.3)
        if below.error:
            return {"max_batch": None, "error": below.error}
        best, limit_reached = below.max_batch, False
    row: Dict[str, Any] = {"max_batch": best, "limit_reached": limit_reached,
                           "activation_memory_budget": activation_fraction(budget, p8, p16, best) if best else None}
    if best:
        r = torch_budget_probe(base, best, row["activation_memory_budget"], "cached", out)
        if r.get("ok"):
            row["throughput"] = best / sorted(r["step_times_s"])[len(r["step_times_s"]) // 2]
        else:
            row["timing_error"] = r.get("error")
    return row


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def print_table(rows: List[Dict[str, Any]]) -> None:
    def f(v: Optional[float], spec: str = ".2f") -> str:
        return "n/a" if v is None else format(v, spec)

    print("\n| model | image | budget MiB | none: max batch | samples/s | recompute: max batch | x none | "
          "throughput x none | recompute x none at the same batch | auto: max batch | x none | throughput x none | "
          "auto's plan at its max | budget's malloc setting: throughput x | torch budget: max batch | x none | "
          "throughput x none |")
    print("|" + "---|" * 17)
    met = {"recompute": 0, "auto": 0}
    for r in rows:
        if "none" not in r or not r["none"]["max_batch"]:
            print(f"| {r['model']} | error: {r.get('error') or r.get('none')} |")
            continue
        n0, t0 = r["none"]["max_batch"], r["none"].get("throughput")
        cells = [r["model"], f"{r['image_size']}", _mib(r["budget_bytes"]), str(n0), f(t0)]
        for plan in ("recompute", "auto"):
            p = r.get(plan) or {}
            x = ratio(p.get("max_batch"), n0)
            tx = ratio(p.get("throughput"), t0)
            mark = ">= " if p.get("limit_reached") else ""
            star = "*" if (p.get("timed") or {}).get("under_budget") else ""
            cells += [f"{mark}{p.get('max_batch')}", f"{mark}{f(x)}x", f(tx) + star]
            if plan == "recompute":
                cells.append(f(ratio(p.get("throughput"), p.get("none_at_same_batch"))))
            if x is not None and tx is not None and x >= GOALS[plan] and tx >= 0.7:
                met[plan] += 1
        cells.append(str((r.get("auto") or {}).get("plan")))
        cells.append(f((r.get("malloc_cost") or {}).get("ratio")))
        tb = r.get("torch_budget") or {}
        if tb.get("error") or "torch_budget" not in r:
            cells += [str(tb.get("error") or "not run (torch_budget=0)"), "n/a", "n/a"]
        else:
            mark = ">= " if tb.get("limit_reached") else ""
            cells += [f"{mark}{tb.get('max_batch')}", f"{mark}{f(ratio(tb.get('max_batch'), n0))}x",
                      f(ratio(tb.get("throughput"), t0))]
        print("| " + " | ".join(cells) + " |")
    print(f"\ngoals met: recompute >= 2x with >= 0.7x throughput on {met['recompute']} of {len(rows)} (goal: 4 of 5); "
          f"auto >= 4.33x with >= 0.7x throughput on {met['auto']} of {len(rows)} (goal: 4 of 5)")
    malloc = {r.get("timed_cpu_malloc", "glibc") for r in rows}
    print("throughput: samples/s at each plan's own largest batch, batch / median of 3 steps after a warm-up step, "
          f"without the budget, memory.cpu_malloc={'/'.join(sorted(malloc))} (* : the job held to the budget, with "
          "timed=defaults its memory.plan and every other default; else under auto, a plan no fixed setting "
          "expresses); recompute x none at the same batch: recomputation's own cost, apart from the "
          "batch's; last column: none at its largest batch held to the budget (glibc's mmap threshold fixed: live) "
          "over the same without it")


def torch_rows(out: Path, models: List[str]) -> None:
    """torch_only=1: torch's activation-budget search alone for `models`, on the budgets, plain largest batches and
    calibration probes (batch 8 and 16) of an earlier run in `out` (its memory_plans.json); into torch_rows.json."""
    from mtbench.results.reader import read_summary

    rows = {r["model"]: r for r in json.loads((out / "memory_plans.json").read_text())}
    done: Dict[str, Any] = {}
    for model in models:
        if model not in rows or not rows[model].get("none", {}).get("max_batch"):
            print(f"{model}: not in {out / 'memory_plans.json'} with a plain largest batch: skipped", flush=True)
            continue
        r = rows[model]
        base = [f"model={model}", "device=cpu", f"data.image_size={r['image_size']}", *EXTRA]
        p8, p16 = (compared_bytes(read_summary(out / model / "calibrate" / f"b{b}") or {}) for b in (8, 16))
        if p8 is None or p16 is None:
            print(f"{model}: no calibration probes in {out / model / 'calibrate'}: skipped", flush=True)
            continue
        n0 = r["none"]["max_batch"]
        print(f"{model}: budget {_mib(r['budget_bytes'])} MiB; load average {os.getloadavg()}", flush=True)
        row = torch_budget_search(base, r["budget_bytes"], p8, p16, n0, math.ceil(GOALS["auto"] * n0),
                                  out / model / "torch")
        done[model] = {**row, "none_max_batch": n0, "none_throughput": r["none"].get("throughput"),
                       "budget_bytes": r["budget_bytes"]}
        (out / "torch_rows.json").write_text(json.dumps(done, indent=2) + "\n")
    print("\n| model | budget MiB | none: max batch | torch budget: max batch | x none | activation_memory_budget "
          "| throughput x none |\n|---|---|---|---|---|---|---|")
    for model, row in done.items():
        best = row.get("max_batch")
        if not best:
            print(f"| {model} | {_mib(row['budget_bytes'])} | {row['none_max_batch']} | {row.get('error')} | n/a | n/a "
                  "| n/a |")
            continue
        speed = ratio(row.get("throughput"), row.get("none_throughput"))
        print(f"| {model} | {_mib(row['budget_bytes'])} | {row['none_max_batch']} | "
              f"{'>= ' if row.get('limit_reached') else ''}{best} | {best / row['none_max_batch']:.2f}x | "
              f"{row['activation_memory_budget']:.2f} | {'n/a' if speed is None else format(speed, '.2f')} |")
    print(f"load average after: {os.getloadavg()}; results in {out / 'torch_rows.json'}")


def main(argv: List[str]) -> None:
    if argv[:1] == [CHILD]:
        _child(json.loads(argv[1]))
        return
    opts = {"models": ",".join(MODELS), "select": "auto", "image_size": "16", "out": "", "retime": "",
            "malloc": "cached", "torch_budget": "1", "extra": "", "timed": "defaults", "torch_only": "0"}
    for a in argv:
        key, _, value = a.partition("=")
        if key not in opts:
            sys.exit(f"memory_plans.py: error: {key!r} is not known; allowed: {', '.join(opts)}")
        opts[key] = value
    TORCH_BUDGET["on"] = opts["torch_budget"] not in ("0", "false", "no")
    if opts["timed"] not in ("defaults", "fixed"):
        sys.exit(f"memory_plans.py: error: timed={opts['timed']!r}; allowed: defaults, fixed")
    TIMED_DEFAULTS["on"] = opts["timed"] == "defaults"
    EXTRA[:] = [o for o in opts["extra"].split(";") if o]
    out = Path(opts["out"] or tempfile.mkdtemp(prefix="mtbench-memory-plans-"))
    prober = Prober(out)
    began = time.monotonic()
    print(f"load average before: {os.getloadavg()}; probes in {out}", flush=True)
    if opts["torch_only"] not in ("0", "false", "no"):  # torch's rows alone, on an earlier run's budgets in out=
        torch_rows(out, [m for m in opts["models"].split(",") if m])
        return
    if opts["retime"]:  # the throughput jobs again for these models, on the searches of an earlier run in out=
        rows = json.loads((out / "memory_plans.json").read_text())
        for row in rows:
            if row["model"] in opts["retime"].split(",") and row.get("none", {}).get("max_batch"):
                print(f"{row['model']}: timed again", flush=True)
                time_plans(row, prober, opts["malloc"])
                row["retimed"] = True
                (out / "memory_plans.json").write_text(json.dumps(rows, indent=2) + "\n")
        print_table(rows)
        return
    rows = []
    for model in opts["models"].split(","):
        print(f"{model}:", flush=True)
        rows.append(bench_model(model, prober, opts["select"], int(opts["image_size"]), opts["malloc"]))
        (out / "memory_plans.json").write_text(json.dumps(rows, indent=2) + "\n")
    print_table(rows)
    planned = [s for s in prober.summaries.values() if (s.get("memory_plan") or {}).get("budget_bytes")
               and (s.get("memory_plan") or {}).get("setting") in ("auto", "recompute")]
    over = [s for s in planned if (s.get("memory_plan") or {}).get("over_budget_bytes")]
    silent = [s for s in over if s.get("success")]
    print(f"auto and recompute jobs recorded a success over their budget: {len(silent)} of {len(planned)} (goal: "
          "none)" + "".join(f"; {s['model']} b{s['batch_size']} {s['memory_plan']['setting']}" for s in silent))
    print(f"jobs over their budget recorded as a budget failure (a probe's 'does not fit'): {len(over) - len(silent)}"
          + "".join(f"; {s['model']} b{s['batch_size']} {s['memory_plan']['setting']} under "
                    f"{s['memory_plan'].get('label')} by {s['memory_plan']['over_budget_bytes']} bytes"
                    for s in over if not s.get("success")))
    print(f"\n{prober.jobs} probe jobs in {time.monotonic() - began:.0f} s; load average after: {os.getloadavg()}; "
          f"results in {out / 'memory_plans.json'}")


if __name__ == "__main__":
    from mtbench.job.signals import install_terminate_handlers

    install_terminate_handlers()  # SIGTERM (`timeout`, `kill`) as Ctrl-C: the running job child goes with it
    main(sys.argv[1:])
