"""The data source interface and the shapes of what sources give. `conf/data/<name>.yaml` builds one source.

A workload asks its source for the kind of data it trains on (images, a character corpus, sentence pairs,
SQuAD examples, an Atari environment). Every batch is made before timing starts: nothing is read from disk
inside the timed region. A source that cannot give the kind asked for raises a UsageError naming what it
gives and which sources give what the model needs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from mtbench.errors import UsageError

ImageBatch = Tuple[torch.Tensor, torch.Tensor]  # (N x C x H x W float32, N int64 class labels)

# Token ids shared by the sentence-pair corpora: the Stanford NMT vocab files start with these three.
UNK, BOS, EOS = 0, 1, 2


@dataclass
class CharCorpus:
    ids: np.ndarray  # int64 character ids, the whole text in order
    vocab: List[str]  # id -> character


@dataclass
class ParallelCorpus:
    src: List[np.ndarray]  # one int64 id array per source sentence (no <s> / </s>)
    tgt: List[np.ndarray]  # one per target sentence
    src_vocab: List[str]  # id -> token; ids 0, 1, 2 are <unk> <s> </s>
    tgt_vocab: List[str]


@dataclass
class QAExample:
    context: List[str]  # context tokens
    question: List[str]  # question tokens
    start: int  # index of the answer's first token in context
    end: int  # index of its last token (inclusive)


LOADER_KEYS = ("loader", "workers", "pin_memory", "prefetch_factor", "persistent_workers", "cache_dir", "cache")

# the kinds of on-disk set data.loader=dataloader reads, and what one item of each is before the recipe's collate
IMAGES = "images"  # CIFAR-10 pickles: (augmented 3xHxW float32, int64 label)
CHARS = "chars"  # a plain text file: a window of seq_len + 1 characters (a str)
PAIRS = "pairs"  # IWSLT15 train.<src> / train.<tgt>: (source tokens, target tokens), each a list of str
SQUAD = "squad"  # SQuAD v1.1 JSON: one QAExample
KIND_SOURCES = {IMAGES: "cifar10", CHARS: "shakespeare", PAIRS: "iwslt15", SQUAD: "squad"}  # the real set of each


@dataclass
class BatchRecipe:
    """How a workload's batches are made from a set's files under data.loader=dataloader: the kind of set it reads
    and the function that turns the items of one batch into the tensors `take_batch` gets (tokenize, encode, pad;
    it runs in the loader's workers, so its cost is the pipeline's)."""

    kind: str  # IMAGES, CHARS, PAIRS or SQUAD
    collate: Optional[Callable[[List[Any]], Any]] = None  # items -> the batch's tensors (None: torch's default)
    seq_len: int = 0  # CHARS: characters a sample trains on (an item holds seq_len + 1)
    describe: str = ""  # what the collate does, for summary.json's data_pipeline.transforms


@dataclass
class PipelineSet:
    """A source's files for data.loader=dataloader: where they are, and a data set over them read afresh each epoch."""

    location: str  # the folder or file read (data.cache_dir's for data=synthetic)
    make_dataset: Callable[[], Any]  # () -> a torch Dataset that reads the files now
    files: List[str]  # every file the set is read from (data.cache=cold drops them from the page cache)
    transforms: str  # what happens to each item before the recipe's collate


@dataclass
class LoaderSettings:
    """data.loader and its DataLoader's settings (conf/data/_pipeline.yaml; docs/models.md "Input pipeline")."""

    loader: str = "preloaded"  # preloaded: batches made before timing; dataloader: a DataLoader over the set's files
    workers: int = 0  # DataLoader worker processes (0: the training process loads and augments itself)
    pin_memory: bool = False  # page-locked batches (CUDA only), copied to the GPU without blocking
    prefetch_factor: int = 2  # batches each worker loads ahead (workers >= 1)
    persistent_workers: bool = False  # keep the workers (and the set they read) from one epoch to the next
    cache_dir: Optional[str] = None  # where data=synthetic writes its on-disk set (null: ~/.cache/mtbench)
    cache: str = "warm"  # warm: as the page cache holds the files; cold: dropped from it first (docs/pipeline.md)

    @classmethod
    def from_keys(cls, keys: Dict[str, Any]) -> "LoaderSettings":
        """The settings from data.* keys, each checked by the config schema (a UsageError naming a bad one)."""
        from mtbench.config import check_value

        unknown = sorted(set(keys) - set(LOADER_KEYS))
        if unknown:
            raise UsageError(f"data.{unknown[0]} is not a key of this data source; allowed: "
                             + ", ".join(f"data.{k}" for k in LOADER_KEYS))
        return cls(**{k: check_value(f"data.{k}", v) for k, v in keys.items()})


