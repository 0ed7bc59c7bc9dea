"""data.loader=dataloader: a torch DataLoader over CIFAR-10's files with the usual augmentations, and each step's data wait.

Each epoch reads the set from its files again (unless data.persistent_workers keeps the workers and what they
read), shuffles it, and every image goes through the usual CIFAR-10 training transforms in the loader's workers
(or in the training process with data.workers=0): a random 32x32 crop of the image padded by 4, a horizontal
flip half of the time, then normalization by the training set's per-channel mean and std. `Pipeline.next_batch`
returns a batch and the seconds the caller blocked for it: the step's data wait.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional, Tuple

import numpy as np
import torch

from mtbench.data.base import DataSource, LoaderSettings
from mtbench.data.cifar10 import MEAN, STD, load_train
from mtbench.errors import DataError, UsageError


def cifar_train_transform(image_size: int = 32) -> Tuple[Callable[[torch.Tensor], torch.Tensor], str]:
    """The CIFAR-10 training transforms on one 3x32x32 uint8 tensor, and the module that made them:
    torchvision.transforms.v2 where it has ToDtype (torchvision >= 0.16), else torchvision.transforms."""
    try:
        from torchvision.transforms import v2 as T

        to_float = T.ToDtype(torch.float32, scale=True)
        module = "torchvision.transforms.v2"
    except (ImportError, AttributeError, TypeError):
        try:
            from torchvision import transforms as T  # type: ignore[no-redef]
        except ImportError:
            raise UsageError("data.loader=dataloader needs torchvision (its transforms); allowed: "
                             "data.loader=preloaded, or install torchvision") from None
        to_float = T.ConvertImageDtype(torch.float32)
        module = "torchvision.transforms"
    steps = [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), to_float, T.Normalize(MEAN, STD)]
    if image_size != 32:  # e.g. ImageNet-shaped 224x224 inputs, as data.image_size asks
        steps.append(T.Resize((image_size, image_size), antialias=False))
    return T.Compose(steps), module


class CifarFiles(torch.utils.data.Dataset):
    """CIFAR-10's training images read from `root`'s cifar-10-batches-py/ (the existing loader and its errors),
    augmented per item by `transform`."""

    def __init__(self, root: str, transform: Callable[[torch.Tensor], torch.Tensor]) -> None:
        images, labels, _ = load_train(root)
        self.images = torch.from_numpy(np.ascontiguousarray(images))
        self.labels = torch.from_numpy(labels)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.transform(self.images[index]), self.labels[index]


class Pipeline:
    """A DataLoader over a set's files, one epoch after another; `close()` ends its workers."""

    def __init__(self, root: str, settings: LoaderSettings, batch_size: int, seed: int, image_size: int = 32,
                 pin_memory: bool = False, dataset: Optional[Callable[[], torch.utils.data.Dataset]] = None) -> None:
        self.settings = settings
        self.root = root  # the folder holding cifar-10-batches-py/ (the cache's, for data=synthetic)
        self.batch_size = batch_size
        self.pin_memory = pin_memory  # pinned only where a GPU trains: pinning for the CPU is wasted work
        self.transform, self.transforms_module = cifar_train_transform(image_size)
        self.make_dataset = dataset or (lambda: CifarFiles(root, self.transform))
        self.generator = torch.Generator().manual_seed(seed)  # each epoch's order, and the workers' seeds
        self.loader: Optional[torch.utils.data.DataLoader] = None
        self.iterator: Any = None
        self.epochs = 0  # epochs begun

    def _new_epoch(self) -> None:
        if self.loader is None or not self.settings.persistent_workers:
            self._end_workers()
            dataset = self.make_dataset()  # the files are read again: each epoch reads the set as training does
            if len(dataset) < self.batch_size:
                raise DataError(f"the data set holds {len(dataset)} images, fewer than one batch of {self.batch_size}")
            workers = self.settings.workers
            self.loader = torch.utils.data.DataLoader(
                dataset, batch_size=self.batch_size, shuffle=True, drop_last=True, num_workers=workers,
                pin_memory=self.pin_memory, generator=self.generator,
                prefetch_factor=self.settings.prefetch_factor if workers else None,
                persistent_workers=self.settings.persistent_workers and workers > 0)
        self.iterator = iter(self.loader)
        self.epochs += 1

    def next_batch(self) -> Tuple[Any, float]:
        """The next batch, starting a new epoch where one ended, and the seconds this call blocked for it."""
        start = time.monotonic()
        if self.iterator is None:
            self._new_epoch()
        try:
            try:
                batch = next(self.iterator)
            except StopIteration:
                self._new_epoch()
                batch = next(self.iterator)
        except (ConnectionError, EOFError) as exc:  # a worker killed while it sent a batch: torch's own error or this
            raise RuntimeError(f"DataLoader worker ended while sending a batch ({type(exc).__name__}: {exc})") from None
        return batch, time.monotonic() - start

    def describe(self) -> dict:
        """What summary.json records of the pipeline."""
        s = self.settings
        return {"loader": s.loader, "root": self.root, "workers": s.workers, "pin_memory": self.pin_memory,
                "prefetch_factor": s.prefetch_factor if s.workers else None,
                "persistent_workers": s.persistent_workers and s.workers > 0,
                "transforms": self.transforms_module, "epochs": self.epochs}

    def _end_workers(self) -> None:
        # the iterator owns the worker processes: ending it joins them (torch's own shutdown, as its __del__ does)
        shutdown = getattr(self.iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self.iterator = None

    def close(self) -> None:
        """End the loader's workers (persistent ones too); the job calls it whatever ended the job."""
        self._end_workers()
        self.loader = None


def open_pipeline(data: DataSource, batch_size: int, seed: int, device: torch.device,
                  model_takes_batches: bool) -> Optional[Pipeline]:
    """The pipeline data.loader=dataloader asks for, or None for data.loader=preloaded (batches made before timing);
    a model that trains only on batches it prepares is refused in one line."""
    settings = data.loader_settings
    if settings.loader != "dataloader":
        return None
    if not model_takes_batches:
        raise UsageError("data.loader=dataloader: this model trains only on the batches it prepares (only the image "
                         "classification models have a pipeline yet); allowed: data.loader=preloaded")
    root = data.pipeline_root(settings.cache_dir)
    image_size = int(getattr(data, "image_size", 32))
    return Pipeline(root, settings, batch_size, seed, image_size,
                    pin_memory=settings.pin_memory and device.type == "cuda")
