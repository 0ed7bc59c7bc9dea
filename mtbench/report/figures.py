"""The PNG figures of a report: per model across batch sizes, the series of report/series.py; a figure or panel with
nothing measured is left out and listed as "not measured: why" (report/panels.py draws them all alike)."""
from __future__ import annotations

import csv
import io
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List, Optional

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402

from mtbench.regular_files import read_regular  # noqa: E402
from mtbench.results.console import core_ranges, cpu_by_core_type  # noqa: E402
from mtbench.report.jobs import boards, job_label, value_at  # noqa: E402
from mtbench.report.panels import (NotMeasured, Panel, batch_axis, lines_figure, metric, reasons, save,  # noqa: E402
                                   scalar, styles)

def _save(fig, path: Path) -> str:
    return save(fig, path)


def fig_time(groups, out: Path, not_measured: NotMeasured) -> Optional[str]:
    made = lines_figure(groups, [
        Panel("step time (median)", "seconds", metric("step_time"), "step_time_s", from_zero=True),
        Panel("throughput", "samples / s", metric("throughput"), "throughput_samples_per_s", from_zero=True)],
        not_measured)
    return _save(made[0], out / "step_time_throughput.png") if made else None


def fig_utilization(groups, out: Path, not_measured: NotMeasured) -> Optional[str]:
    cpu_what = "CPU utilization"
    made = lines_figure(groups, [
        Panel(cpu_what, "% busy (mean over cores)", scalar(lambda j: value_at(j, "cpu_util_pct", "mean")),
              "cpu_util_pct", ylim=(0, 105)),
        Panel("GPU utilization", "% busy", scalar(lambda j: value_at(j, "gpu_util_pct", "mean")), "gpu_util_pct",
              ylim=(0, 105))], not_measured)
    if not made:
        return None
    fig, axes = made
    a = axes.get(cpu_what)
    if a is not None:
        style = styles(groups)
        typed = False
        for model, js in groups.items():
            if _core_type_lines(a, model, js, style[model]["color"]):
                typed = True
                continue
            # no core types (not a Jetson): the per-core spread as a band around the mean
            pts = [(j["batch_size"], [c for c in (j.get("cpu_util_pct") or {}).get("per_core") or [] if c is not None])
                   for j in js if j.get("success")]
            pts = [(x, cs) for x, cs in pts if cs]
            if pts:
                a.fill_between([x for x, _ in pts], [min(cs) for _, cs in pts], [max(cs) for _, cs in pts],
                               alpha=0.15, color=style[model]["color"])
        if typed:
            a.set_title("CPU utilization (mean; thin: per core type)", fontsize=10)
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


def fig_power(groups, out: Path, others: Optional[List[Dict[str, Any]]] = None,
              not_measured: Optional[NotMeasured] = None) -> Optional[str]:
    every = [j for js in groups.values() for j in js] + list(others or [])
    jobs = [j for j in every if j.get("success") and j.get("power_w")]
    if not jobs:
        if not_measured is not None:
            not_measured.append(("mean power per rail", reasons(every, "power_w")))
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(jobs) + 3), 4.5))
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
    if len(boards(jobs)) > 1:  # board names are long: one turned line per bar, a name cut in its middle
        labels = [" ".join(_short(x) for x in job_label(j, with_board=True).split("\n")) for j in jobs]
        ax.set_xticklabels(labels, rotation=90)
        fig.set_figheight(4.5 + 0.075 * max(len(x) for x in labels))
    else:
        ax.set_xticklabels([job_label(j) for j in jobs])
    ax.set_ylabel("W (mean over measured steps)")
    ax.set_ylim(bottom=0)
    ax.set_title("mean power per rail")
    ax.tick_params(axis="x", labelsize=8)
    return _save(fig, out / "power.png")


def _short(text: str, most: int = 40) -> str:
    """A long board name cut in its middle: its head and its tail (where "@ host" tells two boards apart) stay."""
    if len(text) <= most:
        return text
    tail = (most - 1) // 2
    return text[:most - 1 - tail] + "\u2026" + text[-tail:]