class DataSource:
    name = "data"
    gives = "nothing"  # what this source provides, for error messages
    loader_settings = LoaderSettings()  # data.loader=preloaded unless the config says otherwise
    # the predictor traces a job on synthetic data, unless its source costs the job time and memory of its own and
    # needs no files (an emulator): then on the source itself, so that its cost is the job's
    traced_as_is = False

    def set_loader(self, keys: Dict[str, Any]) -> None:
        """data.loader and its settings, the keys every conf/data/ file takes from _pipeline.yaml."""
        self.loader_settings = LoaderSettings.from_keys(keys)

    def pipeline_set(self, recipe: BatchRecipe, cache_dir: Optional[str]) -> PipelineSet:
        """The files data.loader=dataloader reads for `recipe.kind`, and a data set over them."""
        raise UsageError(f"data.loader=dataloader: data={self.name} has no {recipe.kind} files to read; allowed: "
                         f"data.loader=preloaded, or data={KIND_SOURCES.get(recipe.kind, 'synthetic')} / data=synthetic")

    @property
    def label(self) -> str:
        """What summary.json records as `data`."""
        return self.name

    def _cannot(self, needs: str, real: str) -> UsageError:
        return UsageError(f"data={self.name} gives {self.gives}; this model needs {needs}: "
                          f"allowed: data=synthetic or data={real}")

    def image_batches(self, batch_size: int, count: int, shape: Sequence[int], num_classes: int,
                      seed: int) -> List[ImageBatch]:
        raise self._cannot("images", "cifar10")

    def held_out_image_batches(self, batch_size: int, shape: Sequence[int], num_classes: int) -> List[ImageBatch]:
        """The real set's held-out split (CIFAR-10's test_batch), in batches, for until.accuracy."""
        raise UsageError(f"until.accuracy: data={self.name} has no held-out split whose accuracy means anything "
                         "(synthetic labels are random); allowed: data=cifar10 data.root=DIR, or until.loss=L")

    def char_corpus(self, min_chars: int, seed: int) -> CharCorpus:
        raise self._cannot("a character corpus", "shakespeare")

    def parallel_corpus(self, pairs: int, seed: int) -> ParallelCorpus:
        raise self._cannot("sentence pairs", "iwslt15")

    def squad_examples(self, count: int, seed: int) -> List[QAExample]:
        raise self._cannot("SQuAD question/context examples", "squad")

    def atari_env(self, seed: int) -> Any:
        raise self._cannot("an Atari environment", "atari")


def check_image_size(image_size: Any) -> int:
    """data.image_size as a whole number >= 1 (a UsageError naming the value otherwise)."""
    from mtbench.config import positive_int

    return positive_int("data.image_size", image_size)


def check_image_shape(image_size: int, shape: Sequence[int]) -> None:
    """A source gives image_size x image_size images: a model that asks another size is told which to set."""
    if len(shape) != 3 or tuple(shape[1:]) != (image_size, image_size):
        asked = "x".join(str(int(n)) for n in shape)
        raise UsageError(f"data.image_size={image_size} gives {image_size}x{image_size} images, but this model takes "
                         f"{asked}; allowed: data.image_size={int(shape[-1])}")


class LocalFiles(DataSource):
    """A real data set read from local disk at `location` (a file or a folder), recorded as
    "<name>:<location>". Subclasses say in `needs` which key the user must set."""

    needs = "data.path=FILE"

    def __init__(self, location: str, **loader: Any) -> None:
        self.set_loader(loader)
        if not location:
            from mtbench.errors import DataError

            raise DataError(f"data={self.name} needs {self.needs}")
        self.location = str(location)

    @property
    def label(self) -> str:
        return f"{self.name}:{self.location}"
