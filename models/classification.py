"""Image classification: the training step of every CNN in the suite (cross-entropy, SGD by default)."""
from __future__ import annotations

from typing import Any, Dict, List, Sequence

import torch
import torch.nn.functional as F

from mtbench.workload import SetupContext, Workload, optimizer_from


class ImageClassification(Workload):
    def __init__(self, net: torch.nn.Module, optimizer: Any, input_shape: Sequence[int], num_classes: int) -> None:
        self.net = net
        self.make_optimizer = optimizer
        self.input_shape = tuple(input_shape)
        self.num_classes = int(num_classes)

    def setup(self, ctx: SetupContext) -> None:
        self.net.to(ctx.device).train()
        self.optimizer = optimizer_from(self.make_optimizer, self.net.parameters())
        batches = ctx.data.image_batches(ctx.batch_size, ctx.batches, self.input_shape, self.num_classes, ctx.seed)
        self.batches = [(x.to(ctx.device), y.to(ctx.device)) for x, y in batches]
        self.i = 0

    def step(self) -> None:
        x, y = self.batches[self.i % len(self.batches)]
        self.i += 1
        self.optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.net(x), y)
        loss.backward()
        self.optimizer.step()

    def modules(self) -> List[torch.nn.Module]:
        return [self.net]

    def extra_metrics(self, measured_steps: int) -> Dict[str, Any]:
        return {"input_shape": list(self.input_shape)}  # one sample: channels, height, width
