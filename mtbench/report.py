"""`mtbench report DIR [DIR ...]`: the tables and figures of runs and sweeps (found recursively), keyed by board.

summary.csv (one row per job, every scalar of summary.json flattened, failed jobs included), README.md with
the tables, and PNG figures of the kinds the paper shows, per model across batch sizes, one series per
(model, board) where the jobs ran on more than one board. A metric a machine did not measure is said to be
"not measured on this machine" in its figure, never plotted as 0.
"""
from __future__ import annotations

import csv
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402

from mtbench.console import core_ranges, core_types_line, cpu_by_core_type  # noqa: E402
from mtbench.errors import UsageError  # noqa: E402
from mtbench.results import atomic_write, csv_text  # noqa: E402

NOT_MEASURED = "not measured on this machine"


def find_summaries(root: Path, label: str = "") -> List[Dict[str, Any]]:
    """Every job under root; `_dir` is its folder relative to root, under `label` when several roots are merged."""
    jobs = []
    for path in sorted(root.rglob("summary.json")):
        if "report" in path.relative_to(root).parts[:-1]:
            continue
        try:
            summary = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"{path}: not a readable summary.json ({exc})") from None
        if str(summary.get("schema", "")).startswith("mtbench.summary/"):
            rel = str(path.parent.relative_to(root))
            summary["_dir"] = "/".join(p for p in (label, "" if rel == "." else rel) if p) or "."
            summary["_root"] = str(root)
            summary["_rel"] = rel
            summary["_source"] = label
            jobs.append(summary)
    return jobs


