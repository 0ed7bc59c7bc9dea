"""`mtbench power [--root DIR]`: the board's nvpmodel modes (its /etc/nvpmodel.conf) and the mode it is in now."""
from __future__ import annotations

import os
import sys
from typing import List

from mtbench.device import power_sysfs as fs

USAGE = "usage: mtbench power [--root DIR]"


def main(argv: List[str]) -> int:
    root = "/"
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-h", "--help"):
            print(f"{USAGE}\n\nLists the nvpmodel modes of this Jetson (DIR/etc/nvpmodel.conf; DIR: the sysfs root, "
                  "/ by default) for power.nvpmodel=ID|NAME; docs/power.md describes every power.* key.")
            return 0
        if arg == "--root" and args:
            root = args.pop(0)
        elif arg.startswith("--root="):
            root = arg[len("--root="):]
        else:
            print(f"mtbench: error: power: unknown argument {arg!r}; allowed: --root DIR, --help ({USAGE})",
                  file=sys.stderr)
            return 2
    modes = fs.nvpmodel_modes(root)
    if not modes:
        print(f"mtbench: error: power: no nvpmodel modes in {os.path.join(root, fs.NVPMODEL_CONF)} (not a Jetson, "
              "or not readable); power.nvpmodel needs one", file=sys.stderr)
        return 2
    current = fs.nvpmodel_mode(root)
    print("nvpmodel modes (power.nvpmodel=ID or NAME):")
    for mode_id, name in sorted(modes.items()):
        print(f"  {mode_id:>3}  {name}{'   (current)' if mode_id == current else ''}")
    return 0
