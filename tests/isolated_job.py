"""`python tests/isolated_job.py OUT_DIR OVERRIDE...`: one job through job.isolation.run_isolated in a fresh process
(forking from pytest's process, where other tests ran torch ops, would not be the parent mtbench is), with the
test workloads allowed. Prints the summary as JSON on the last line; exit 130 on Ctrl-C (128 + the signal
for SIGTERM and SIGHUP)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mtbench import config  # noqa: E402
from tests.helpers.compose import compose_cfg  # noqa: E402

config.ALLOWED_TARGET_PREFIXES = config.ALLOWED_TARGET_PREFIXES + ("tests.",)

if __name__ == "__main__":
    from mtbench.job.isolation import run_isolated

    try:
        summary = run_isolated(compose_cfg(sys.argv[2:]), Path(sys.argv[1]))
    except KeyboardInterrupt as exc:  # 130 for Ctrl-C; SIGTERM 143, SIGHUP 129, as the mtbench command exits
        from mtbench.job.signals import exit_code

        sys.exit(exit_code(exc))
    print(json.dumps(summary))
