"""The largest batch that trains within a budget: probes (each a short real job in its own process), the full
search (doubling, then bisection) and the guided one (from the predictor's answer); `mtbench maxbatch` is
commands/maxbatch."""
from __future__ import annotations

import argparse
import functools
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from mtbench.campaign.prediction import predicted_max_batch
from mtbench import interpreter
from mtbench.config_schema import last_override
from mtbench.errors import UsageError
from mtbench.predict.fit import measured_training_bytes
from mtbench.predict.maxsearch import FIRST_FACTORS
from mtbench.regular_files import create_fresh
from mtbench.results.reader import UnreadableSummary, checked, read_summary

SCHEMA = "mtbench.maxbatch/1"
# what makes a probe "does not fit": the allocator's OOM (CUDA, or a real MemoryError), the budget check on CPU,
# and the kernel's OOM killer (the job's process died)
DOES_NOT_FIT = ("oom", "budget", "killed")
# the guided search takes the step above a batch that fits as not fitting, unprobed, where that batch's headroom
# under the budget is less than this share of the trace's growth over the step (a trace that over-states the
# growth up to twice, or under-states it, cannot make that wrong); the rule: search_guided
INFER_SHARE = 0.5
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
    budget_bytes: Optional[int] = None  # the budget the job was held to


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
    inferred: Optional[str] = None  # why first_failing_batch was not probed (search_guided), None where it was

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
                  model: str = "", probes: Sequence[Probe] = (), spent: float = 0.0,
                  growth_bytes: Optional[float] = None) -> Search:
    """Start from the predictor's max batch and confirm it with real probes: `predicted` fits and the next step
    above it (`tolerance`) does not, which is the full search's answer in two probes. Where a probe disagrees,
    widen in that direction (upwards one more single step, then steps that double: 5 %, 10 %, 20 %, ...),
    then bisect as `search` does, so a
    predictor that is 30 % off still ends on the same answer, in a few more probes. `probes`: those run before
    (the one that measured the runtime's memory for the prediction), counted and not run again; `spent`: the
    seconds before the search (that probe, the prediction), counted in its time.

    `growth_bytes`: the trace's growth of training memory per sample at the prediction. On the way up, the next
    batch is then not probed where the largest batch that fitted measured less headroom under its budget than
    INFER_SHARE of that growth over the step: it is the first that does not fit, and `inferred` says why. Memory
    that grows with the batch at least half as fast as the trace says cannot fit there (docs/benchmarks.md
    compares the growth measured near the answer with the trace's)."""
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
            result.inferred = _ruled_out(result.probe_at(lo), nxt, growth_bytes)
            if result.inferred:
                hi = nxt
                break
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
    result = _bisect(result, probe, lo, hi, tolerance, began)
    if result.probe_at(result.first_failing_batch or 0) is not None:  # bisected below the batch ruled out
        result.inferred = None
    return result


def _ruled_out(fitted: Optional[Probe], batch: int, growth_bytes: Optional[float]) -> Optional[str]:
    """Why `batch` cannot fit, from the probe of a smaller batch that fitted and the trace's growth per sample; None
    where it may (or where the probe measured no training memory: a GPU's allocator peak is not compared)."""
    if not growth_bytes or fitted is None or fitted.training_bytes is None or fitted.budget_bytes is None:
        return None
    headroom = fitted.budget_bytes - fitted.training_bytes
    least = INFER_SHARE * growth_bytes * (batch - fitted.batch)
    if headroom >= least:
        return None
    return (f"batch {batch} not probed: batch {fitted.batch} measured {fitted.training_bytes / 2**20:.1f} MiB of "
            f"training memory, {headroom / 2**20:.1f} MiB under the budget, and {batch} holds at least "
            f"{least / 2**20:.1f} MiB more ({INFER_SHARE:g} x the trace's {growth_bytes / 2**20:.2f} MiB a sample)")


def guided(model: str, target: str, overrides: List[str], fits_at: Callable[[int], Probe],
            args: argparse.Namespace) -> Search:
    """The guided search: a probe at a small batch measures what the job holds besides tensors (the predictor can
    only assume it: 48 MiB under a budget, 117-127 MiB measured on resnet50 and densenet40 on one VM, 15-58 on
    another), the prediction is shifted by it, and search_guided confirms, ruling out the step above from the
    trace's growth unless `--confirm-above` or a memory plan. Where that probe does not fit, or no prediction can
    be made, the full search runs."""
    began = time.monotonic()
    small = min(args.limit, FIRST_FACTORS[0] * args.start)  # the prediction's first trace
    first = fits_at(small)
    predicted, why, growth = None, f"the probe at batch {small} did not fit ({first.kind})", None
    if first.fits:
        measured = (small, first.training_bytes) if first.training_bytes is not None else None
        # traced as the probes run: their steps hold as many prepared batches as they run steps, not the config's 8
        predicted, why, growth = predicted_max_batch(model, target, [*overrides, *PROBE], args.start, measured)
    print(f"    predicted max batch: {predicted if predicted else why + ': the full search runs'}", flush=True)
    plan = last_override(overrides, "memory.plan", "none")
    if args.confirm_above or plan != "none":  # a plan (auto) may train a larger batch another way, in less memory
        growth = None
    find = functools.partial(search, start=args.start)
    if predicted:
        find = functools.partial(search_guided, predicted=predicted, growth_bytes=growth)
    result = find(fits_at, limit=args.limit, tolerance=args.tolerance, model=model, probes=[first],
                  spent=time.monotonic() - began)
    if result.inferred:
        print(f"    {result.inferred}", flush=True)
    return result


def _probe_from_summary(batch: int, summary: Optional[Dict[str, Any]], seconds: float, why_missing: str) -> Probe:
    if summary is None:
        return Probe(batch, False, "killed", why_missing, None, seconds)
    failure = summary.get("failure") or {}
    training = measured_training_bytes(summary) if summary.get("mem_peak_source") == "process_rss" else None
    return Probe(batch, bool(summary.get("success")), failure.get("kind"), failure.get("message"),
                 summary.get("mem_peak_bytes"), seconds, (summary.get("memory_plan") or {}).get("label"), training,
                 summary.get("budget_bytes"))


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
