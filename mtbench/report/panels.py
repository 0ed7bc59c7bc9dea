"""How every report figure is drawn: one batch-size axis, panels only where something was measured (the rest listed
as "not measured: why"), error bars, legends outside the data."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402

from mtbench.report.jobs import board_of  # noqa: E402
from mtbench.report.spread import REPEATS_NOTE, Point, point  # noqa: E402
from mtbench.results.files import atomic_write_bytes  # noqa: E402

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.", ":")

NotMeasured = List[Tuple[str, str]]  # (what is missing, why): listed in README.md and report.html, never drawn


class Panel(NamedTuple):
    what: str  # the panel's title: what it shows
    ylabel: str
    value: Callable[[Dict[str, Any]], Optional[Point]]  # a successful job's point, None where it has none
    reason_key: str  # the summary key whose `unavailable` entry says why a job has no value
    ylim: Optional[tuple] = None
    from_zero: bool = False  # the y axis starts at 0 (memory, power: a reader compares heights)
    mark_failed: bool = False  # failed configurations as red bands (memory: where the OOMs are)
    applies: Callable[[Dict[str, Any]], bool] = lambda j: True  # jobs this panel is about (e.g. one peak source)


def metric(name: str) -> Callable[[Dict[str, Any]], Optional[Point]]:
    """A panel value with its error bar (report/spread.py)."""
    return lambda j: point(j, name)


def scalar(get: Callable[[Dict[str, Any]], Optional[float]]) -> Callable[[Dict[str, Any]], Optional[Point]]:
    """A panel value without an error bar."""
    def value(j: Dict[str, Any]) -> Optional[Point]:
        v = get(j)
        return None if v is None else Point(v, None, None, "")
    return value


def reasons(jobs: Sequence[Dict[str, Any]], key: str) -> str:
    """Why `key` is missing in these jobs: their summaries' `unavailable` reasons, each once."""
    said = [str((j.get("unavailable") or {}).get(key)) for j in jobs
            if isinstance(j.get("unavailable"), dict) and (j.get("unavailable") or {}).get(key)]
    if said:
        return "; ".join(dict.fromkeys(said))
    if jobs and not any(j.get("success") for j in jobs):
        return "no job succeeded"
    return "not in these summaries"


def styles(groups: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Dict[str, Any]]:
    """One colour per model in every figure; one marker and line style per board and settings (report/series.py)."""
    def model(js: List[Dict[str, Any]]) -> str:
        return str(js[0].get("model")) if js else ""

    def kind(js: List[Dict[str, Any]]) -> Tuple[str, str]:
        return (str(js[0].get("_board") or board_of(js[0])), str(js[0].get("_variant") or "")) if js else ("", "")

    models = sorted(set(model(js) for js in groups.values()))
    kinds = sorted(set(kind(js) for js in groups.values()))
    out = {}
    for name, js in groups.items():
        m, b = models.index(model(js)), kinds.index(kind(js))
        out[name] = {"color": f"C{m % 10}", "marker": MARKERS[b % len(MARKERS)],
                     "linestyle": LINESTYLES[b % len(LINESTYLES)]}
    return out


def batch_axis(ax, batches: Sequence[float]) -> None:
    """The one batch-size axis of every figure: log2 spacing, a tick at each batch size run, labelled 1, 2, 4..."""
    xs = sorted(set(int(b) for b in batches))
    ax.set_xscale("log", base=2)
    ax.set_xlim(xs[0] / 1.5, xs[-1] * 1.5)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("batch size")


def legend_outside(fig) -> None:
    """One legend for the figure, right of every panel: never over the data."""
    handles, labels = [], []
    for ax in fig.axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label and not label.startswith("_") and label not in labels:
                handles.append(h)
                labels.append(label)
    if labels:
        # centred on the right edge: clear of the panels and of a wide top-right panel title
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)


