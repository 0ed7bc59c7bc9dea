"""Sampler fidelity and cost, measured side by side in one run.

    python benchmarks/sampler.py [seconds=5] [interval_ms=5] [model=resnet50] [batch=8] [steps=10] [rounds=4]

1. Idle fidelity and cost, for procfs alone and procfs + a fake Jetson TX2 tree (6 rails + GPU load): share
   of the requested samples taken (goal >= 99 %), p99 interval (goal <= 6 ms), the sampler's own CPU
   time as % of one core (goal <= 3 %); each for the sampler in a thread of this process (`thread`) and in a
   process of its own (`process`, started before the model is built, as the runner does).
2. The same while a model trains on every core (the case that matters; the issue's: model=vgg19 batch=16).
3. Training step time with the sampler on vs off, interleaved rounds (goal ratio <= 1.01).
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from hydra import compose, initialize_config_dir

from mtbench.config import conf_dir, instantiate
from mtbench.data.synthetic import Synthetic
from mtbench.device.select import resolve_device
from mtbench.sampling import Sampler
from mtbench.sampling.jetson import JetsonSensor
from mtbench.sampling.procfs import ProcfsSensor
from mtbench.sampling.process import ProcessSampler
from mtbench.workload.base import SetupContext

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.fake_sysfs import make_tx2  # noqa: E402  (the same fake tree the tests use)


def fidelity(sampler, seconds: float, interval_ms: float) -> str:
    sampler.start()
    time.sleep(seconds)
    samples = sampler.stop()
    st = sampler.stats()
    # asked: one sample per interval over the span the sampler ran (its first to its last sample)
    asked = (samples.time_s[-1] - samples.time_s[0]) * 1000 / interval_ms + 1
    return (f"taken {100 * st['samples'] / asked:6.2f} % of asked, median {st['achieved_interval_ms']['median']:.3f} ms, "
            f"p99 {st['achieved_interval_ms']['p99']:.3f} ms, dropped {st['dropped']}, "
            f"sampler CPU {st['cpu_pct_of_one_core']:.2f} % of one core")


def build(model: str, batch: int):
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model={model}", f"batch={batch}", "device=auto"])
    device = resolve_device(cfg.device.name)
    workload = instantiate(cfg.model.workload, "model.workload")
    workload.setup(SetupContext(device, batch, Synthetic(), 0, 4))
    return workload, device


def synchronizer(device) -> Callable[[], None]:
    """Waits for the device's queued work: on a GPU a step returns once its kernels are launched, so an
    unsynchronized timer measures launches, not training (a CPU step is done when it returns)."""
    if device.type == "cuda":
        import torch

        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def timed_steps(workload, steps: int, sync: Callable[[], None], sampler=None) -> float:
    if sampler:
        sampler.start()
    times = []
    sync()  # work queued before the timed steps is not theirs
    for _ in range(steps):
        t = time.perf_counter()
        workload.step()
        sync()
        times.append(time.perf_counter() - t)
    if sampler:
        sampler.stop()
    return statistics.median(times)


def main() -> None:
    args = dict(a.split("=", 1) for a in sys.argv[1:])
    seconds, interval = float(args.get("seconds", 5)), float(args.get("interval_ms", 5))
    model, batch = args.get("model", "resnet50"), int(args.get("batch", 8))
    steps, rounds = int(args.get("steps", 10)), int(args.get("rounds", 4))
    tree = Path(tempfile.mkdtemp()) / "tx2"
    make_tx2(tree, {"VDD_IN": 9000, "VDD_SYS_GPU": 3500, "VDD_SYS_CPU": 1500, "VDD_SYS_SOC": 900,
                    "VDD_SYS_DDR": 700, "VDD_4V0_WIFI": 100})
    both = lambda: [ProcfsSensor(), JetsonSensor(str(tree))]  # noqa: E731
    jetson = {"jetson": {"sysfs_root": str(tree)}}
    # process samplers: started now, before the model is built (procfs watches this process, not theirs)
    separate = {(load, names): ProcessSampler(names, jetson, interval)
              for load in ("idle", "load") for names in (("procfs",), ("procfs", "jetson"))}

    print(f"== idle, {seconds:.0f} s at {interval} ms")
    print(f"procfs          thread  : {fidelity(Sampler([ProcfsSensor()], interval), seconds, interval)}")
    print(f"procfs          process : {fidelity(separate['idle', ('procfs',)], seconds, interval)}")
    print(f"procfs + jetson thread  : {fidelity(Sampler(both(), interval), seconds, interval)}")
    print(f"procfs + jetson process : {fidelity(separate['idle', ('procfs', 'jetson')], seconds, interval)}")

    workload, device = build(model, batch)
    sync = synchronizer(device)
    timed_steps(workload, 3, sync)  # warm-up
    stop = threading.Event()

    def train():
        while not stop.is_set():
            workload.step()
            sync()  # on a GPU, keep the queue from growing without bound

    print(f"== while {model} batch {batch} trains, {seconds:.0f} s at {interval} ms")
    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    print(f"procfs          thread  : {fidelity(Sampler([ProcfsSensor()], interval), seconds, interval)}")
    print(f"procfs          process : {fidelity(separate['load', ('procfs',)], seconds, interval)}")
    print(f"procfs + jetson thread  : {fidelity(Sampler(both(), interval), seconds, interval)}")
    print(f"procfs + jetson process : {fidelity(separate['load', ('procfs', 'jetson')], seconds, interval)}")
    stop.set()
    trainer.join()

    print(f"== step time, sampler (procfs + jetson) on vs off, {rounds} rounds x {steps} steps, interleaved")
    off, on = [], []
    for r in range(rounds):
        for side in (("off", "on") if r % 2 == 0 else ("on", "off")):
            if side == "off":
                off.append(timed_steps(workload, steps, sync))
            else:
                on.append(timed_steps(workload, steps, sync, Sampler(both(), interval)))
        print(f"round {r}: off {off[-1]:.4f} s  on {on[-1]:.4f} s  ratio {on[-1] / off[-1]:.3f}")
    print(f"{model} batch {batch}: median step off {statistics.median(off):.4f} s, on {statistics.median(on):.4f} s, "
          f"ratio {statistics.median(on) / statistics.median(off):.3f} (goal <= 1.01)")


if __name__ == "__main__":
    main()
