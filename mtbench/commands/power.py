"""`mtbench power [--root DIR]`: the board's nvpmodel modes (its /etc/nvpmodel.conf) and the mode it is in now."""
from __future__ import annotations

import argparse
import os

from mtbench.errors import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", default="/", metavar="DIR",
                        help="the sysfs root whose etc/nvpmodel.conf is read (default /; a container may mount the "
                             "host's elsewhere). docs/power.md describes every power.* key")


def run(args: argparse.Namespace) -> int:
    from mtbench.device import power_sysfs as fs

    modes = fs.nvpmodel_modes(args.root)
    if not modes:
        raise UsageError(f"power: no nvpmodel modes in {os.path.join(args.root, fs.NVPMODEL_CONF)} (not a Jetson, or "
                         "not readable); power.nvpmodel needs one")
    current = fs.nvpmodel_mode(args.root)
    print("nvpmodel modes (power.nvpmodel=ID or NAME):")
    for mode_id, name in sorted(modes.items()):
        print(f"  {mode_id:>3}  {name}{'   (current)' if mode_id == current else ''}")
    return 0
