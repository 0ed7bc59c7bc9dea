"""What MKL's memory manager keeps of a CPU job's training memory, side by side in one run.

    python benchmarks/mkl_buffers.py [--jobs seq2seq:2,dqn:8] [--steps 3]

Each job (warm-up 1, --steps measured steps, no profiler) runs twice, each time in a fresh process: with MKL's
memory manager as torch starts it, and with MKL_DISABLE_FAST_MM=1 (read by MKL as the process starts: each product's
buffers go back to malloc after it). Prints the training memory less the runtime (what the predictor is compared
with in benchmarks/predict_accuracy.py) and the summary's mem_mkl_bytes for both, and the differences: where MKL's
statistics account for the memory, the two differences are close. Run it alone on the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

def run(model: str, batch: int, steps: int, fast_mm: bool) -> dict:
    """The job as benchmarks/predict_accuracy.py runs it (run_job_child), in a fresh process; its summary."""
    env = {k: v for k, v in os.environ.items() if k != "MKL_DISABLE_FAST_MM"}
    env["PYTHONPATH"] = str(REPO)
    if not fast_mm:
        env["MKL_DISABLE_FAST_MM"] = "1"
    code = (f"from benchmarks.predict_accuracy import run_job_child; run_job_child({model!r}, {batch}, OUT, "
            f"steps={steps}, profile=False)")
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run([sys.executable, "-c", f"OUT = {out!r}; {code}"], capture_output=True, text=True,
                              env=env, cwd=REPO)
        summary = Path(out) / "summary.json"
        if proc.returncode != 0 or not summary.is_file():
            raise SystemExit(f"{model} b{batch}: the job failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
        return json.loads(summary.read_text())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="seq2seq:2,dqn:8", help="model:batch,... (default: seq2seq:2,dqn:8)")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    mib = 2 ** 20
    print("| job | training memory less the runtime | mem_mkl_bytes | the same, MKL_DISABLE_FAST_MM=1 | "
          "training difference | MKL difference |")
    print("|---|---|---|---|---|---|")
    for job in args.jobs.split(","):
        model, _, batch = job.partition(":")
        on, off = (run(model, int(batch), args.steps, fast) for fast in (True, False))
        if on["mem_mkl_bytes"] is None or off["mem_mkl_bytes"] is None:
            print(f"| {model} b{batch} | MKL's statistics: {on['mem_mkl_note']} | | | | |")
            continue
        train = [(r["mem_training_bytes"] - (r["budget_runtime_bytes"] or 0)) / mib for r in (on, off)]
        mkl = [r["mem_mkl_bytes"] / mib for r in (on, off)]
        print(f"| {model} b{batch} | {train[0]:.1f} MiB | {mkl[0]:.1f} MiB | {train[1]:.1f} MiB, {mkl[1]:.1f} MiB | "
              f"{train[0] - train[1]:.1f} MiB | {mkl[0] - mkl[1]:.1f} MiB |", flush=True)


if __name__ == "__main__":
    from mtbench.job.signals import install_terminate_handlers

    install_terminate_handlers()  # SIGTERM (`timeout`, `kill`) as Ctrl-C: the running job child goes with it
    main()
