"""A synthetic CIFAR-10 set written once in the real on-disk format (the python pickles), so the pipeline runs anywhere.

`data=synthetic data.loader=dataloader` reads these files through the same loader as the real set
(`data.cache_dir/cifar-10-batches-py-synthetic-<n>/cifar-10-batches-py/`). The folders are made mode 0700,
each file is written under a temporary name created with O_EXCL and O_NOFOLLOW and renamed into place, and a
`complete` marker written last says the set is whole: a half-written set (a job killed while writing) is
written again, never read.
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np

from mtbench.data.cifar10 import META_FILE, TRAIN_FILES
from mtbench.errors import DataError

SYNTHETIC_IMAGES_PER_FILE = 1000  # 5 x 1000 images, ~15 MB: enough for epochs of several steps at batch 64
COMPLETE = "complete"


def default_cache_dir() -> str:
    """~/.cache/mtbench (XDG_CACHE_HOME/mtbench where that is set)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mtbench")


def synthetic_cifar_root(cache_dir: str, per_file: int = SYNTHETIC_IMAGES_PER_FILE, seed: int = 0) -> str:
    """The folder (data.root's meaning) holding a synthetic set's cifar-10-batches-py/, written on first use."""
    root = Path(cache_dir or default_cache_dir()).expanduser() / f"cifar10-synthetic-{per_file}-s{seed}"
    folder = root / "cifar-10-batches-py"
    if (folder / COMPLETE).is_file() and not (folder / COMPLETE).is_symlink():
        return str(root)
    try:
        for d in (root.parent, root, folder):
            _make_dir(d)
        rng = np.random.default_rng(seed)
        for name in TRAIN_FILES:
            _write_pickle(folder / name, {
                b"batch_label": name.encode(),
                b"labels": [int(v) for v in rng.integers(0, 10, per_file)],
                b"data": rng.integers(0, 256, (per_file, 3072), dtype=np.uint8),
                b"filenames": [f"synthetic_{i}.png".encode() for i in range(per_file)],
            })
        _write_pickle(folder / META_FILE, {b"label_names": [f"class{i}".encode() for i in range(10)],
                                           b"num_cases_per_batch": per_file, b"num_vis": 3072})
        _write_bytes(folder / COMPLETE, b"")
    except OSError as exc:
        raise DataError(f"data.cache_dir={cache_dir!r}: cannot write the synthetic CIFAR-10 files there "
                        f"({exc.strerror or exc}); allowed: a folder this user can write") from None
    return str(root)


def _make_dir(path: Path) -> None:
    """A folder that exists as a real folder (not a link another user planted), made 0700 where new."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if path.is_symlink() or not path.is_dir():
            raise OSError(0, f"{path} is not a folder (a link or a file), refused") from None


def _write_pickle(path: Path, obj: dict) -> None:
    _write_bytes(path, pickle.dumps(obj, protocol=2))  # protocol 2, as the real set's files


def _write_bytes(path: Path, data: bytes) -> None:
    """Write under a fresh temporary name (O_EXCL: never an existing file or link), then rename into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(str(tmp), str(path))
    except BaseException:
        try:
            os.unlink(str(tmp))
        except OSError:
            pass
        raise
