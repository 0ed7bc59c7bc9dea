"""The data sets data.loader=dataloader reads from files each epoch: CIFAR-10 images, a text's character windows,
IWSLT15 sentence pairs and SQuAD examples. An item is raw (characters, tokens, an example); the workload's
BatchRecipe.collate encodes and pads a batch of them in the loader's workers."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, List, Tuple

import numpy as np
import torch

from mtbench.data.base import CHARS, PAIRS, BatchRecipe, PipelineSet
from mtbench.data.cifar10_files import MEAN, META_FILE, STD, TRAIN_FILES, load_train
from mtbench.data.text import read_text
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


class CharWindows(torch.utils.data.Dataset):
    """A text file cut into windows of seq_len + 1 characters (input and next-character target), one after another."""

    def __init__(self, path: str, seq_len: int) -> None:
        self.text = read_text(path, "data.path")
        self.seq_len = seq_len
        if len(self.text) < seq_len + 1:
            raise DataError(f"{path}: holds {len(self.text)} characters; seq_len={seq_len} needs at least "
                            f"{seq_len + 1} (lower model.workload.seq_len)")

    def __len__(self) -> int:
        return (len(self.text) - 1) // self.seq_len

    def __getitem__(self, index: int) -> str:
        start = index * self.seq_len
        return self.text[start: start + self.seq_len + 1]


class SentencePairs(torch.utils.data.Dataset):
    """IWSLT15's train.<src> / train.<tgt>, tokenized by spaces, empty pairs dropped, cut at max_len tokens."""

    def __init__(self, root: str, src: str, tgt: str, max_len: int) -> None:
        folder = Path(root).expanduser()
        sides = [read_text(str(folder / f"train.{lang}"), "data.root").splitlines() for lang in (src, tgt)]
        if len(sides[0]) != len(sides[1]):
            raise DataError(f"{folder}: train.{src} has {len(sides[0])} lines but train.{tgt} has {len(sides[1])}; "
                            "line i of one must translate line i of the other")
        self.pairs = [(s.split()[:max_len], t.split()[:max_len]) for s, t in zip(*sides) if s.split() and t.split()]

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> Tuple[List[str], List[str]]:
        return self.pairs[index]


class SquadItems(torch.utils.data.Dataset):
    """SQuAD v1.1 JSON's examples whose answer lies in their context (the existing parser and its errors)."""

    def __init__(self, path: str) -> None:
        from mtbench.data.squad_files import parse_squad

        self.examples, _ = parse_squad(read_text(path, "data.path"), path)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> Any:
        return self.examples[index]


def image_set(root: str, transform: Callable[[torch.Tensor], torch.Tensor], transforms: str) -> PipelineSet:
    folder = Path(root).expanduser() / "cifar-10-batches-py"
    return PipelineSet(root, lambda: CifarFiles(root, transform),
                       [str(folder / name) for name in TRAIN_FILES + [META_FILE]], transforms)


def text_set(recipe: BatchRecipe, location: str, **keys: Any) -> PipelineSet:
    """The set of kind CHARS, PAIRS or SQUAD at `location` (a file, or IWSLT15's folder with keys src, tgt, max_len)."""
    if recipe.kind == CHARS:
        return PipelineSet(location, lambda: CharWindows(location, recipe.seq_len), [location],
                           f"character windows of {recipe.seq_len + 1}; {recipe.describe}")
    if recipe.kind == PAIRS:
        src, tgt = keys["src"], keys["tgt"]
        files = [str(Path(location).expanduser() / f"train.{lang}") for lang in (src, tgt)]
        return PipelineSet(location, lambda: SentencePairs(location, src, tgt, keys["max_len"]), files,
                           f"sentence pairs split at spaces; {recipe.describe}")
    return PipelineSet(location, lambda: SquadItems(location), [location], f"SQuAD examples; {recipe.describe}")
