"""Where batches come from. `conf/data/<name>.yaml` instantiates one of these sources.

A workload asks its source for the kind of batch it trains on (`image_batches`, ...). Every batch is made
before timing starts: nothing is read from disk inside the timed region. A source that cannot give the
kind asked for raises a UsageError naming what it can give.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from mtbench.errors import UsageError

ImageBatch = Tuple[torch.Tensor, torch.Tensor]  # (N x C x H x W float32, N int64 class labels)


class DataSource:
    name = "data"

    @property
    def label(self) -> str:
        """What summary.json records as `data`."""
        return self.name

    def image_batches(
        self, batch_size: int, count: int, shape: Sequence[int], num_classes: int, seed: int
    ) -> List[ImageBatch]:
        raise UsageError(f"data={self.name} has no images; image models take data=synthetic or data=cifar10")


class Synthetic(DataSource):
    """Random tensors shaped like the real data set, made once from a seeded generator."""

    name = "synthetic"

    def image_batches(self, batch_size, count, shape, num_classes, seed):
        gen = torch.Generator().manual_seed(seed)
        return [
            (
                torch.randn((batch_size, *shape), generator=gen),
                torch.randint(0, num_classes, (batch_size,), generator=gen),
            )
            for _ in range(count)
        ]
