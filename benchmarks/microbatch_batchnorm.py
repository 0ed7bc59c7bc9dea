"""How far micro-batches move a BatchNorm network's gradients from the full batch's (each micro-batch is normalized by
its own statistics): relative L2 difference and cosine of one step's gradients, for 2, 4 and 8 micro-batches, with
BatchNorm in training mode, and in eval mode as the control (there micro-batches must give the same gradients).

    python benchmarks/microbatch_batchnorm.py [model=resnet50] [batch=32] [image_size=16]
"""
from __future__ import annotations

import sys
from typing import Dict, Tuple

import torch

from mtbench.config import instantiate
from mtbench.data.synthetic import Synthetic
from mtbench.workload.plans import NONE, MemoryPlan
from mtbench.workload.base import SetupContext
from tests.workload.test_plans import compose_cfg, grads_after_step, workload


def difference(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> Tuple[float, float]:
    keys = [k for k in a if not k.startswith("buffer:")]
    dot = sum(float((a[k] * b[k]).sum()) for k in keys)
    na = sum(float(a[k].norm() ** 2) for k in keys) ** 0.5
    nb = sum(float(b[k].norm() ** 2) for k in keys) ** 0.5
    diff = sum(float((a[k] - b[k]).norm() ** 2) for k in keys) ** 0.5
    return diff / na, dot / (na * nb)


def report(name: str, w) -> None:
    for mode in ("train", "eval"):
        w.net.train(mode == "train")
        full = grads_after_step(w, NONE)
        cells = []
        for n in (2, 4, 8):
            rel, cos = difference(full, grads_after_step(w, MemoryPlan(microbatch=n)))
            cells.append(f"{n}: rel L2 {rel:.3g}, cosine {cos:.4f}")
        print(f"{name}, BatchNorm in {mode} mode: " + "; ".join(cells), flush=True)


def main(argv) -> None:
    opts = {"model": "resnet50", "batch": "32", "image_size": "16"}
    opts.update(a.split("=", 1) for a in argv)
    batch, size = int(opts["batch"]), int(opts["image_size"])
    report("3-convolution CNN with BatchNorm, 8x8, batch 16", workload(batchnorm=True, batch=16))
    cfg = compose_cfg([f"model={opts['model']}", f"data.image_size={size}", f"batch={batch}"])
    torch.manual_seed(0)
    w = instantiate(cfg.model.workload, "model.workload")
    w.setup(SetupContext(torch.device("cpu"), batch, Synthetic(image_size=size), seed=0, batches=1))
    report(f"{opts['model']}, {size}x{size}, batch {batch}", w)


if __name__ == "__main__":
    main(sys.argv[1:])
