"""`mtbench models [overrides]`: the benchmark models, their parameters, GFLOP per sample and input."""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides the listing is built with (e.g. data.image_size=64)")
    parser.add_argument("--no-cache", action="store_true",
                        help="count every model's FLOPs again, neither reading nor writing the cache "
                             "(~/.cache/mtbench/models)")


def run(args: argparse.Namespace) -> int:
    from mtbench.config_overrides import check_overrides
    from mtbench.report.catalog import print_models
    from mtbench.report.flop_cache import FlopCache

    check_overrides(args.overrides)
    print_models(args.overrides, cache=None if args.no_cache else FlopCache())
    return 0