def fig_energy(groups, out: Path, not_measured: NotMeasured) -> Optional[str]:
    made = lines_figure(groups, [
        Panel("energy per step", "J", metric("energy_per_step"), "energy_j", from_zero=True),
        Panel("energy per sample", "J", metric("energy_per_sample"), "energy_j", from_zero=True)], not_measured)
    return _save(made[0], out / "energy.png") if made else None


# which peak mem_peak_bytes is, by mem_peak_source (device/peak.py), and the system-wide one
PEAK_TITLES = {"cuda_allocator": "peak GPU memory: CUDA allocator (max_memory_allocated)",
               "process_rss": "peak process memory: resident high-water mark (VmHWM)",
               "process_hwm_lifetime": "peak process memory: lifetime resident high-water mark (VmHWM)",
               "process_ru_maxrss": "peak process memory: lifetime resident peak (ru_maxrss)"}
SYSTEM_PEAK_TITLE = "peak system memory in use (MemTotal - MemAvailable)"


def _mib(get):
    return scalar(lambda j: None if get(j) is None else get(j) / 2**20)


def fig_memory(groups, out: Path, not_measured: NotMeasured) -> Optional[str]:
    """A panel per kind of peak (an allocator's count and a process's resident peak are not one quantity), y from
    0, failed configurations in red."""
    jobs = [j for js in groups.values() for j in js]
    sources = sorted(set(str(j.get("mem_peak_source")) for j in jobs if j.get("success") and j.get("mem_peak_source")))

    def of(src):
        return lambda j: str(j.get("mem_peak_source")) == src

    panels = [Panel(PEAK_TITLES.get(src, f"peak memory ({src})"), "MiB", _mib(lambda j: value_at(j, "mem_peak_bytes")),
                    "mem_peak_bytes", from_zero=True, mark_failed=True, applies=of(src)) for src in sources]
    panels = panels or [Panel("peak memory", "MiB", _mib(lambda j: value_at(j, "mem_peak_bytes")), "mem_peak_bytes",
                              from_zero=True, mark_failed=True)]
    if any(j.get("success") and value_at(j, "mem_system_peak_bytes") is not None for j in jobs):
        panels.append(Panel(SYSTEM_PEAK_TITLE, "MiB", _mib(lambda j: value_at(j, "mem_system_peak_bytes")),
                            "mem_system_peak_bytes", from_zero=True, mark_failed=True))
    else:  # failures alone are marked once, in the panel above
        not_measured.append((SYSTEM_PEAK_TITLE, reasons(jobs, "mem_system_peak_bytes")))
    made = lines_figure(groups, panels, not_measured, width_in=6.0)
    return _save(made[0], out / "memory.png") if made else None


BREAKDOWN_PARTS = ("parameters", "gradients", "optimizer_state", "activations", "inputs", "other")


def fig_memory_breakdown(groups, out: Path, not_measured: NotMeasured) -> Optional[str]:
    """Where the peak goes (mem_breakdown_bytes): one panel per model, a stacked bar per batch size."""
    models = [(m, [j for j in js if j.get("mem_breakdown_bytes")]) for m, js in groups.items()]
    shown = [(m, js) for m, js in models if js]
    by_reason: Dict[str, List[str]] = defaultdict(list)  # one line per reason, naming the models or jobs
    for m, js in models:
        missing = [j for j in groups[m] if not j.get("mem_breakdown_bytes")]
        if missing:
            where = m if not js else f"{m} b{', b'.join(str(j['batch_size']) for j in missing)}"
            by_reason[reasons(missing, "mem_breakdown_bytes")].append(where)
    for why, where in by_reason.items():
        not_measured.append(("memory breakdown" + (f": {', '.join(where)}" if shown else ""), why))
    if not shown:
        return None
    cols = min(3, len(shown))
    rows = -(-len(shown) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols + 1.5, 3.6 * rows), squeeze=False)
    flat_axes = [a for row in axes for a in row]
    for ax, (model, js) in zip(flat_axes, shown):
        xs = [j["batch_size"] for j in js]
        bottom = [0.0] * len(js)
        # a bar from x/1.25 to x*1.25: the same width at every batch size on the log2 axis
        lefts, widths = [x / 1.25 for x in xs], [x * 1.25 - x / 1.25 for x in xs]
        for k, part in enumerate(BREAKDOWN_PARTS):
            vals = [(j["mem_breakdown_bytes"].get(part) or 0) / 2**20 for j in js]
            ax.bar(lefts, vals, width=widths, bottom=bottom, align="edge", color=f"C{k}", label=part.replace("_", " "))
            bottom = [b + v for b, v in zip(bottom, vals)]
        for x, j, top in zip(xs, js, bottom):
            if not j.get("success"):  # e.g. over the target's budget: the breakdown says why
                kind = str((j.get("failure") or {}).get("kind") or "failed")
                ax.annotate(kind.upper(), (x, top), ha="center", va="bottom", fontsize=8, color="red")
        batch_axis(ax, xs)
        ax.set_ylim(bottom=0)
        ax.set_title(model, fontsize=10)
        ax.set_ylabel("MiB at the tracked peak")
        ax.grid(alpha=0.3, axis="y")
    for ax in flat_axes[len(shown):]:
        ax.axis("off")
    fig.suptitle("where the peak memory goes (one extra unmeasured step, torch MemTracker)", fontsize=10)
    return _save(fig, out / "memory_breakdown.png")


