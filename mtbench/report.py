"""`mtbench report DIR`: the tables and figures of a run or a sweep (found recursively), in DIR/report/.

summary.csv (one row per job, every scalar of summary.json flattened, failed jobs included), README.md with
the tables, and PNG figures of the kinds the paper shows, per model across batch sizes. A metric a machine
did not measure is said to be "not measured on this machine" in its figure, never plotted as 0.
"""
from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402

from mtbench.errors import UsageError  # noqa: E402
from mtbench.results import atomic_write, csv_text  # noqa: E402

NOT_MEASURED = "not measured on this machine"


def find_summaries(root: Path) -> List[Dict[str, Any]]:
    jobs = []
    for path in sorted(root.rglob("summary.json")):
        if "report" in path.relative_to(root).parts[:-1]:
            continue
        try:
            summary = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"{path}: not a readable summary.json ({exc})") from None
        if str(summary.get("schema", "")).startswith("mtbench.summary/"):
            summary["_dir"] = str(path.parent.relative_to(root)) or "."
            jobs.append(summary)
    return jobs


def flatten(value: Any, prefix: str = "") -> Dict[str, Any]:
    if isinstance(value, dict):
        out: Dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list):
        out = {}
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}.{i}"))
        return out
    return {prefix: value}


def _get(job: Dict[str, Any], *keys: str) -> Optional[float]:
    v: Any = job
    for k in keys:
        if not isinstance(v, dict):
            return None
        v = v.get(k)
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _has_batch(job: Dict[str, Any]) -> bool:
    """Jobs on a batch-size axis: a `mtbench-sample` run has no batch size (null) and is in the tables only."""
    b = job.get("batch_size")
    return isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0


def _label(job: Dict[str, Any]) -> str:
    return f"{job.get('model')}\nb{job.get('batch_size')}" if _has_batch(job) else str(job.get("_dir"))


def by_model(jobs: List[Dict[str, Any]]) -> Dict[str, List[Dict[str, Any]]]:
    """Jobs with a batch size, per model, in batch order (the figures' x axis)."""
    groups: Dict[str, List[Dict[str, Any]]] = defaultdict(list)
    for j in jobs:
        if _has_batch(j):
            groups[str(j.get("model"))].append(j)
    return {m: sorted(js, key=lambda j: j.get("batch_size") or 0) for m, js in sorted(groups.items())}


