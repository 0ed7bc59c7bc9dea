"""`mtbench maxbatch model=X target=tx2`: the largest batch that trains within the budget (doubling, then bisection)."""
from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from mtbench.campaign.prediction import predicted_max_batch
from mtbench import interpreter
from mtbench.errors import UsageError
from mtbench.predict.fit import budget_held_bytes
from mtbench.predict.maxsearch import FIRST_FACTORS
from mtbench.regular_files import create_fresh
from mtbench.results.files import atomic_write
from mtbench.results.reader import UnreadableSummary, checked, read_summary

SCHEMA = "mtbench.maxbatch/1"
# what makes a probe "does not fit": the allocator's OOM (CUDA, or a real MemoryError), the budget check on CPU,
# and the kernel's OOM killer (the job's process died)
DOES_NOT_FIT = ("oom", "budget", "killed")
PROBE = ["warmup=1", "steps=1", "memory.breakdown=false"]  # one warm-up step (grads, optimizer state), one
# measured; no tracked breakdown step (it runs after the peak is read: it would only cost time)


@dataclass
class Probe:
    batch: int
    fits: bool
    kind: Optional[str]  # failure kind, None when it fits
    message: Optional[str]
    peak_bytes: Optional[int]
    seconds: float
    plan: Optional[str] = None  # the memory plan the probe ran under (memory_plan.label; auto's choice)
    training_bytes: Optional[int] = None  # CPU: what the budget is held against (the peak less the runtime)


@dataclass
class Search:
    model: str
    plan: str = "none"  # memory.plan of every probe
    max_batch: int = 0  # 0: not even the first batch fits
    first_failing_batch: Optional[int] = None  # the smallest probed batch that did not fit (None: limit reached)
    limit_reached: bool = False
    error: Optional[str] = None  # a probe failed for another reason than memory: the search stopped
    probes: List[Probe] = field(default_factory=list)
    seconds: float = 0.0

    def probe_at(self, batch: int) -> Optional[Probe]:
        return next((p for p in self.probes if p.batch == batch), None)

    def ask(self, fits_at: Callable[[int], Probe], batch: int) -> Optional[bool]:
        """Whether `batch` fits, probed once (a batch probed before is not run again); None after a probe failed for
        another reason than memory (then in `error`: the search stops)."""
        p = self.probe_at(batch) or fits_at(batch)
        if p not in self.probes:
            self.probes.append(p)
        if not p.fits and p.kind not in DOES_NOT_FIT:
            self.error = f"batch {batch}: {p.kind}: {p.message}"
            return None
        return p.fits


def search(fits_at: Callable[[int], Probe], start: int = 1, limit: int = 4096, tolerance: float = 0.05,
           model: str = "", probes: Sequence[Probe] = (), spent: float = 0.0) -> Search:
    """Double from `start` until a probe does not fit (or `limit`), then bisect until the gap between the largest
    batch that fits and the smallest that does not is within `tolerance` of the former (or 1). `probes`, `spent`:
    as search_guided's."""
    result = Search(model=model, probes=list(probes))
    began = time.monotonic() - spent
    probe = functools.partial(result.ask, fits_at)

    batch = start
    while True:
        ok = probe(batch)
        if ok is None:
            break
        if not ok:
            result.first_failing_batch = batch
            break
        result.max_batch = batch
        if batch >= limit:
            result.limit_reached = True
            break
        batch = min(2 * batch, limit)
    return _bisect(result, probe, result.max_batch or None, result.first_failing_batch, tolerance, began)


def _bisect(result: Search, probe: Callable[[int], Optional[bool]], lo: Optional[int], hi: Optional[int],
            tolerance: float, began: float) -> Search:
    """Bisect between a batch that fits (`lo`) and one that does not (`hi`) until they are within `tolerance`:
    the last step of both searches."""
    while result.error is None and lo is not None and hi is not None and hi - lo > max(1, tolerance * lo):
        mid = (lo + hi) // 2
        ok = probe(mid)
        if ok is None:
            break
        if ok:
            lo = result.max_batch = mid
        else:
            hi = result.first_failing_batch = mid
    result.seconds = time.monotonic() - began
    return result


