"""`mtbench report DIR [DIR ...]`: the command, its arguments and where the report goes."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from mtbench.errors import UsageError
from mtbench.report.accuracy import fig_accuracy
from mtbench.report.figures import (fig_energy, fig_memory, fig_memory_breakdown, fig_power, fig_profile, fig_time,
                                    fig_utilization)
from mtbench.report.html import write_page
from mtbench.report.pareto import fig_pareto
from mtbench.report.datawait import fig_datawait
from mtbench.report.jobs import assign_boards, find_summaries, fold_repeats, has_batch, root_labels
from mtbench.report.series import by_series
from mtbench.report.tables import csv_columns, readme, sheet_cell
from mtbench.results.files import atomic_write, csv_text


def make_report(roots: Any, out: Optional[Path] = None) -> Path:
    """The report of the jobs under one folder or several (e.g. one sweep per board); written to `out`, by default
    DIR/report for one folder and the folders' common parent's report/ for several."""
    roots = [Path(r) for r in (roots if isinstance(roots, (list, tuple)) else [roots])]
    if not roots:
        raise UsageError("report: give at least one run or multirun folder")
    for root in roots:
        if not root.is_dir():
            raise UsageError(f"report: {root} is not a directory; give a run or multirun folder")
    found = [find_summaries(root, label) for root, label in zip(roots, root_labels(roots))]
    jobs = fold_repeats([j for js, _ in found for j in js])
    unreadable = [u for _, us in found for u in us]
    if not jobs:
        if unreadable:  # nothing to report: the first bad file, in one line
            more = f"; {len(unreadable) - 1} more unreadable" if len(unreadable) > 1 else ""
            raise UsageError(f"report: {unreadable[0]['path']}: not a readable summary.json "
                             f"({unreadable[0]['reason']}){more}")
        raise UsageError(f"report: no summary.json under {' '.join(str(r) for r in roots)}")
    assign_boards(jobs)
    if out is None:
        out = roots[0] / "report" if len(roots) == 1 else default_out(roots)
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        _write_report(jobs, unreadable, out)
    except OSError as exc:  # a read-only or full folder: one line, whatever file it failed on
        raise UsageError(f"report: cannot write to {out} ({exc.strerror or exc}); give another with --out DIR") \
            from None
    return out


def _write_report(jobs: List[Dict[str, Any]], unreadable: List[Dict[str, str]], out: Path) -> None:
    flat = [csv_columns(j) for j in jobs] + [{"unreadable": u["reason"]} for u in unreadable]
    keys = list(dict.fromkeys(["job"] + [k for f in flat for k in f]))
    dirs = [j["_dir"] for j in jobs] + [u["_dir"] for u in unreadable]
    rows = [[sheet_cell(d)] + [sheet_cell(f.get(k)) for k in keys[1:]] for d, f in zip(dirs, flat)]
    atomic_write(out / "summary.csv", csv_text(keys, rows))
    groups = by_series(jobs)  # one line per model, board and combination of the settings that vary
    others = [j for j in jobs if not has_batch(j)]  # mtbench-sample runs: no batch axis
    not_measured: List[Tuple[str, str]] = []  # (what, why) of a figure or panel left out: nothing to draw
    figures = [fig_power(groups, out, others, not_measured)]
    if groups:  # the figures across batch sizes
        figures = [fig_time(groups, out, not_measured), fig_utilization(groups, out, not_measured)] + figures + [
            fig_energy(groups, out, not_measured), fig_memory(groups, out, not_measured)]
        figures.append(fig_memory_breakdown(groups, out, not_measured))
    figures += [fig_profile(j, Path(j["_root"]), out, not_measured=not_measured) for j in jobs if j.get("profiled")]
    figures += fig_pareto(jobs, out)  # jobs that vary power.*: the time-energy front per model
    figures += fig_accuracy(groups, out)  # runs to a target (until.*): accuracy against time and energy
    figures += fig_datawait(jobs, out)  # jobs on data.loader=dataloader: compute and data wait across data.workers
    figures = [f for f in figures if f]  # every figure file written, in order: README.md and report.html show each
    atomic_write(out / "README.md", readme(jobs, figures, unreadable, not_measured))
    write_page(jobs, figures, not_measured, unreadable, out)


def default_out(roots: List[Path]) -> Path:
    """Several folders: report/ in their common parent (which holds them all), never the file system's root."""
    common = Path(os.path.commonpath([os.path.abspath(r) for r in roots]))
    if common == Path(common.anchor):
        raise UsageError(f"report: {' '.join(str(r) for r in roots)} share no parent folder; give --out DIR")
    return common / "report"
