"""`mtbench report DIR [DIR ...]`: the tables and figures of runs and sweeps (found recursively), keyed by board.

report.html (the report as one self-contained page), summary.csv (one row per job, every scalar of summary.json
flattened, failed jobs included), README.md with the tables, and PNG figures of the kinds the paper shows, per
model across batch sizes: one series per model, board (where the jobs ran on several) and combination of the settings
that vary between the model's jobs (report/series.py). A figure or panel a machine measured nothing for is left out
and listed as "not measured: why", never plotted as 0.
"""
from __future__ import annotations

__all__ = ["make_report"]


def __getattr__(name: str):
    # on first use, not at import: `mtbench models` (report.catalog) need not load matplotlib
    if name == "make_report":
        from mtbench.report.build import make_report

        return make_report
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
