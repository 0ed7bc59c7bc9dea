from __future__ import annotations

from mtbench.cli import main

if __name__ == "__main__":
    main()
