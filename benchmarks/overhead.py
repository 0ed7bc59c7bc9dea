"""Measurement overhead: mtbench's step time (5 ms sampler on) against a bare PyTorch loop of the same
model and batch, interleaved in one run so that both see the same machine state.

    python benchmarks/overhead.py [model=resnet50] [batch=8] [steps=10] [rounds=3] [interval_ms=5]

Prints the median step time of each side per round and the ratio mtbench / bare (goal <= 1.02).
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from mtbench.config import conf_dir, instantiate
from mtbench.data import Synthetic
from mtbench.memory import release_memory
from mtbench.runner import MAX_PREPARED_BATCHES, resolve_device, run_job
from mtbench.workload import SetupContext


def bare_loop(cfg, steps: int, warmup: int) -> float:
    """What a user would write by hand: build, warm up, time each step with perf_counter."""
    import torch

    device = resolve_device(cfg.device.name)
    workload = instantiate(cfg.model.workload)
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
    overrides = [f"model={model}", f"batch={batch}", f"steps={steps}", "warmup=3", f"sampler.interval_ms={interval}",
                 f"device={args.get('device', 'auto')}"]
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    bare, tool = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            # alternate which side goes first, so that drift over the run does not favour either
            order = ("bare", "mtbench") if r % 2 == 0 else ("mtbench", "bare")
            for side in order:
                if side == "bare":
                    bare.append(bare_loop(cfg, steps, 3))
                else:
                    summary = run_job(cfg, Path(tmp) / f"round{r}")
                    tool.append(summary["step_time_s"]["median"])
            print(f"round {r}: bare {bare[-1]:.4f} s  mtbench {tool[-1]:.4f} s  ratio {tool[-1] / bare[-1]:.3f}")
    ratio = statistics.median(tool) / statistics.median(bare)
    print(f"{model} batch {batch}, {steps} steps x {rounds} rounds, sampler {interval} ms: "
          f"median step bare {statistics.median(bare):.4f} s, mtbench {statistics.median(tool):.4f} s, "
          f"ratio {ratio:.3f} (goal <= 1.02)")


if __name__ == "__main__":
    main()