def _not_measured(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"{what}:\n{NOT_MEASURED}", ha="center", va="center", transform=ax.transAxes, fontsize=11,
            color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _lines(ax, groups, metric: Callable[[Dict[str, Any]], Optional[float]], ylabel: str, what: str,
           mark_failed: bool = False, ylim: Optional[tuple] = None) -> None:
    plotted = False
    missing = []
    for i, (model, js) in enumerate(groups.items()):
        ok = [(j["batch_size"], metric(j)) for j in js if j.get("success") and metric(j) is not None]
        missing += [f"{model} b{j['batch_size']}" for j in js if j.get("success") and metric(j) is None]
        if ok:
            xs, ys = zip(*ok)
            ax.plot(xs, ys, marker="o", label=model, color=f"C{i % 10}")  # one colour per model in every figure
            plotted = True
        if mark_failed:
            for j in js:
                if not j.get("success"):
                    kind = (j.get("failure") or {}).get("kind", "failed")
                    ax.axvline(j["batch_size"], color="red", alpha=0.25, lw=6)
                    ax.annotate(f"{model}: {kind.upper()}", (j["batch_size"], 0.02), xycoords=("data", "axes fraction"),
                                rotation=90, fontsize=8, color="red", va="bottom", ha="right")
                    plotted = True
    if not plotted:
        _not_measured(ax, what)
        return
    if missing:
        ax.text(0.01, 0.99, f"{NOT_MEASURED}: {', '.join(missing)}", transform=ax.transAxes, fontsize=7,
                va="top", color="0.4")
    ax.set_xscale("log", base=2)
    if ylim:
        ax.set_ylim(*ylim)
    ax.set_xlabel("batch size")
    ax.set_ylabel(ylabel)
    ax.set_title(what)
    ax.grid(alpha=0.3)
    if any(ax.get_legend_handles_labels()[1]):
        ax.legend(fontsize=8)


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def fig_time(groups, out: Path) -> str:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    _lines(a, groups, lambda j: _get(j, "step_time_s", "median"), "seconds", "step time (median)")
    _lines(b, groups, lambda j: _get(j, "throughput_samples_per_s"), "samples / s", "throughput")
    return _save(fig, out / "step_time_throughput.png")


def fig_utilization(groups, out: Path) -> str:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    _lines(a, groups, lambda j: _get(j, "cpu_util_pct", "mean"), "% busy (mean over cores)", "CPU utilization",
           ylim=(0, 105))
    # per-core spread as a band around the mean
    for i, (model, js) in enumerate(groups.items()):
        pts = [(j["batch_size"], [c for c in (j.get("cpu_util_pct") or {}).get("per_core", []) if c is not None])
               for j in js if j.get("success")]
        pts = [(x, cs) for x, cs in pts if cs]
        if pts:
            a.fill_between([x for x, _ in pts], [min(cs) for _, cs in pts], [max(cs) for _, cs in pts], alpha=0.15,
                           color=f"C{i % 10}")
    _lines(b, groups, lambda j: _get(j, "gpu_util_pct", "mean"), "% busy", "GPU utilization", ylim=(0, 105))
    return _save(fig, out / "utilization.png")


def fig_power(groups, out: Path, others: Optional[List[Dict[str, Any]]] = None) -> str:
    jobs = [j for js in groups.values() for j in js if j.get("success") and j.get("power_w")]
    jobs += [j for j in others or [] if j.get("success") and j.get("power_w")]
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(jobs) + 3), 4.5))
    if not jobs:
        _not_measured(ax, "mean power per rail")
        return _save(fig, out / "power.png")
    rails = list(dict.fromkeys(r for j in jobs for r in j["power_w"]))
    totals = set(r for j in jobs for r in (j.get("energy_j") or {}).get("total_rails", []))
    # stack the rails that lie inside the total rail; draw the total rail as a marker on top
    stacked = [r for r in rails if r not in totals] if len(totals) < len(rails) else rails
    labels = [_label(j) for j in jobs]
    bottom = [0.0] * len(jobs)
    for rail in stacked:
        vals = [j["power_w"].get(rail) or 0.0 for j in jobs]  # a rail a job lacks: no bar
        ax.bar(labels, vals, bottom=bottom, label=rail)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for rail in rails:
        if rail not in stacked:
            ax.plot(labels, [j["power_w"].get(rail) for j in jobs], "k_", markersize=20, mew=2, label=f"{rail} (total)")
    ax.set_ylabel("W (mean over measured steps)")
    ax.set_title("mean power per rail")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.tick_params(axis="x", labelsize=8)
    return _save(fig, out / "power.png")


def fig_energy(groups, out: Path) -> str:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    _lines(a, groups, lambda j: _get(j, "energy_j", "per_step_mean"), "J", "energy per step")
    _lines(b, groups, lambda j: (_get(j, "energy_j", "per_step_mean") or float("nan")) / j["batch_size"]
           if _get(j, "energy_j", "per_step_mean") is not None else None, "J", "energy per sample")
    return _save(fig, out / "energy.png")


def fig_memory(groups, out: Path) -> str:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    _lines(ax, groups, lambda j: (_get(j, "mem_peak_bytes") or 0) / 2**20 if _get(j, "mem_peak_bytes") else None,
           "MiB", "peak memory (failed configurations in red)", mark_failed=True)
    return _save(fig, out / "memory.png")


BREAKDOWN_PARTS = ("parameters", "gradients", "optimizer_state", "activations", "inputs", "other")


