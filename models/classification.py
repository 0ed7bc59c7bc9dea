"""Image classification: the training step of every CNN in the suite (cross-entropy, SGD by default)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

from mtbench.data.base import IMAGES, BatchRecipe
from mtbench.workload.blocks import sequential_blocks
from mtbench.workload.base import SetupContext, StepLoss, Workload, optimizer_from


class ImageClassification(Workload):
    MICROBATCH = True  # the loss is the mean cross-entropy over the batch's images
    STEP_LEAVES_ONLY_STATE = True  # inputs of one shape; a step keeps only gradients and optimizer state
    EVALUATES_ACCURACY = True  # until.accuracy: top-1 on the held-out images

    def __init__(self, net: torch.nn.Module, optimizer: Any, input_shape: Sequence[int], num_classes: int) -> None:
        self.net = net
        self.make_optimizer = optimizer
        self.input_shape = tuple(input_shape)
        self.num_classes = int(num_classes)
        self._blocks: Optional[List[torch.nn.Module]] = None
        self._blocks_derived = False

    def setup(self, ctx: SetupContext) -> None:
        self.net.to(ctx.device).train()
        self.optimizer = optimizer_from(self.make_optimizer, self.net.parameters())
        batches = ctx.data.image_batches(ctx.batch_size, ctx.batches, self.input_shape, self.num_classes, ctx.seed)
        self.batches = [(x.to(ctx.device), y.to(ctx.device)) for x, y in batches]
        self.i = 0

    def step(self) -> StepLoss:
        x, y = self.batches[self.i % len(self.batches)]
        self.i += 1
        self.optimizer.zero_grad(set_to_none=True)
        # forward and backward under the memory plan (recomputed segments, micro-batches); one update per step
        loss = self.planned_backward(lambda x, y: F.cross_entropy(self.planned_forward(self.net, x), y), x, y)
        self.optimizer.step()
        return loss  # the batch's mean cross-entropy before the update, detached

    def batch_recipe(self) -> Optional[BatchRecipe]:
        return BatchRecipe(IMAGES)  # data.loader=dataloader hands it each step's augmented images

    def take_batch(self, batch: Any) -> None:
        self.batches, self.i = [tuple(batch)], 0  # the pipeline's batch replaces the prepared ones

    def held_out_batches(self, data: Any, batch_size: int) -> List[Any]:
        # kept where the data set is (host memory); each batch goes to the device when evaluated
        return data.held_out_image_batches(batch_size, self.input_shape, self.num_classes)

    def accuracy(self, batches: List[Any]) -> float:
        device = next(self.net.parameters()).device
        self.net.eval()  # BatchNorm's running statistics and no dropout, as a trained network is used
        try:
            with torch.no_grad():  # counted on the device, read back once (one CPU-GPU sync point, not one a batch)
                correct = sum((self.net(x.to(device)).argmax(1) == y.to(device)).sum() for x, y in batches)
        finally:
            self.net.train()
        return int(correct) / max(1, sum(len(y) for _, y in batches))

    def blocks(self) -> Optional[List[torch.nn.Module]]:
        # derived once from the network's children and checked against net(x) on two images
        if not self._blocks_derived:
            device = next(self.net.parameters()).device
            self._blocks = sequential_blocks(self.net, lambda: torch.randn(2, *self.input_shape, device=device))
            self._blocks_derived = True
        return self._blocks

    def modules(self) -> List[torch.nn.Module]:
        return [self.net]

    def extra_metrics(self, measured_steps: int) -> Dict[str, Any]:
        return {"input_shape": list(self.input_shape)}  # one sample: channels, height, width
