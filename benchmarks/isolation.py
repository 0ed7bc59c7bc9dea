"""What running each job in its own process costs, measured two ways in one run:

1. per job, the parent's wall time against the child's own time (fork to last message): the fork, the child's
   exit and the messages;
2. side by side, N jobs run one after another as a sweep runs them, each in its own process (run_isolated)
   against the same N jobs in one process (run_job, as before isolation), both started from a fresh interpreter
   with the same modules imported; their difference per job also counts what a child repeats (imports done
   after the fork, its allocator warming up again).

    python benchmarks/isolation.py [model=squeezenet] [batch=1] [jobs=5]

Goal: <= 1 s a job.
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir

from mtbench.config import conf_dir
from mtbench.job.isolation import run_isolated


def sweep_wall_s(mode: str, overrides, jobs: int) -> float:
    """Seconds to run `jobs` jobs in a fresh interpreter, `mode` "isolated" or "in-process"."""
    code = f"""
import sys, tempfile, time
from pathlib import Path
from hydra import compose, initialize_config_dir
from mtbench.config import conf_dir
from mtbench.job.isolation import run_isolated
    from mtbench.job.run import run_job
import torchvision  # imported before the clock starts on both sides
with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
    cfg = compose(config_name="config", overrides={list(overrides)!r})
run = run_isolated if {mode!r} == "isolated" else run_job
with tempfile.TemporaryDirectory() as tmp:
    t0 = time.monotonic()
    for i in range({jobs}):
        assert run(cfg, Path(tmp) / str(i))["success"]
    print(time.monotonic() - t0)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv) -> None:
    opts = {"model": "squeezenet", "batch": "1", "jobs": "5"}
    opts.update(a.split("=", 1) for a in argv)
    overrides = [f"model={opts['model']}", f"batch={opts['batch']}", "device=cpu", "warmup=1", "steps=2"]
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    costs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(int(opts["jobs"])):
            timing = {}
            summary = run_isolated(cfg, Path(tmp) / str(i), timing=timing)
            assert summary["success"], summary["failure"]
            cost = timing["wall_s"] - timing["child_s"]
            costs.append(cost)
            print(f"job {i}: wall {timing['wall_s']:.3f} s, in the child {timing['child_s']:.3f} s, "
                  f"isolation {cost * 1000:.1f} ms")
    print(f"per-job cost of isolation (fork, exit, messages): median {statistics.median(costs) * 1000:.1f} ms, "
          f"worst {max(costs) * 1000:.1f} ms (goal <= 1000 ms)")
    jobs = int(opts["jobs"])
    walls = {mode: sweep_wall_s(mode, overrides, jobs) for mode in ("in-process", "isolated")}
    extra = (walls["isolated"] - walls["in-process"]) / jobs
    print(f"{jobs} jobs in one process {walls['in-process']:.2f} s, each in its own process {walls['isolated']:.2f} s: "
          f"{extra * 1000:+.0f} ms a job (goal <= 1000 ms)")


if __name__ == "__main__":
    from mtbench.job.signals import install_terminate_handlers

    install_terminate_handlers()  # SIGTERM (`timeout`, `kill`) as Ctrl-C: the running job child goes with it
    main(sys.argv[1:])
