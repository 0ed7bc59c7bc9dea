"""CIFAR-10's python-pickle files (`<root>/cifar-10-batches-py/`): their names, the training set's mean and std,
and reading them (data_batch_1..5, test_batch: b"data" N x 3072 uint8 channel-major 32x32 planes, b"labels";
batches.meta: b"label_names"). Unpickling is restricted to numpy arrays and plain containers: a pickle is code,
and a data file has no business running any. Checksums are not required (small files in the same format, as
the tests write, are accepted).
"""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Sequence

import numpy as np

from mtbench.errors import DataError
from mtbench.regular_files import RefusedFile, open_regular

TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
TEST_FILE = "test_batch"  # the held-out split (10,000 images): until.accuracy measures on it
META_FILE = "batches.meta"
# per-channel mean / std of the CIFAR-10 training set, for the usual normalization
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


class _NumpyOnlyUnpickler(pickle.Unpickler):
    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),  # how protocol-2 pickles written by Python 3 spell a bytes object
        ("__builtin__", "bytes"),  # ... and an empty one (bytes()): an empty batch's filenames
        ("builtins", "bytes"),
    }

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _load(path: Path) -> dict:
    try:
        f = open_regular(str(path))
    except FileNotFoundError:
        raise DataError(
            f"data.root: missing file {path} (the CIFAR-10 python layout has "
            f"{', '.join(TRAIN_FILES)} and {META_FILE} in cifar-10-batches-py/)"
        ) from None
    except RefusedFile as exc:  # a FIFO would block the job before its first step; a link may be a plant
        raise DataError(f"data.root: {exc}; allowed: a regular file") from None
    try:
        with f:
            obj = _NumpyOnlyUnpickler(f, encoding="bytes").load()
    except Exception as exc:  # truncated, not a pickle, or a pickle of something else
        raise DataError(f"{path}: not a CIFAR-10 python pickle ({type(exc).__name__}: {exc})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}: not a CIFAR-10 python pickle (holds a {type(obj).__name__}, not a dict)")
    return obj


def load_train(root: str) -> tuple:
    """(images N x 3 x 32 x 32 uint8, labels N int64, class names) from the five training batches."""
    return load_batches(root, TRAIN_FILES)


def load_test(root: str) -> tuple:
    """The same from the held-out test_batch."""
    return load_batches(root, [TEST_FILE])


def load_batches(root: str, files: Sequence[str]) -> tuple:
    """(images N x 3 x 32 x 32 uint8, labels N int64, class names) from the batch `files` of the set under root."""
    folder = Path(root).expanduser() / "cifar-10-batches-py"
    meta = _load(folder / META_FILE)
    raw_names = meta.get(b"label_names", [])
    if not isinstance(raw_names, (list, tuple)) or not all(isinstance(n, (bytes, str)) for n in raw_names):
        raise DataError(f"{folder / META_FILE}: b'label_names' must be a list of class names (bytes or str), not "
                        f"{_shown(raw_names)}")
    names = [n.decode(errors="replace") if isinstance(n, bytes) else n for n in raw_names]
    if not names:
        raise DataError(f"{folder / META_FILE}: has no label_names")
    images, labels = [], []
    for name in files:
        batch = _load(folder / name)
        data, lab = batch.get(b"data"), batch.get(b"labels")
        if not isinstance(data, np.ndarray) or data.ndim != 2 or data.shape[1] != 3072 or lab is None:
            raise DataError(f"{folder / name}: expected b'data' as N x 3072 uint8 and b'labels'")
        lab = _labels(folder / name, lab)
        if len(lab) != len(data):
            raise DataError(f"{folder / name}: {len(data)} images but {len(lab)} labels")
        if len(lab) and (lab.min() < 0 or lab.max() >= len(names)):
            raise DataError(f"{folder / name}: labels outside 0..{len(names) - 1}")
        images.append(data.astype(np.uint8).reshape(-1, 3, 32, 32))
        labels.append(lab)
    return np.concatenate(images), np.concatenate(labels), names


def _labels(path: Path, raw) -> np.ndarray:
    """b'labels' as N int64 class ids, or a DataError naming the file and the field."""
    expected = "b'labels' must be a list of whole numbers (class ids)"
    if isinstance(raw, (bytes, str, dict)) or not isinstance(raw, (list, tuple, np.ndarray)):
        raise DataError(f"{path}: {expected}, not {_shown(raw)}")
    try:
        labels = np.asarray(raw)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{path}: {expected} ({exc})") from None
    if labels.ndim != 1 or (labels.size and labels.dtype.kind not in "iu"):
        raise DataError(f"{path}: {expected}, not {labels.ndim}-D {labels.dtype} values")
    return labels.astype(np.int64)


def _shown(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"
