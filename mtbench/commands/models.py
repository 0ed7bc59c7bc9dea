"""`mtbench models [overrides]`: the benchmark models, their parameters, GFLOP per sample and input."""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides the listing is built with (e.g. data.image_size=64)")


def run(args: argparse.Namespace) -> int:
    from mtbench.config import check_overrides
    from mtbench.report.catalog import print_models

    check_overrides(args.overrides)
    print_models(args.overrides)
    return 0
