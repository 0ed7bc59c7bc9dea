"""Measurement overhead: mtbench's step time (5 ms sampler on) against a bare PyTorch loop of the same
model and batch, for each sampler mode side by side (`sampler.mode=thread`: a thread of the training process;
`process`: a process of its own), interleaved in one run so that all sides see the same machine state.

    python benchmarks/overhead.py [model=resnet50] [batch=8] [steps=10] [rounds=3] [interval_ms=5]
                                  [modes=process,thread,live]

Prints the median step time of each side per round and the ratio mtbench / bare per mode (goal <= 1.02),
with each mode's sampler fidelity (samples taken of those asked, p99 interval) and own CPU. Modes `live` and
`plain` are the job as `python -m mtbench` runs it (default sampler), each from a fresh process: the job in a forked
child whose parent draws the live line, on a terminal (`live`: a rich console forced to terminal mode, redrawn 4
times a second into /dev/null) or not (`plain`: one line per phase); `live` against `plain`, round by round, is what
drawing the live view costs the measured steps. (A fork from this process, which has run torch, could hang in
OpenMP: hence the fresh processes.)
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from hydra import compose, initialize_config_dir

from mtbench.config import conf_dir, instantiate
from mtbench.data.synthetic import Synthetic
from mtbench.device.peak import release_memory
from mtbench.device.select import resolve_device
from mtbench.job.run import run_job
from mtbench.workload.base import MAX_PREPARED_BATCHES
from mtbench.workload.base import SetupContext


ISOLATED = ("live", "plain")  # modes run as `python -m mtbench` runs a job, each from a fresh process
ISOLATED_CHILD = r"""
import json, os, sys
from rich.console import Console
from mtbench.results import console as console_module
overrides, terminal, out = json.loads(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
devnull = open(os.devnull, "w")
# the live line as on a terminal (redrawn) or as in a log (a line per phase), drawn into /dev/null either way
console_module.console = Console(file=devnull, force_terminal=terminal, width=120)
from hydra import compose, initialize_config_dir
from mtbench.config import conf_dir
from mtbench.job.isolation import run_isolated
with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
    cfg = compose(config_name="config", overrides=overrides)
run_isolated(cfg, out)
"""


def isolated_job(overrides: List[str], terminal: bool, out: Path) -> dict:
    """One job as the command line runs it (forked from a fresh parent that draws the live line); its summary."""
    import json
    import os
    import subprocess

    repo = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-c", ISOLATED_CHILD, json.dumps(overrides), "1" if terminal else "0", str(out)],
                   check=True, cwd=repo, env=env)
    return json.loads((out / "summary.json").read_text())


def bare_loop(cfg, steps: int, warmup: int) -> float:
    """What a user would write by hand: build, warm up, time each step with perf_counter."""
    import torch

    device = resolve_device(cfg.device.name)
    workload = instantiate(cfg.model.workload, "model.workload")
    workload.setup(SetupContext(device, cfg.batch, Synthetic(), cfg.seed, min(MAX_PREPARED_BATCHES, warmup + steps)))
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        workload.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    del workload
    release_memory(device)
    return statistics.median(times)


def main() -> None:
    args = dict(a.split("=", 1) for a in sys.argv[1:])
    model, batch = args.get("model", "resnet50"), int(args.get("batch", 8))
    steps, rounds, interval = int(args.get("steps", 10)), int(args.get("rounds", 3)), args.get("interval_ms", "5")
    modes = args.get("modes", "process,thread,live,plain").split(",")
    overrides = [f"model={model}", f"batch={batch}", f"steps={steps}", "warmup=3", f"sampler.interval_ms={interval}",
                 f"device={args.get('device', 'auto')}"]
    cfgs = {}
    for mode in modes:
        if mode in ISOLATED:
            continue
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfgs[mode] = compose(config_name="config", overrides=overrides + [f"sampler.mode={mode}"])
    sides = ["bare"] + modes
    times: Dict[str, List[float]] = {side: [] for side in sides}
    sampler: Dict[str, List[dict]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            # rotate which side goes first, so that drift over the run does not favour any
            order = sides[r % len(sides):] + sides[: r % len(sides)]
            for side in order:
                if side == "bare":
                    times[side].append(bare_loop(cfgs[next(m for m in modes if m not in ISOLATED)], steps, 3))
                else:
                    out = Path(tmp) / f"round{r}-{side}"
                    summary = isolated_job(overrides, side == "live", out) if side in ISOLATED else \
                        run_job(cfgs[side], out)
                    times[side].append(summary["step_time_s"]["median"])
                    sampler[side].append(summary["sampler"])
            print(f"round {r}: bare {times['bare'][-1]:.4f} s  " + "  ".join(
                f"{m} {times[m][-1]:.4f} s (ratio {times[m][-1] / times['bare'][-1]:.3f})" for m in modes))
    bare = statistics.median(times["bare"])
    print(f"{model} batch {batch}, {steps} steps x {rounds} rounds, sampler {interval} ms: median step bare {bare:.4f} s")
    for mode in modes:
        st = sampler[mode]
        print(f"  sampler.mode={mode:8s}: median step {statistics.median(times[mode]):.4f} s, "
              f"ratio {statistics.median(times[mode]) / bare:.3f} (goal <= 1.02); "
              f"samples taken {statistics.median(_taken_pct(s) for s in st):.2f} % of asked, "
              f"p99 interval {statistics.median(s['achieved_interval_ms']['p99'] for s in st):.2f} ms, "
              f"sampler CPU {statistics.median(s['cpu_pct_of_one_core'] for s in st):.2f} % of one core (medians of rounds)")
    if "live" in modes and "plain" in modes:
        pairs = [lv / pl for lv, pl in zip(times["live"], times["plain"])]
        print(f"  the live line drawn on a terminal: live / plain per round {', '.join(f'{x:.3f}' for x in pairs)}; "
              f"median {statistics.median(pairs):.3f} (plain / bare across rounds, the machine's own spread: "
              f"{min(t / b for t, b in zip(times['plain'], times['bare'])):.3f} to "
              f"{max(t / b for t, b in zip(times['plain'], times['bare'])):.3f})")


def _taken_pct(stats: dict) -> float:
    """Samples taken of those asked: each period of the sampled span is either taken or counted as dropped."""
    return 100.0 * stats["samples"] / (stats["samples"] + stats["dropped"])


if __name__ == "__main__":
    from mtbench.job.signals import install_terminate_handlers

    install_terminate_handlers()  # SIGTERM (`timeout`, `kill`) as Ctrl-C: the running job child goes with it
    main()