def search_guided(fits_at: Callable[[int], Probe], predicted: int, limit: int = 4096, tolerance: float = 0.05,
                  model: str = "", probes: Sequence[Probe] = (), spent: float = 0.0) -> Search:
    """Start from the predictor's max batch and confirm it with real probes: `predicted` fits and the next step
    above it (`tolerance`) does not, which is the full search's answer in two probes. Where a probe disagrees,
    widen in that direction (upwards one more single step, then steps that double: 5 %, 10 %, 20 %, ...),
    then bisect as `search` does, so a
    predictor that is 30 % off still ends on the same answer, in a few more probes. `probes`: those run before
    (the one that measured the runtime's memory for the prediction), counted and not run again; `spent`: the
    seconds before the search (that probe, the prediction), counted in its time."""
    result = Search(model=model, probes=list(probes))
    began = time.monotonic() - spent
    probe = functools.partial(result.ask, fits_at)

    def step(n: int, k: int, down: bool = False) -> int:  # the k-th step from n: within tolerance when k == 0
        return max(1, int(tolerance * n / (1 + tolerance) if down else tolerance * n)) << k

    lo: Optional[int] = None  # the largest batch that fitted
    hi: Optional[int] = None  # the smallest batch that did not
    batch, k = max(1, min(int(predicted), limit)), 0
    ok = probe(batch)
    if ok is not None and ok:
        lo, single = batch, True
        while result.error is None and hi is None:  # upwards: the next step, then steps that double
            if lo >= limit:
                result.limit_reached = True
                break
            nxt = min(limit, lo + step(lo, k))
            ok = probe(nxt)
            if ok is None:
                break
            if ok:  # one more single step (the prediction may be one step under), then steps that double
                lo, k, single = nxt, (k + 1 if not single else k), False
            else:
                hi = nxt
    elif ok is not None:
        hi = batch
        while result.error is None and lo is None and hi > 1:  # downwards, the same way
            nxt = max(1, hi - step(hi, k, down=True))
            ok = probe(nxt)
            if ok is None:
                break
            if ok:
                lo = nxt
            else:
                hi, k = nxt, k + 1
    result.max_batch = lo or 0
    result.first_failing_batch = hi
    return _bisect(result, probe, lo, hi, tolerance, began)


def guided(model: str, target: str, overrides: List[str], fits_at: Callable[[int], Probe],
            args: argparse.Namespace) -> Search:
    """The guided search: a probe at a small batch measures what the job holds besides tensors (the predictor can
    only assume it: 48 MiB under a budget, 117-127 MiB measured on resnet50 and densenet40 on one VM, 15-58 on
    another), the prediction is shifted by it, and search_guided confirms. Where that probe does not fit, or no
    prediction can be made, the full search runs."""
    began = time.monotonic()
    small = min(args.limit, FIRST_FACTORS[0] * args.start)  # the prediction's first trace
    first = fits_at(small)
    predicted, why = None, f"the probe at batch {small} did not fit ({first.kind})"
    if first.fits:
        measured = (small, first.training_bytes) if first.training_bytes is not None else None
        predicted, why = predicted_max_batch(model, target, overrides, args.start, measured)
    print(f"    predicted max batch: {predicted if predicted else why + ': the full search runs'}", flush=True)
    find = functools.partial(search_guided, predicted=predicted) if predicted else functools.partial(
        search, start=args.start)
    return find(fits_at, limit=args.limit, tolerance=args.tolerance, model=model, probes=[first],
                spent=time.monotonic() - began)


def _probe_from_summary(batch: int, summary: Optional[Dict[str, Any]], seconds: float, why_missing: str) -> Probe:
    if summary is None:
        return Probe(batch, False, "killed", why_missing, None, seconds)
    failure = summary.get("failure") or {}
    training = budget_held_bytes(summary) if summary.get("mem_peak_source") == "process_rss" else None
    return Probe(batch, bool(summary.get("success")), failure.get("kind"), failure.get("message"),
                 summary.get("mem_peak_bytes"), seconds, (summary.get("memory_plan") or {}).get("label"), training)


def probe_in_subprocess(overrides: List[str], batch: int, out_dir: Path) -> Probe:
    """One probe as `python -m mtbench ...` in a process of its own."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = interpreter.python_m("mtbench", [*overrides, f"batch={batch}", *PROBE, f"hydra.run.dir={out_dir}"])
    began = time.monotonic()
    with create_fresh(str(out_dir / "probe.log")) as log:  # a link planted there is removed, not written through
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    seconds = time.monotonic() - began
    try:
        summary: Optional[Dict[str, Any]] = checked(read_summary(out_dir))
    except UnreadableSummary as exc:
        if not exc.missing:  # the probe's result cannot be known: the search stops on it
            return Probe(batch, False, "error", str(exc), None, seconds)
        summary = None
    if summary is None and proc.returncode == 2:
        lines = (out_dir / "probe.log").read_text(errors="replace").strip().splitlines()
        raise UsageError(lines[-1].replace("mtbench: error: ", "", 1) if lines else "bad arguments")
    return _probe_from_summary(batch, summary, seconds, f"the job's process ended with {proc.returncode} "
                                                        "and wrote no summary")


def probe_isolated(overrides: List[str], batch: int, out_dir: Path) -> Probe:
    """One probe through the runner's run_isolated (a forked child per job), composing the config here."""
    from hydra import compose, initialize_config_dir

    from mtbench import config
    from mtbench.job.isolation import run_isolated

    with initialize_config_dir(config_dir=str(config.conf_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*overrides, f"batch={batch}", *PROBE])
    began = time.monotonic()
    summary = run_isolated(cfg, out_dir)
    return _probe_from_summary(batch, summary, time.monotonic() - began, "the job wrote no summary")


