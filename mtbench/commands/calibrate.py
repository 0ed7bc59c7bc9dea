"""`mtbench calibrate DIR [key=value ...]`: fit the predictor's time and runtime-memory model to a finished sweep."""
from __future__ import annotations

import argparse
from pathlib import Path

from mtbench.commands.predict import CALIBRATE_KEYS, CALIBRATE_USAGE, split_settings
from mtbench.errors import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = CALIBRATE_USAGE
    parser.add_argument("settings", nargs="*", metavar="DIR|key=value",
                        help="the sweep folder; target=, out=, time_stat=, profile= (true: jobs without an ops.csv "
                             "are run again profiled, so per-op times are fitted) and the overrides the sweep ran with")


def run(args: argparse.Namespace) -> int:
    from mtbench.predict import require_torch

    require_torch()
    own, rest, positional = split_settings(args.settings, CALIBRATE_USAGE, CALIBRATE_KEYS)
    if len(positional) != 1:
        raise UsageError(f"one sweep folder is needed; usage: {CALIBRATE_USAGE}")
    from mtbench.commands.predict import _bool
    from mtbench.predict.fit import calibrate

    profile = _bool("profile", own.get("profile", "false"))
    if own.get("target") is not None:
        from mtbench.config import group_options

        if own["target"] not in group_options("target"):
            raise UsageError(f"target={own['target']!r} is not known; allowed: {', '.join(group_options('target'))}")
    if own.get("out"):  # a calibration file: refused before the fit where it cannot be written
        from mtbench.campaign.folders import writable_folder

        if Path(own["out"]).is_dir():
            raise UsageError(f"out={own['out']!r} is a folder; allowed: a file name in a folder this user can write")
        writable_folder(Path(own["out"]).parent, "out=")
    cal, path, report = calibrate(Path(positional[0]), target=own.get("target"), out=own.get("out"),
                                  overrides=tuple(rest), time_stat=own.get("time_stat", "median"),
                                  profile=profile)
    for line in report:
        print(line)
    print(f"calibration for {cal.key} written to {path}")
    return 0