def fig_memory_breakdown(groups, out: Path) -> str:
    """Where the peak goes (mem_breakdown_bytes): one panel per model, a stacked bar per batch size."""
    models = [(m, [j for j in js if j.get("mem_breakdown_bytes")]) for m, js in groups.items()]
    shown = [(m, js) for m, js in models if js]
    cols = min(3, max(1, len(shown)))
    rows = max(1, -(-len(shown) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols + 1.5, 3.6 * rows), squeeze=False)
    flat_axes = [a for row in axes for a in row]
    if not shown:
        _not_measured(flat_axes[0], "memory breakdown (mem_breakdown_bytes)")
    for ax, (model, js) in zip(flat_axes, shown):
        labels = [str(j["batch_size"]) for j in js]
        bottom = [0.0] * len(js)
        for k, part in enumerate(BREAKDOWN_PARTS):
            vals = [(j["mem_breakdown_bytes"].get(part) or 0) / 2**20 for j in js]
            ax.bar(labels, vals, bottom=bottom, color=f"C{k}", label=part.replace("_", " "))
            bottom = [b + v for b, v in zip(bottom, vals)]
        for x, j in enumerate(js):
            if not j.get("success"):  # e.g. over the target's budget: the breakdown says why
                kind = (j.get("failure") or {}).get("kind", "failed")
                ax.annotate(kind.upper(), (x, bottom[x]), ha="center", va="bottom", fontsize=8, color="red")
        missing = [str(j["batch_size"]) for j in groups[model] if not j.get("mem_breakdown_bytes")]
        if missing:
            ax.text(0.01, 0.99, f"no breakdown at batch {', '.join(missing)}", transform=ax.transAxes, fontsize=7,
                    va="top", color="0.4")
        ax.set_title(model)
        ax.set_xlabel("batch size")
        ax.set_ylabel("MiB at the tracked peak")
        ax.grid(alpha=0.3, axis="y")
    for ax in flat_axes[max(1, len(shown)):]:
        ax.axis("off")
    if shown:
        flat_axes[0].legend(fontsize=7, loc="upper left")
    without = [m for m, js in models if not js]
    fig.suptitle("where the peak memory goes (one extra unmeasured step, torch MemTracker)"
                 + (f"\nno breakdown: {', '.join(without)}" if without else ""), fontsize=10)
    return _save(fig, out / "memory_breakdown.png")


def fig_profile(job: Dict[str, Any], root: Path, out: Path, top: int = 12) -> Optional[str]:
    ops_path = root / job["_dir"] / "ops.csv"
    if not ops_path.exists():
        return None
    with open(ops_path) as f:
        rows = [r for r in csv.DictReader(f) if r.get("device")]
    rows = sorted(rows, key=lambda r: -float(r["total_s"] or 0))[:top][::-1]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 0.35 * len(rows) + 2))
    names = [r["name"][:40] for r in rows]
    a.barh(names, [float(r["total_s"]) for r in rows])
    a.set_xlabel("seconds (profiled steps)")
    a.set_title("time per operation")
    # on a GPU the energy is split along the kernels: host-op rows carry time only, and say so
    if any(r["energy_j"] for r in rows):
        b.barh(names, [float(r["energy_j"]) if r["energy_j"] else 0.0 for r in rows], color="tab:orange")
        for k, r in enumerate(rows):
            if not r["energy_j"]:
                b.text(0, k, " n/a (energy on the kernel timeline)" if r["device"] == "cpu" else " n/a",
                       va="center", fontsize=7, color="0.4")
        b.set_xlabel("J")
        b.set_title("energy per operation")
        b.set_yticklabels([])
    else:
        _not_measured(b, "energy per operation")
    fig.suptitle(f"{job.get('model') or job['_dir']} batch {job.get('batch_size')}: operations")
    where = job["_dir"] if job["_dir"] != "." else f"{job.get('model')}-b{job.get('batch_size')}"
    name = f"profile_{where.replace('/', '_')}.png"
    return _save(fig, out / name)


