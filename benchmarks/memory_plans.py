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
                                      [image_size=16] [out=DIR] [retime=MODEL,...] [malloc=cached]

malloc: memory.cpu_malloc of the throughput jobs (not of the searches, which run held to the budget: live). cached
(default): glibc keeps freed memory for the next tensors, as a board's GPU caching allocator does; with glibc's own
settings (malloc=glibc) which of a step's tensors are faulted in again page by page depends on the order of its
frees, and recomputation paid for it most (MobileNetV2 batch 56: 0.96 s a step against 0.60 s, 320,000 page faults).

image_size: the CNNs' input size (VGG keeps 32: its five pools need it); at 32 (CIFAR's) a run of the 5 models took 13-16
minutes on a 2-vCPU VM with select=probes (82-90 jobs). retime=resnet50,...: the throughput jobs again, for these
models, on the searches of the earlier run in out=DIR (a timing that another process disturbed).
Goals: recompute >= 2x the plain largest batch on at least 4 of 5 models with throughput >= 0.7x; auto >= 4.33x on
every model with throughput >= 0.7x. auto is probed first at ceil(4.33 x plain) (the goal); only when that does not
fit is its largest batch searched below it, so "auto >= Nx" means the goal batch fitted (its true largest batch
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

from mtbench.config import conf_dir
from mtbench.campaign.maxbatch import DOES_NOT_FIT, Probe, search
from mtbench.job.isolation import run_isolated

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


def timed(prober: Prober, base: List[str], held: List[str], batch: int, label: Optional[str], name: str
          ) -> Dict[str, Any]:
    """Samples/s of the plan `label` at `batch`: batch / median of the measured steps' times. Without the budget
    (a budgeted CPU job fixes glibc's mmap threshold, which costs page faults: measured apart as malloc_cost), so
    every plan runs under the allocator setting of `base` (its memory.cpu_malloc); a plan only auto expresses runs
    under auto and the budget (`held`: its probe steps are outside the measured steps)."""
    fixed = plan_overrides(label)
    overrides = [*base, *fixed] if fixed is not None else [*held, "memory.plan=auto", "memory.select=probes"]
    s = prober.run(overrides, batch, name, **TIMED)
    if not s.get("success"):
        failure = s.get("failure") or {}
        return {"batch": batch, "samples_per_s": None, "error": f"{failure.get('kind')}: {failure.get('message')}"}
    median = s["step_time_s"]["median"]
    ran = (s.get("memory_plan") or {}).get("label")
    print(f"    {name} batch {batch} under {ran}: {batch / median:.2f} samples/s (median of {s['measured_steps']} "
          f"steps, {median:.3f} s)", flush=True)
    return {"batch": batch, "samples_per_s": batch / median, "plan": ran, "under_budget": fixed is None,
            "step_time_s": s["step_time_s"]}


def bench_model(model: str, prober: Prober, select: str, image_size: int, malloc: str = "cached"
                ) -> Dict[str, Any]:
    size = 32 if model in NEEDS_32 else image_size
    base = [f"model={model}", "device=cpu", f"data.image_size={size}"]
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
    row["search_seconds"] = time.monotonic() - began
    time_plans(row, prober, malloc)
    row["seconds"] = time.monotonic() - began
    return row


def time_plans(row: Dict[str, Any], prober: Prober, malloc: str = "cached") -> None:
    """Throughput, after the searches: each plan at its own largest batch, one job after the other, with glibc's
    malloc as `malloc` says (memory.cpu_malloc; a job held to the budget keeps its own: live)."""
    model, n0 = row["model"], row["none"]["max_batch"]
    common = [f"model={model}", "device=cpu", f"data.image_size={row['image_size']}"]
    held = [*common, f"memory.budget_gb={row['budget_bytes'] / 2**30!r}"]
    base = [*common, f"memory.cpu_malloc={malloc}"]
    row["timed_cpu_malloc"] = malloc
    for plan in ("none", "recompute", "auto"):
        p = row.get(plan) or {}
        if p.get("max_batch"):
            label = "none" if plan == "none" else p.get("plan")
            p["timed"] = timed(prober, base, held, p["max_batch"], label, f"{model}/time-{plan}")
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


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def print_table(rows: List[Dict[str, Any]]) -> None:
    def f(v: Optional[float], spec: str = ".2f") -> str:
        return "n/a" if v is None else format(v, spec)

    print("\n| model | image | budget MiB | none: max batch | samples/s | recompute: max batch | x none | "
          "throughput x none | recompute x none at the same batch | auto: max batch | x none | throughput x none | "
          "auto's plan at its max | budget's malloc setting: throughput x |")
    print("|" + "---|" * 14)
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
        print("| " + " | ".join(cells) + " |")
    print(f"\ngoals met: recompute >= 2x with >= 0.7x throughput on {met['recompute']} of {len(rows)} (goal: 4 of 5); "
          f"auto >= 4.33x with >= 0.7x throughput on {met['auto']} of {len(rows)} (goal: every model)")
    malloc = {r.get("timed_cpu_malloc", "glibc") for r in rows}
    print("throughput: samples/s at each plan's own largest batch, batch / median of 3 steps after a warm-up step, "
          f"without the budget, memory.cpu_malloc={'/'.join(sorted(malloc))} (* : under auto and the budget, a plan "
          "no fixed setting expresses); recompute x none at the same batch: recomputation's own cost, apart from the "
          "batch's; last column: none at its largest batch held to the budget (glibc's mmap threshold fixed: live) "
          "over the same without it")


def main(argv: List[str]) -> None:
    opts = {"models": ",".join(MODELS), "select": "auto", "image_size": "16", "out": "", "retime": "",
            "malloc": "cached"}
    for a in argv:
        key, _, value = a.partition("=")
        if key not in opts:
            sys.exit(f"memory_plans.py: error: {key!r} is not known; allowed: {', '.join(opts)}")
        opts[key] = value
    out = Path(opts["out"] or tempfile.mkdtemp(prefix="mtbench-memory-plans-"))
    prober = Prober(out)
    began = time.monotonic()
    print(f"load average before: {os.getloadavg()}; probes in {out}", flush=True)
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
    print(f"\n{prober.jobs} probe jobs in {time.monotonic() - began:.0f} s; load average after: {os.getloadavg()}; "
          f"results in {out / 'memory_plans.json'}")


if __name__ == "__main__":
    main(sys.argv[1:])
