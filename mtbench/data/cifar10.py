"""CIFAR-10 as a data source (`data=cifar10`), read from the original python-pickle layout
(`<root>/cifar-10-batches-py/`; the files and their reading: cifar10_files)."""
from __future__ import annotations

from typing import List

import numpy as np
import torch

from mtbench.data.base import IMAGES, LocalFiles, check_image_shape, check_image_size
from mtbench.data.cifar10_files import MEAN, STD, TEST_FILE, load_test, load_train
from mtbench.data.sets import cifar_train_transform, image_set
from mtbench.errors import DataError


class CIFAR10(LocalFiles):
    name = "cifar10"
    gives = "3x32x32 images (resized to data.image_size)"
    needs = "data.root=DIR (the folder holding cifar-10-batches-py/)"

    def __init__(self, root: str = "", image_size: int = 32, **loader) -> None:
        super().__init__(root, **loader)
        self.image_size = check_image_size(image_size)  # 32 keeps the images as they are; else bilinear resize

    def pipeline_set(self, recipe, cache_dir):
        if recipe.kind != IMAGES:
            return super().pipeline_set(recipe, cache_dir)
        return image_set(self.location, *cifar_train_transform(self.image_size))

    def _check_shape(self, shape, num_classes) -> None:
        """The model's input shape and classes against CIFAR-10's (3-channel images, 10 classes)."""
        check_image_shape(self.image_size, shape)
        if shape[0] != 3 or num_classes != 10:
            raise DataError(f"data=cifar10 gives 3-channel images in 10 classes, not {tuple(shape)} / {num_classes}")

    def image_batches(self, batch_size, count, shape, num_classes, seed) -> List:
        self._check_shape(shape, num_classes)
        images, labels, _ = load_train(self.location)
        if len(images) == 0:
            raise DataError(f"{self.location}: the CIFAR-10 training batches hold no images")
        order = np.random.default_rng(seed).permutation(len(images))
        needed = np.resize(order, batch_size * count)  # cycle when the set is smaller than needed
        return self._batches(images[needed], labels[needed], batch_size)

    def held_out_image_batches(self, batch_size, shape, num_classes) -> List:
        self._check_shape(shape, num_classes)
        images, labels, _ = load_test(self.location)
        if len(images) == 0:
            raise DataError(f"{self.location}: the CIFAR-10 {TEST_FILE} holds no images")
        return self._batches(images, labels, batch_size)

    def _batches(self, images: np.ndarray, labels: np.ndarray, batch_size: int) -> List:
        """Normalized (and resized) float images with their labels, in batches of `batch_size`."""
        x = torch.from_numpy(images).float().div_(255.0)
        x = (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
        if self.image_size != 32:  # e.g. ImageNet-shaped 224x224 inputs; made here, before timing
            x = torch.nn.functional.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear",
                                                align_corners=False)
        y = torch.from_numpy(labels)
        return list(zip(x.split(batch_size), y.split(batch_size)))
