"""How long a sweep of many jobs takes to start its first job: Hydra's basic sweeper composing 8 jobs at a time
(mtbench's default, hydra.sweeper.max_batch_size=8) against composing all of them first (=null), side by side.

    python benchmarks/sweep_first_job.py [--jobs 100]

Prints the seconds until "[job 1 of N]" for each and their ratio; each sweep is killed once its first job starts.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

REPO = Path(__file__).resolve().parents[1]


def first_job_s(jobs: int, extra: List[str]) -> float:
    folder = tempfile.mkdtemp(prefix="mtbench-first-job-")
    began = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "mtbench", "-m", "model=squeezenet", f"batch=range(1,{jobs + 1})",
                             "steps=1", "warmup=0", "memory.breakdown=false", f"hydra.sweep.dir={folder}",
                             f"lock_dir={folder}", *extra], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), start_new_session=True)
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.startswith("[job 1 of"):
                return time.monotonic() - began
        raise SystemExit("the sweep ended before its first job")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    jobs = parser.parse_args().jobs
    batched = first_job_s(jobs, [])
    whole = first_job_s(jobs, ["hydra.sweeper.max_batch_size=null"])
    print(f"{jobs} jobs: first job after {batched:.1f} s composing 8 at a time, {whole:.1f} s composing all first "
          f"(ratio {whole / batched:.1f})")


if __name__ == "__main__":
    from mtbench.job.signals import install_terminate_handlers

    install_terminate_handlers()  # SIGTERM (`timeout`, `kill`) as Ctrl-C: the running job child goes with it
    main()
