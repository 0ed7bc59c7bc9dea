"""power.cpu_cores=1 against 2 on this machine (issue 22): the job's measured CPU stays within one core and its step
time rises. Runs the sweep the issue names, then `mtbench report` on it, and prints the figures side by side.

    python benchmarks/power_cores.py [--out DIR] [--steps 10] [--warmup 2]      # ResNet-50, batch 8 (minutes)
    python benchmarks/power_cores.py --smoke                                      # SqueezeNet, batch 1, 1 step

From the repository root, on a machine nothing else is measuring (its CPU figures are the point): the sweep is
`python -m mtbench -m model=resnet50 batch=8 device=cpu power.cpu_cores=1,2`. The figures go to docs/power.md
with the command and the commit.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent


def mtbench(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "mtbench", *args], cwd=REPO, env=env, capture_output=True, text=True)


def figures(summary: Dict[str, Any]) -> Dict[str, Any]:
    cpu = summary.get("cpu_util_pct") or {}
    read_back = (summary.get("power_mode") or {}).get("read_back") or {}
    return {
        "cores (read back)": read_back.get("cpu_cores"),
        "torch threads": read_back.get("torch_threads"),
        "step median s": (summary.get("step_time_s") or {}).get("median"),
        "samples/s": summary.get("throughput_samples_per_s"),
        # the job's own CPU time over the measured steps, in % of one core: <= ~100 within one core
        "process CPU % of a core": summary.get("process_cpu_pct"),
        "machine CPU % (mean of cores)": cpu.get("mean"),
        "per core %": cpu.get("per_core"),
        "result": "ok" if summary.get("success") else (summary.get("failure") or {}).get("kind"),
    }


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    return "n/a" if value is None else str(value)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="the sweep folder (default: a new temporary one)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="SqueezeNet, batch 1, 1 step: checks the script only")
    args = parser.parse_args(argv)
    if len(os.sched_getaffinity(0)) < 2:
        print("power_cores: this process may use one core only; 1 against 2 cores cannot be compared here")
        return 1
    out = args.out or Path(tempfile.mkdtemp(prefix="mtbench-power-cores-")) / "sweep"
    job = ["model=squeezenet", "batch=1", "steps=1", "warmup=0"] if args.smoke else \
        ["model=resnet50", "batch=8", f"steps={args.steps}", f"warmup={args.warmup}"]
    sweep = ["-m", *job, "device=cpu", "power.cpu_cores=1,2", f"hydra.sweep.dir={out}"]
    print("python -m mtbench " + " ".join(sweep), flush=True)
    run = mtbench(*sweep)
    if run.returncode != 0:
        print(run.stdout[-2000:], run.stderr[-2000:], sep="\n")
        return 1
    summaries = sorted(out.rglob("summary.json"))
    rows = [figures(json.loads(p.read_text())) for p in summaries]
    if len(rows) != 2:
        print(f"power_cores: expected 2 jobs under {out}, found {len(rows)}")
        return 1
    report = mtbench("report", str(out))
    print("\n| figure | power.cpu_cores=1 | power.cpu_cores=2 |\n|---|---|---|")
    for key in rows[0]:
        print(f"| {key} | {fmt(rows[0][key])} | {fmt(rows[1][key])} |")
    one, two = rows[0]["step median s"], rows[1]["step median s"]
    if one and two:
        print(f"\nstep time 1 core / 2 cores: {one / two:.2f}x")
    said = report.stdout.strip().splitlines()[-1] if report.stdout.strip() else report.stderr
    print(f"\nsweep: {out}\nreport: {said}")
    return 0 if report.returncode == 0 else 1


if __name__ == "__main__":
    from mtbench.job.signals import install_terminate_handlers

    install_terminate_handlers()  # SIGTERM (`timeout`, `kill`) as Ctrl-C: the running job child goes with it
    sys.exit(main())