def plan_cell(job: Dict[str, Any]) -> str:
    """The memory plan a job ran under (memory_plan.label; `auto:` when auto chose it, `->` for each re-plan)."""
    plan = job.get("memory_plan")
    if not isinstance(plan, dict):
        return "none"  # a summary from before memory plans: plain training
    labels = [r.get("from") for r in plan.get("replans") or []] + [plan.get("label")]
    return ("auto: " if plan.get("setting") == "auto" else "") + " -> ".join(str(x) for x in labels)


def readme(jobs: List[Dict[str, Any]], figures: List[str]) -> str:
    def cell(v: Optional[float], spec: str) -> str:
        return "n/a" if v is None else format(v, spec)

    lines = ["# mtbench report", "", f"{len(jobs)} job(s). n/a: {NOT_MEASURED} (or the job failed).", "",
             "| job | model | batch | device | data | result | step median s | samples/s | CPU % | GPU % | "
             "energy/step J | peak memory MiB | memory plan |", "|" + "---|" * 13]
    for j in jobs:
        result = "ok" if j.get("success") else f"**{(j.get('failure') or {}).get('kind', 'failed')}**"
        mem = _get(j, "mem_peak_bytes")
        lines.append(" | ".join([
            f"| {j['_dir']}", str(j.get("model")), str(j.get("batch_size")), str(j.get("device")), str(j.get("data")),
            result, cell(_get(j, "step_time_s", "median"), ".4f"), cell(_get(j, "throughput_samples_per_s"), ".2f"),
            cell(_get(j, "cpu_util_pct", "mean"), ".1f"), cell(_get(j, "gpu_util_pct", "mean"), ".1f"),
            cell(_get(j, "energy_j", "per_step_mean"), ".3f"), cell(mem / 2**20 if mem else None, ".1f"),
            plan_cell(j)]) + " |")
    unbatched = [j["_dir"] for j in jobs if not _has_batch(j)]
    if unbatched:
        lines += ["", f"Without a batch size (`mtbench-sample` runs), in this table and the power figure only, not "
                      f"on the batch-size axes: {', '.join(unbatched)}."]
    failed = [j for j in jobs if not j.get("success")]
    if failed:
        lines += ["", "## Failed jobs", ""] + [f"- {j['_dir']}: {(j.get('failure') or {}).get('kind')}: "
                                                f"{(j.get('failure') or {}).get('message')}" for j in failed]
    lines += ["", "## Figures", ""] + [f"![{f}]({f})" for f in figures]
    return "\n".join(lines) + "\n"


def make_report(root: Path) -> Path:
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"report: {root} is not a directory; give a run or multirun folder")
    jobs = find_summaries(root)
    if not jobs:
        raise UsageError(f"report: no summary.json under {root}")
    out = root / "report"
    out.mkdir(exist_ok=True)
    flat = [flatten({k: v for k, v in j.items() if k != "_dir"}) for j in jobs]
    keys = list(dict.fromkeys(["job"] + [k for f in flat for k in f]))
    rows = [[j["_dir"]] + [f.get(k) for k in keys[1:]] for j, f in zip(jobs, flat)]
    atomic_write(out / "summary.csv", csv_text(keys, rows))
    groups = by_model(jobs)
    others = [j for j in jobs if not _has_batch(j)]  # mtbench-sample runs: no batch axis
    figures = [fig_power(groups, out, others)]
    if groups:  # the figures across batch sizes
        figures = [fig_time(groups, out), fig_utilization(groups, out)] + figures + [fig_energy(groups, out),
                                                                                    fig_memory(groups, out)]
        figures.append(fig_memory_breakdown(groups, out))
    figures += [f for f in (fig_profile(j, root, out) for j in jobs if j.get("profiled")) if f]
    atomic_write(out / "README.md", readme(jobs, figures))
    return out


def main(args: List[str]) -> None:
    if args in (["--help"], ["-h"]):
        print("usage: mtbench report DIR\n\nWrites DIR/report/: summary.csv, README.md and figures of every job "
              "(summary.json) under DIR, a run or multirun folder (see README: Reports).")
        return
    if len(args) != 1:
        raise UsageError("usage: mtbench report DIR (a run or multirun folder)")
    out = make_report(Path(args[0]))
    print(f"report written to {out}")