def root_labels(roots: List[Path]) -> List[str]:
    """The shortest trailing parts of each folder's path that tell the folders apart ('' for a single folder)."""
    if len(roots) < 2:
        return [""] * len(roots)
    parts = [Path(os.path.abspath(r)).parts for r in roots]
    for n in range(1, max(len(p) for p in parts) + 1):
        labels = ["/".join(p[-n:]).lstrip("/") or "/" for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    raise UsageError(f"report: a folder is given twice: {' '.join(str(r) for r in roots)}")


def board_of(job: Dict[str, Any]) -> str:
    """What a job ran on: the Jetson board (env.jetson.board), else the GPU's name for a CUDA job, else the CPU
    model, else the host name."""
    env = job.get("env") if isinstance(job.get("env"), dict) else {}
    board = (env.get("jetson") or {}).get("board") if isinstance(env.get("jetson"), dict) else None
    if board:
        return str(board)
    if str(job.get("device", "")).startswith("cuda") and env.get("device_name"):
        return str(env["device_name"])
    return str(env.get("cpu_model") or env.get("host") or "unknown board")


def assign_boards(jobs: List[Dict[str, Any]]) -> None:
    """Set each job's `_board`: board_of, refined by the host and then by the folder given to the report where
    two jobs of one (board, model, batch) came from different hosts or folders, so that no two of them are
    ever merged into one series point."""
    # a job whose process died before it read the board has a summary written by the sweep's parent, with
    # env.host() only (no "jetson" key): it ran on the Jetson its host names in its other jobs
    jetson_of_host: Dict[str, str] = {}
    for j in jobs:
        env = j.get("env") if isinstance(j.get("env"), dict) else {}
        if isinstance(env.get("jetson"), dict) and env["jetson"].get("board") and env.get("host"):
            jetson_of_host.setdefault(str(env["host"]), str(env["jetson"]["board"]))
    by_board: Dict[str, List[Dict[str, Any]]] = defaultdict(list)
    for j in jobs:
        env = j.get("env") if isinstance(j.get("env"), dict) else {}
        inherited = "jetson" not in env and str(env.get("host")) in jetson_of_host
        j["_board_from"] = "env.jetson.board of the host's other jobs" if inherited else board_source(j)
        by_board[jetson_of_host[str(env.get("host"))] if inherited else board_of(j)].append(j)
    for board, js in by_board.items():
        def host(j: Dict[str, Any]) -> str:
            return str((j.get("env") or {}).get("host") or "?")

        levels = [lambda j: board, lambda j: f"{board} @ {host(j)}",
                  lambda j: f"{board} @ {host(j)} [{j.get('_source') or '.'}]"]
        chosen = levels[-1]
        for key in levels:  # the first level at which one point of a series comes from one host and one folder
            origins: Dict[tuple, set] = defaultdict(set)
            for j in js:
                if _has_batch(j):
                    origins[(key(j), j.get("model"), j.get("batch_size"))].add((host(j), j.get("_source")))
            if all(len(o) == 1 for o in origins.values()):
                chosen = key
                break
        for j in js:  # two jobs of one host and folder (a sweep over another knob) stay in one series
            j["_board"] = chosen(j)


def boards(jobs: List[Dict[str, Any]]) -> List[str]:
    return sorted(set(str(j.get("_board") or board_of(j)) for j in jobs))


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


def _label(job: Dict[str, Any], with_board: bool = False) -> str:
    text = f"{job.get('model')}\nb{job.get('batch_size')}" if _has_batch(job) else str(job.get("_dir"))
    return f"{text}\n{job.get('_board') or board_of(job)}" if with_board else text


def series_name(model: str, board: str) -> str:
    return f"{model} @ {board}"


def by_model(jobs: List[Dict[str, Any]]) -> Dict[str, List[Dict[str, Any]]]:
    """Jobs with a batch size, per model (per model and board where they ran on several boards), in batch order
    (the figures' x axis)."""
    several = len(boards(jobs)) > 1
    groups: Dict[str, List[Dict[str, Any]]] = defaultdict(list)
    for j in jobs:
        if _has_batch(j):
            model = str(j.get("model"))
            groups[series_name(model, str(j.get("_board") or board_of(j))) if several else model].append(j)
    return {m: sorted(js, key=lambda j: j.get("batch_size") or 0) for m, js in sorted(groups.items())}


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
    _lines(a, groups, lambda j: _get(j, "step_time_s", "median"), "seconds", "step time (median)")
    _lines(b, groups, lambda j: _get(j, "throughput_samples_per_s"), "samples / s", "throughput")
    return _save(fig, out / "step_time_throughput.png")


def fig_utilization(groups, out: Path) -> str:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    _lines(a, groups, lambda j: _get(j, "cpu_util_pct", "mean"), "% busy (mean over cores)", "CPU utilization",
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
    _lines(b, groups, lambda j: _get(j, "gpu_util_pct", "mean"), "% busy", "GPU utilization", ylim=(0, 105))
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
    ax.set_xticklabels([_label(j, with_board=len(boards(jobs)) > 1) for j in jobs])
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

    typed = any(cpu_by_core_type(j) for j in jobs)  # a Jetson's core types: a column of CPU % per type
    columns = ["job", "model", "batch", "device", "board", "data", "result", "step median s", "samples/s", "CPU %"]
    columns += ["CPU % by core type"] if typed else []
    columns += ["GPU %", "energy/step J", "peak memory MiB", "memory plan"]
    lines = ["# mtbench report", "", f"{len(jobs)} job(s). n/a: {NOT_MEASURED} (or the job failed).", "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for j in jobs:
        result = "ok" if j.get("success") else f"**{(j.get('failure') or {}).get('kind', 'failed')}**"
        mem = _get(j, "mem_peak_bytes")
        by_type = cpu_by_core_type(j)
        row = [f"| {j['_dir']}", str(j.get("model")), str(j.get("batch_size")), str(j.get("device")),
               str(j.get("_board") or board_of(j)), str(j.get("data")), result,
               cell(_get(j, "step_time_s", "median"), ".4f"), cell(_get(j, "throughput_samples_per_s"), ".2f"),
               cell(_get(j, "cpu_util_pct", "mean"), ".1f")]
        row += [core_types_line(by_type) if by_type else "n/a"] if typed else []
        row += [cell(_get(j, "gpu_util_pct", "mean"), ".1f"), cell(_get(j, "energy_j", "per_step_mean"), ".3f"),
                cell(mem / 2**20 if mem else None, ".1f"), plan_cell(j)]
        lines.append(" | ".join(row) + " |")
    lines += ["", "## Boards", "", "| board | jobs | named from | L4T | power mode |", "|---|---|---|---|---|"]
    for board in boards(jobs):
        js = [j for j in jobs if (j.get("_board") or board_of(j)) == board]
        sources = ", ".join(dict.fromkeys(j.get("_board_from") or board_source(j) for j in js))
        lines.append(f"| {board} | {len(js)} | {sources} | {_jetson_cell(js, 'l4t')} | "
                     f"{_jetson_cell(js, 'power_mode')} |")
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


def board_source(job: Dict[str, Any]) -> str:
    env = job.get("env") if isinstance(job.get("env"), dict) else {}
    if isinstance(env.get("jetson"), dict) and env["jetson"].get("board"):
        return "env.jetson.board"
    if str(job.get("device", "")).startswith("cuda") and env.get("device_name"):
        return "GPU name (env.device_name)"
    return "CPU model (env.cpu_model)" if env.get("cpu_model") else "host name (env.host)"


def _jetson_cell(jobs: List[Dict[str, Any]], key: str) -> str:
    """A Jetson field over a board's jobs: one value, or each value seen (a TX2 compared across power modes)."""
    seen = []
    for j in [j for j in jobs if isinstance((j.get("env") or {}).get("jetson"), dict)] or jobs:
        value = ((j.get("env") or {}).get("jetson") or {}).get(key)
        if isinstance(value, dict):  # power_mode: {"id": 0, "name": "MAXN"}
            value = f"{value.get('name')} ({value.get('id')})"
        text = "n/a" if value is None else str(value)
        if text not in seen:
            seen.append(text)
    return ", ".join(seen)


def csv_columns(job: Dict[str, Any]) -> Dict[str, Any]:
    """One summary.csv row: the board, every scalar of summary.json, and the CPU % per core type where known."""
    row = {"board": job.get("_board") or board_of(job)}
    row.update(flatten({k: v for k, v in job.items() if not k.startswith("_")}))
    for g in cpu_by_core_type(job) or []:
        if g["type"] is not None:
            row[f"cpu_util_pct.by_type.{g['type']}"] = None if g["pct"] is None else round(g["pct"], 3)
    return row


def make_report(roots: Any, out: Optional[Path] = None) -> Path:
    """The report of the jobs under one folder or several (e.g. one sweep per board); written to `out`, by default
    DIR/report for one folder and the folders' common parent's report/ for several."""
    roots = [Path(r) for r in (roots if isinstance(roots, (list, tuple)) else [roots])]
    if not roots:
        raise UsageError("report: give at least one run or multirun folder")
    for root in roots:
        if not root.is_dir():
            raise UsageError(f"report: {root} is not a directory; give a run or multirun folder")
    jobs = [j for root, label in zip(roots, root_labels(roots)) for j in find_summaries(root, label)]
    if not jobs:
        raise UsageError(f"report: no summary.json under {' '.join(str(r) for r in roots)}")
    assign_boards(jobs)
    if out is None:
        out = roots[0] / "report" if len(roots) == 1 else default_out(roots)
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"report: cannot write to {out} ({exc.strerror}); give another with --out DIR") from None
    flat = [csv_columns(j) for j in jobs]
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
    figures += [f for f in (fig_profile(j, Path(j["_root"]), out) for j in jobs if j.get("profiled")) if f]
    atomic_write(out / "README.md", readme(jobs, figures))
    return out


def default_out(roots: List[Path]) -> Path:
    """Several folders: report/ in their common parent (which holds them all), never the file system's root."""
    common = Path(os.path.commonpath([os.path.abspath(r) for r in roots]))
    if common == Path(common.anchor):
        raise UsageError(f"report: {' '.join(str(r) for r in roots)} share no parent folder; give --out DIR")
    return common / "report"


USAGE = "usage: mtbench report DIR [DIR ...] [--out OUT]"


def parse_args(args: List[str]) -> tuple:
    """(folders, out or None) from `DIR [DIR ...] [--out OUT]`."""
    dirs: List[str] = []
    out: Optional[str] = None
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--out" or a.startswith("--out="):
            value = a[len("--out="):] if a.startswith("--out=") else (args[i + 1] if i + 1 < len(args) else "")
            if not value or value.startswith("-"):
                raise UsageError(f"report: --out needs a folder ({USAGE})")
            out = value
            i += 1 if a.startswith("--out=") else 2
            continue
        if a.startswith("-"):
            raise UsageError(f"report: unknown option {a!r}; allowed: --out OUT, --help ({USAGE})")
        dirs.append(a)
        i += 1
    if not dirs:
        raise UsageError(f"report: give at least one run or multirun folder ({USAGE})")
    return dirs, out


def main(args: List[str]) -> None:
    if "--help" in args or "-h" in args:
        print(f"{USAGE}\n\nWrites summary.csv, README.md and figures of every job (summary.json) under each DIR, "
              "a run or multirun folder, keyed by the board each job ran on (several DIRs: e.g. one sweep per "
              "board). OUT: DIR/report/ for one DIR, the DIRs' common parent's report/ for several (see README: "
              "Reports).")
        return
    dirs, out_arg = parse_args(args)
    out = make_report([Path(d) for d in dirs], Path(out_arg) if out_arg else None)
    print(f"report written to {out}")