def default_prober() -> Callable[[List[str], int, Path], Probe]:
    return probe_isolated


def _models(overrides: List[str], multirun: bool) -> List[str]:
    models = [o.split("=", 1)[1] for o in overrides if o.startswith("model=")]
    if not models:
        return ["vgg19"]  # conf/config.yaml's default
    names = [m.strip() for m in models[-1].split(",")]
    if len(names) > 1 and not multirun:
        raise UsageError(f"model={models[-1]} lists several models; add -m to search each of them")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`mtbench maxbatch [-m] model=X target=T [options] [key=value ...]`."""
    parser.description = ("The largest batch that trains within a target's memory budget: doubling, then bisection; "
                          "each probe a short real job (1 warm-up step, 1 measured) in its own process.")
    parser.add_argument("-m", "--multirun", action="store_true", help="search each model of model=a,b,c")
    # 2, not 1: a BatchNorm over 1x1 maps (ResNet, MobileNetV2 on 32x32 inputs) cannot train on one sample
    parser.add_argument("--start", type=int, default=2, help="first batch probed (default 2)")
    parser.add_argument("--limit", type=int, default=4096, help="largest batch probed (default 4096)")
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="stop bisecting when the gap is within this fraction of the largest fit (default 0.05)")
    parser.add_argument("--search", default="full", choices=("full", "guided"),
                        help="full: doubling, then bisection; guided: start at the predictor's max batch and confirm it "
                             "with probes (2-3 probes when the prediction is right; the full answer when it is not)")
    parser.add_argument("--out", default=None, help="folder for maxbatch.json and the probes' job folders "
                                                    "(default maxbatch/<date>/<time>)")
    parser.add_argument("overrides", nargs="*", help="key=value, as for a job (model=..., target=..., device=...)")


def _parse(argv: List[str]) -> argparse.Namespace:
    from mtbench.errors import ArgumentParser

    parser = ArgumentParser(prog="mtbench maxbatch")
    add_arguments(parser)
    # maxbatch.search=full|guided, the config spelling of --search (a probe's config has no such key)
    argv = [f"--search={a.split('=', 1)[1]}" if a.startswith("maxbatch.search=") else a for a in argv]
    return parser.parse_intermixed_args(argv)


def _check(args: argparse.Namespace) -> None:
    if args.start < 1 or args.limit < args.start:
        raise UsageError(f"--start={args.start} --limit={args.limit}: allowed: 1 <= start <= limit")
    if not 0 < args.tolerance < 1:
        raise UsageError(f"--tolerance={args.tolerance} is out of range; allowed: a number between 0 and 1")
    for key in ("batch", "warmup", "steps"):
        if any(o.split("=", 1)[0] == key for o in args.overrides):
            raise UsageError(f"{key}= is set by maxbatch itself (each probe: batch=<searched> {' '.join(PROBE)})")
    if not any(o.split("=", 1)[0] == "model" for o in args.overrides):
        raise UsageError("maxbatch needs model=NAME (or -m model=a,b,...); allowed: a model `mtbench models` lists")


def main(argv: Optional[List[str]] = None, prober: Optional[Callable[[List[str], int, Path], Probe]] = None) -> int:
    """`mtbench maxbatch ...` from an argument list; returns the exit status (2 after a one-line error)."""
    from mtbench.errors import print_error

    try:
        return run(_parse(list(sys.argv[1:] if argv is None else argv)), prober)
    except UsageError as exc:
        return print_error(exc)


def run(args: argparse.Namespace, prober: Optional[Callable[[List[str], int, Path], Probe]] = None) -> int:
    """Searches each model; prints a table, writes maxbatch.json; exit status 0, or 1 when a search stopped on an
    error. A bad argument raises UsageError (before any probe)."""
    _check(args)
    from mtbench.config_overrides import check_overrides

    models = _models(args.overrides, args.multirun)
    check_overrides((["-m"] if args.multirun else []) + args.overrides)
    fixed = [o for o in args.overrides if not o.startswith("model=")]
    target = next((o.split("=", 1)[1] for o in fixed if o.startswith("target=")), "none")
    # memory.plan=X (not none): each model is searched with memory.plan=none and with X, side by side
    plan = next((o.split("=", 1)[1] for o in fixed if o.startswith("memory.plan=")), "none")
    fixed = [o for o in fixed if not o.startswith("memory.plan=")]
    plans = ["none"] if plan == "none" else ["none", plan]
    if target == "none" and not any(o.startswith(("memory.budget_gb=", "target.memory_budget_bytes="))
                                    for o in fixed):
        raise UsageError("maxbatch needs a target with a budget; allowed: target=tx2, nano, xavier_nx, "
                         "agx_xavier, orin_nano, orin_nx, agx_orin (or a GPU's own memory: target=none is "
                         "not searched)")
    from mtbench.campaign.folders import dated_dir, writable_folder

    # the scheme of docs/results.md; refused before the first probe where it cannot take the results
    out = writable_folder(Path(args.out or dated_dir("maxbatch")), "--out")
    prober = prober or default_prober()
    results = []
    for model in models:
        for plan in plans:
            print(f"maxbatch: {model} with {' '.join(fixed + [f'memory.plan={plan}'])}", flush=True)
            overrides = [f"model={model}", *fixed] + ([f"memory.plan={plan}"] if len(plans) > 1 else [])
            folder = out / model / plan if len(plans) > 1 else out / model

            def fits_at(batch: int, overrides: List[str] = overrides, folder: Path = folder) -> Probe:
                p = prober(overrides, batch, folder / f"b{batch}")
                verdict = "fits" if p.fits else f"does not fit ({p.kind})"
                print(f"    batch {batch}: {verdict}{f' under {p.plan}' if p.plan else ''}, {p.seconds:.0f} s",
                      flush=True)
                return p

            if args.search == "guided":
                results.append(guided(model, target, fixed + [f"memory.plan={plan}"], fits_at, args))
            else:
                results.append(search(fits_at, args.start, args.limit, args.tolerance, model=model))
            results[-1].plan = plan
    write(out, results, fixed, target, args)
    print_table(results, target)
    print(f"results in {out} (maxbatch.json, and each probe's job folder)")
    return 1 if any(r.error for r in results) else 0


def write(out: Path, results: List[Search], fixed: List[str], target: str, args: argparse.Namespace) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "schema": SCHEMA,
        "target": target,
        "budget_bytes": _budget_bytes(target, fixed),
        "overrides": fixed,
        "start": args.start, "limit": args.limit, "tolerance": args.tolerance, "search": args.search,
        "models": [asdict(r) for r in results],
    }
    atomic_write(out / "maxbatch.json", json.dumps(doc, indent=2) + "\n")


def _budget_bytes(target: str, fixed: List[str]) -> Optional[int]:
    """The budget the probes were held to: memory.budget_gb, target.memory_budget_bytes=N, or the target's."""
    from mtbench.device.targets import load_target

    for o in reversed(fixed):
        key, _, value = o.partition("=")
        if key == "memory.budget_gb":
            return int(float(value) * 2**30)
        if key == "target.memory_budget_bytes":
            return int(float(value))
    return load_target(target).memory_budget_bytes