def save_png(fig, path: Path) -> None:
    """`fig` as a PNG at `path`, written as every result file is (a link planted there is replaced, not written
    through); "tight": a legend right of the panels is kept."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())


def save(fig, path: Path) -> str:
    fig.tight_layout()
    legend_outside(fig)
    save_png(fig, path)
    plt.close(fig)
    return path.name


def lines_figure(groups: Dict[str, List[Dict[str, Any]]], panels: Sequence[Panel], not_measured: NotMeasured,
                 width_in: float = 5.5) -> Optional[Tuple[Any, Dict[str, Any]]]:
    """(figure, {panel what: axes}) with a panel per Panel that has a value for some job, across batch sizes, one
    series per group; panels without one go to `not_measured`. None where no panel has anything."""
    jobs = [j for js in groups.values() for j in js]
    shown = []
    for p in panels:
        ok = [j for j in jobs if j.get("success") and p.applies(j) and p.value(j) is not None]
        failed = [j for j in jobs if not j.get("success")] if p.mark_failed else []
        if ok or (failed and not [j for j in jobs if j.get("success") and p.applies(j)]):
            shown.append(p)
        else:
            not_measured.append((p.what, reasons([j for j in jobs if p.applies(j)] or jobs, p.reason_key)))
    if not shown:
        return None
    fig, axes = plt.subplots(1, len(shown), figsize=(width_in * len(shown), 4), squeeze=False)
    drawn, bars = {}, False
    for ax, p in zip(axes[0], shown):
        bars = _draw_panel(ax, groups, p, not_measured) or bars
        drawn[p.what] = ax
    if bars:  # below the panels, outside the data
        fig.text(0.0, -0.02, REPEATS_NOTE, fontsize=7, color="0.4", va="top")
    return fig, drawn


def _draw_panel(ax, groups: Dict[str, List[Dict[str, Any]]], p: Panel, not_measured: NotMeasured) -> bool:
    """Draws one panel; True where it has error bars."""
    style = styles(groups)
    any_bars = False
    missing: Dict[str, List[str]] = {}
    batches = []
    for model, js in groups.items():
        pts = [(j["batch_size"], p.value(j)) for j in js if j.get("success") and p.applies(j)]
        for j in js:
            if j.get("success") and p.applies(j) and p.value(j) is None:
                missing.setdefault(reasons([j], p.reason_key), []).append(f"{model} b{j['batch_size']}")
        pts = [(x, v) for x, v in pts if v is not None]
        batches += [x for x, _ in pts]
        if pts:
            xs = [x for x, _ in pts]
            ys = [v.value for _, v in pts]
            ax.plot(xs, ys, label=model, **style[model])
            bars = [(x, v) for x, v in pts if v.lo is not None and v.hi is not None]
            if bars:
                any_bars = True
                below = [max(0.0, v.value - v.lo) for _, v in bars]
                above = [max(0.0, v.hi - v.value) for _, v in bars]
                ax.errorbar([x for x, _ in bars], [v.value for _, v in bars], yerr=[below, above], fmt="none",
                            ecolor=style[model]["color"], capsize=3, lw=1)
        if p.mark_failed:
            for j in js:
                if not j.get("success"):
                    kind = str((j.get("failure") or {}).get("kind") or "failed")
                    ax.axvline(j["batch_size"], color="red", alpha=0.25, lw=6)
                    ax.annotate(f"{model}: {kind.upper()}", (j["batch_size"], 0.02),
                                xycoords=("data", "axes fraction"), rotation=90, fontsize=8, color="red",
                                va="bottom", ha="right")
                    batches.append(j["batch_size"])
    for why, where in missing.items():
        not_measured.append((f"{p.what}: {', '.join(where)}", why))
    if batches:
        batch_axis(ax, batches)
    if p.ylim:
        ax.set_ylim(*p.ylim)
    elif p.from_zero:
        ax.set_ylim(bottom=0)
    ax.set_ylabel(p.ylabel)
    ax.set_title(p.what, fontsize=10)
    ax.grid(alpha=0.3)
    return any_bars
