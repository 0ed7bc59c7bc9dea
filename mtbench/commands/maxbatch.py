"""`mtbench maxbatch model=X target=tx2`: the largest batch that trains within the budget, searched per model (and
per memory plan) with campaign.maxbatch's probes; a table on the console and maxbatch.json."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Callable, List, Optional

from mtbench.campaign.maxbatch import PROBE, SCHEMA, Probe, Search, _models, default_prober, guided, search
from mtbench.config_schema import last_override, sets_key
from mtbench.errors import UsageError
from mtbench.results.files import atomic_write


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
    parser.add_argument("--confirm-above", action="store_true",
                        help="guided: probe the step above the answer even where the probe at the answer measured too "
                             "little headroom for it under the budget (by default it is not probed, and said so)")
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
    target = last_override(fixed, "target", "none")
    # memory.plan=X (not none): each model is searched with memory.plan=none and with X, side by side
    plan = last_override(fixed, "memory.plan", "none")
    fixed = [o for o in fixed if not sets_key(o, "memory.plan")]
    plans = ["none"] if plan == "none" else ["none", plan]
    if target == "none" and not any(sets_key(o, key) for o in fixed
                                    for key in ("memory.budget_gb", "target.memory_budget_bytes")):
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
    """The budget the probes were held to: memory.budget_gb, target.memory_budget_bytes=N (either also with + or
    ++, as Hydra takes them), or the target's."""
    from mtbench.device.targets import load_target

    for o in reversed(fixed):
        key, _, value = o.partition("=")
        key = key.lstrip("+")
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
            f"{r.first_failing_batch} ({failing.kind})" if failing else f"{r.first_failing_batch} (inferred)"
            if r.inferred else ("n/a" if not r.error else r.error[:40]),
            fmt_bytes(at_max.peak_bytes) if at_max else "n/a",
            str(len(r.probes)),
            f"{r.seconds:.0f} s",
        )
    console.print(table)


if __name__ == "__main__":
    sys.exit(main())