def print_table(results: List[Search], target: str) -> None:
    from rich.table import Table

    from mtbench.results.console import console, fmt_bytes

    table = Table(title=f"largest batch that trains within target {target}'s budget")
    for h in ("model", "memory.plan", "max batch", "x none", "plan at max", "does not fit at", "peak at max", "probes",
              "time"):
        table.add_column(h, justify="left" if h in ("model", "memory.plan", "plan at max") else "right")
    plain = {r.model: r.max_batch for r in results if r.plan == "none"}
    for r in results:
        at_max = r.probe_at(r.max_batch)
        failing = r.probe_at(r.first_failing_batch) if r.first_failing_batch else None
        ratio = r.max_batch / plain[r.model] if plain.get(r.model) and r.max_batch else None
        table.add_row(
            r.model,
            r.plan,
            ("error" if r.error and not r.max_batch else f">= {r.max_batch}" if r.limit_reached else str(r.max_batch)),
            f"{ratio:.2f}x" if ratio is not None else "n/a",
            (at_max.plan or "n/a") if at_max else "n/a",
            f"{r.first_failing_batch} ({failing.kind})" if failing else ("n/a" if not r.error else r.error[:40]),
            fmt_bytes(at_max.peak_bytes) if at_max else "n/a",
            str(len(r.probes)),
            f"{r.seconds:.0f} s",
        )
    console.print(table)


if __name__ == "__main__":
    sys.exit(main())
