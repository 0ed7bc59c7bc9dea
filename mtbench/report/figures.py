"""The PNG figures of a report: per model across batch sizes, one series per (model, board)."""
from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402

from mtbench.results.console import core_ranges, cpu_by_core_type  # noqa: E402
from mtbench.report.jobs import NOT_MEASURED, board_of, boards, job_label, value_at  # noqa: E402

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.", ":")


def _styles(groups) -> Dict[str, Dict[str, Any]]:
    """One colour per model in every figure; one marker and line style per board."""
    models = sorted(set(str(js[0].get("model")) for js in groups.values() if js))
    board_list = sorted(set(str(js[0].get("_board") or board_of(js[0])) for js in groups.values() if js))
    out = {}
    for name, js in groups.items():
        m = models.index(str(js[0].get("model"))) if js else 0
        b = board_list.index(str(js[0].get("_board") or board_of(js[0]))) if js else 0
        out[name] = {"color": f"C{m % 10}", "marker": MARKERS[b % len(MARKERS)],
                     "linestyle": LINESTYLES[b % len(LINESTYLES)]}
    return out


def _not_measured(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"{what}:\n{NOT_MEASURED}", ha="center", va="center", transform=ax.transAxes, fontsize=11,
            color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _lines(ax, groups, metric: Callable[[Dict[str, Any]], Optional[float]], ylabel: str, what: str,
           mark_failed: bool = False, ylim: Optional[tuple] = None) -> None:
    plotted = False
    missing = []
    styles = _styles(groups)
    for model, js in groups.items():
        ok = [(j["batch_size"], metric(j)) for j in js if j.get("success") and metric(j) is not None]
        missing += [f"{model} b{j['batch_size']}" for j in js if j.get("success") and metric(j) is None]
        if ok:
            xs, ys = zip(*ok)
            ax.plot(xs, ys, label=model, **styles[model])
            plotted = True
        if mark_failed:
            for j in js:
                if not j.get("success"):
                    kind = str((j.get("failure") or {}).get("kind") or "failed")
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
    _legend(ax)


def _legend(ax) -> None:
    """Inside the panel when short; below it when many or long entries (several boards) would hide the lines."""
    labels = ax.get_legend_handles_labels()[1]
    if not any(labels):
        return
    if len(labels) > 4 or max(len(x) for x in labels) > 30:
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    else:
        ax.legend(fontsize=8)


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # "tight": legends below the panels are kept
    plt.close(fig)
    return path.name


def fig_time(groups, out: Path) -> str:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    _lines(a, groups, lambda j: value_at(j, "step_time_s", "median"), "seconds", "step time (median)")
    _lines(b, groups, lambda j: value_at(j, "throughput_samples_per_s"), "samples / s", "throughput")
    return _save(fig, out / "step_time_throughput.png")


def fig_utilization(groups, out: Path) -> str:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    _lines(a, groups, lambda j: value_at(j, "cpu_util_pct", "mean"), "% busy (mean over cores)", "CPU utilization",
           ylim=(0, 105))
    styles = _styles(groups)
    typed = False
    for model, js in groups.items():
        if _core_type_lines(a, model, js, styles[model]["color"]):
            typed = True
            continue
        # no core types (not a Jetson): the per-core spread as a band around the mean
        pts = [(j["batch_size"], [c for c in (j.get("cpu_util_pct") or {}).get("per_core") or [] if c is not None])
               for j in js if j.get("success")]
        pts = [(x, cs) for x, cs in pts if cs]
        if pts:
            a.fill_between([x for x, _ in pts], [min(cs) for _, cs in pts], [max(cs) for _, cs in pts], alpha=0.15,
                           color=styles[model]["color"])
    if typed:
        a.set_title("CPU utilization (mean; thin: per core type)")
        _legend(a)
    _lines(b, groups, lambda j: value_at(j, "gpu_util_pct", "mean"), "% busy", "GPU utilization", ylim=(0, 105))
    return _save(fig, out / "utilization.png")


TYPE_MARKERS = ("v", "^", "<", ">")


def _core_type_lines(ax, model: str, js: List[Dict[str, Any]], color: str) -> bool:
    """One thin line per CPU core type (a TX2: Denver2 and A57) across batch sizes; False where the jobs have fewer
    than two core types (an Orin's cores are all A78AE: the mean is that type's figure)."""
    points: Dict[str, List[tuple]] = defaultdict(list)
    cores: Dict[str, set] = defaultdict(set)
    for j in js:
        for g in (cpu_by_core_type(j) or []) if j.get("success") else []:
            if g["type"] is not None and g["pct"] is not None:
                points[g["name"]].append((j["batch_size"], g["pct"]))
                cores[g["name"]].update(g["cores"])
    if len(points) < 2:
        return False
    for k, (name, pts) in enumerate(points.items()):
        xs, ys = zip(*pts)
        ax.plot(xs, ys, color=color, lw=1, linestyle=":", marker=TYPE_MARKERS[k % len(TYPE_MARKERS)],
                label=f"{model}: {name} (cores {core_ranges(sorted(cores[name]))})")
    return bool(points)


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
    # one bar per job at its own position: two jobs with one label (one model and batch on two boards) stay apart
    xs = list(range(len(jobs)))
    bottom = [0.0] * len(jobs)
    for rail in stacked:
        vals = [j["power_w"].get(rail) or 0.0 for j in jobs]  # a rail a job lacks: no bar
        ax.bar(xs, vals, bottom=bottom, label=rail)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for rail in rails:
        if rail not in stacked:
            ax.plot(xs, [j["power_w"].get(rail) for j in jobs], "k_", markersize=20, mew=2, label=f"{rail} (total)")
    ax.set_xticks(xs)
    ax.set_xticklabels([job_label(j, with_board=len(boards(jobs)) > 1) for j in jobs])
    ax.set_ylabel("W (mean over measured steps)")
    ax.set_title("mean power per rail")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.tick_params(axis="x", labelsize=8)
    return _save(fig, out / "power.png")


def fig_energy(groups, out: Path) -> str:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    _lines(a, groups, lambda j: value_at(j, "energy_j", "per_step_mean"), "J", "energy per step")
    _lines(b, groups, lambda j: (value_at(j, "energy_j", "per_step_mean") or float("nan")) / j["batch_size"]
           if value_at(j, "energy_j", "per_step_mean") is not None else None, "J", "energy per sample")
    return _save(fig, out / "energy.png")


def fig_memory(groups, out: Path) -> str:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    _lines(ax, groups, lambda j: (value_at(j, "mem_peak_bytes") or 0) / 2**20 if value_at(j, "mem_peak_bytes") else None,
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
                kind = str((j.get("failure") or {}).get("kind") or "failed")
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
    ops_path = Path(job.get("_root") or root) / job.get("_rel", job["_dir"]) / "ops.csv"
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