MAX_OPS_BYTES = 64 * 2**20  # an ops.csv holds a row per operation name: kilobytes to a few MiB


def fig_profile(job: Dict[str, Any], root: Path, out: Path, top: int = 12,
                not_measured: Optional[NotMeasured] = None) -> Optional[str]:
    ops_path = Path(job.get("_root") or root) / job.get("_rel", job["_dir"]) / "ops.csv"
    left_out = not_measured if not_measured is not None else []
    try:  # a regular file only: a FIFO planted there must not hang the report
        text = read_regular(str(ops_path), MAX_OPS_BYTES).decode("utf-8", "replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        left_out.append((f"operations ({job['_dir']})", f"ops.csv not read: {exc}"))
        return None
    try:
        rows = [r for r in csv.DictReader(io.StringIO(text)) if r.get("device")]
        rows = sorted(rows, key=lambda r: -float(r["total_s"] or 0))[:top][::-1]
        for r in rows:
            float(r["total_s"]), float(r["energy_j"] or 0)  # noqa: B018 - every figure drawn below is a number
    except (KeyError, ValueError, TypeError) as exc:
        left_out.append((f"operations ({job['_dir']})", f"{ops_path} is not an ops.csv mtbench wrote "
                                                        f"({type(exc).__name__}: {exc})"))
        return None
    energy = any(r["energy_j"] for r in rows)
    fig, axes = plt.subplots(1, 2 if energy else 1, figsize=(12 if energy else 6.5, 0.35 * len(rows) + 2),
                             squeeze=False)
    a = axes[0][0]
    names = [r["name"][:40] for r in rows]
    a.barh(names, [float(r["total_s"]) for r in rows])
    a.set_xlabel("seconds (profiled steps)")
    a.set_title("time per operation")
    # on a GPU the energy is split along the kernels: host-op rows carry time only, and say so
    if energy:
        b = axes[0][1]
        b.barh(names, [float(r["energy_j"]) if r["energy_j"] else 0.0 for r in rows], color="tab:orange")
        for k, r in enumerate(rows):
            if not r["energy_j"]:
                b.text(0, k, " n/a (energy on the kernel timeline)" if r["device"] == "cpu" else " n/a",
                       va="center", fontsize=7, color="0.4")
        b.set_xlabel("J")
        b.set_title("energy per operation")
        b.set_yticklabels([])
    elif not_measured is not None:  # no power sensor: the time panel alone
        not_measured.append((f"energy per operation ({job['_dir']})", reasons([job], "energy_j")))
    fig.suptitle(f"{job.get('model') or job['_dir']} batch {job.get('batch_size')}: operations")
    where = job["_dir"] if job["_dir"] != "." else f"{job.get('model')}-b{job.get('batch_size')}"
    name = f"profile_{where.replace('/', '_')}.png"
    return _save(fig, out / name)
