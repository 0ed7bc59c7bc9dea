"""`python -m mtbench`: the same as the `mtbench` command."""
from __future__ import annotations

from mtbench.commands.cli import main

if __name__ == "__main__":
    main()
