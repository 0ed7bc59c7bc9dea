"""Training memory's spread over fresh runs, the page cache cold and warm: the same job four times, torch's,
torchvision's and numpy's shared objects evicted (posix_fadvise DONTNEED) before runs 1 and 3, side by side with
VmHWM (mem_peak_bytes), which counts the libraries' mapped pages; under memory.cpu_malloc=auto (the default: the
measured steps under glibc's own malloc, training memory from two untimed steps with the threshold fixed), glibc
(every figure under glibc's own dynamic threshold) and live (every step with the threshold fixed), side by side.

    python benchmarks/training_memory_spread.py                     # mobilenetv2 b16 and resnet50 b8, quiet
    python benchmarks/training_memory_spread.py --busy              # beside a busy loop on every core
    python benchmarks/training_memory_spread.py --job model=squeezenet,batch=8
    python benchmarks/training_memory_spread.py --malloc auto --malloc cached   # other malloc settings

Prints, per job and malloc setting, each run's training memory and VmHWM (MiB) and each one's spread:
(max - min) / median, and the median step time of the four runs (what the setting costs in speed).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.device.test_training_memory import _evict_libraries  # noqa: E402

JOBS = ["model=mobilenetv2,batch=16", "model=resnet50,batch=8"]
COMMON = ["device=cpu", "warmup=1", "steps=3", "memory.breakdown=false"]


def _spin() -> None:
    while True:
        pass


MALLOCS = ["auto", "glibc", "live"]


def run_four(job: str, malloc: str, out: Path) -> list:
    figures = []
    for run in range(4):
        if run % 2 == 0:
            _evict_libraries()
        folder = out / f"{job.replace(',', '_').replace('=', '-')}-{malloc}-{run}"
        proc = subprocess.run([sys.executable, "-m", "mtbench", *job.split(","), *COMMON,
                               f"memory.cpu_malloc={malloc}", f"hydra.run.dir={folder}"],
                              cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{job}: run {run} failed: {proc.stderr.strip().splitlines()[-1:]}")
        summary = json.loads((folder / "summary.json").read_text())
        figures.append((summary["mem_training_bytes"], summary["mem_peak_bytes"], summary["step_time_s"]["median"]))
    return figures


def spread(values: list) -> float:
    return (max(values) - min(values)) / statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", action="store_true", help="a busy loop on every core beside the runs")
    parser.add_argument("--job", action="append", help="overrides joined by commas (default: the two above)")
    parser.add_argument("--malloc", action="append", choices=["auto", "glibc", "live", "cached"],
                        help="memory.cpu_malloc settings to run (default: auto, glibc and live)")
    args = parser.parse_args()
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(os.cpu_count() or 1)] \
        if args.busy else []
    for p in spinners:
        p.start()
    try:
        with tempfile.TemporaryDirectory() as out:
            for job in args.job or JOBS:
                for malloc in args.malloc or MALLOCS:
                    figures = run_four(job, malloc, Path(out))
                    training, hwm = [f[0] for f in figures], [f[1] for f in figures]
                    step_s = statistics.median(f[2] for f in figures)
                    print(f"{job} cpu_malloc={malloc} ({'busy' if args.busy else 'quiet'}; runs 1 and 3 cold): "
                          f"training memory "
                          f"{', '.join(f'{t / 2**20:.1f}' for t in training)} MiB, spread {spread(training):.2%}; "
                          f"VmHWM {', '.join(f'{h / 2**20:.1f}' for h in hwm)} MiB, spread {spread(hwm):.2%}; "
                          f"step {step_s:.3f} s",
                          flush=True)
    finally:
        for p in spinners:
            p.terminate()


if __name__ == "__main__":
    from mtbench.job.signals import install_terminate_handlers

    install_terminate_handlers()  # SIGTERM (`timeout`, `kill`) as Ctrl-C: the running job child goes with it
    main()
