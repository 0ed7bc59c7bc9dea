"""`mtbench report DIR [DIR ...] [--out OUT]`: report.build's tables and figures of finished runs and sweeps."""
from __future__ import annotations

import argparse
from pathlib import Path

from mtbench.errors import UsageError
from mtbench.report.build import make_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`mtbench report DIR [DIR ...] [--out OUT]`."""
    parser.usage = "mtbench report DIR [DIR ...] [--out OUT]"
    parser.description = ("Writes report.html, summary.csv, README.md and figures of every job (summary.json) under "
                          "each DIR, a run or multirun folder, keyed by the board each job ran on (several DIRs: e.g. "
                          "one sweep per board). See docs/reports.md.")
    parser.add_argument("dirs", nargs="*", metavar="DIR", help="a run or multirun folder (searched recursively)")
    parser.add_argument("--out", nargs="?", const="", default=None, metavar="OUT",
                        help="where the report goes (default: DIR/report/ for one DIR, the DIRs' common parent's "
                             "report/ for several)")


def run(args: argparse.Namespace) -> int:
    unknown = [d for d in args.dirs if d.startswith("-")]
    if unknown:
        raise UsageError(f"report: unknown option {unknown[0]!r}; allowed: --out OUT, --help")
    if args.out == "":
        raise UsageError("report: --out needs a folder (mtbench report DIR [DIR ...] --out OUT)")
    if not args.dirs:
        raise UsageError("report: give at least one run or multirun folder (mtbench report DIR [DIR ...])")
    out = make_report([Path(d) for d in args.dirs], Path(args.out) if args.out else None)
    print(f"report written to {out}")
    return 0
