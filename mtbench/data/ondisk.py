"""Synthetic sets written once in the real on-disk formats, so the pipeline runs anywhere: CIFAR-10's python pickles,
a plain text file (Shakespeare), IWSLT15's train.en / train.vi and a SQuAD v1.1 JSON file.

`data=synthetic data.loader=dataloader` reads these files through the same loaders as the real sets
(`data.cache_dir/cifar10-synthetic-<n>-s<seed>/cifar-10-batches-py/`, `text-synthetic-...`). The folders are made mode 0700,
each file is written under a temporary name created with O_EXCL and O_NOFOLLOW and renamed into place, and a
`complete` marker written last says the set is whole: a half-written set (a job killed while writing) is
written again, never read.
"""
from __future__ import annotations

import json
import os
import pickle
import stat
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np

from mtbench.data.cifar10_files import META_FILE, TRAIN_FILES
from mtbench.errors import DataError
from mtbench.regular_files import write_whole

SYNTHETIC_IMAGES_PER_FILE = 1000  # 5 x 1000 images, ~15 MB: enough for epochs of several steps at batch 64
SYNTHETIC_TEXT_CHARS = 1_000_000  # tiny Shakespeare holds 1.1 million characters
SYNTHETIC_PAIRS = 5000  # sentence pairs (IWSLT15 en-vi holds 133,000)
SYNTHETIC_QUESTIONS = 1000  # SQuAD questions, 5 to a paragraph (v1.1's training set holds 87,599)
COMPLETE = "complete"


def default_cache_dir() -> str:
    """~/.cache/mtbench (XDG_CACHE_HOME/mtbench where that is set)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mtbench")


def synthetic_cifar_root(cache_dir: str, per_file: int = SYNTHETIC_IMAGES_PER_FILE, seed: int = 0) -> str:
    """The folder (data.root's meaning) holding a synthetic set's cifar-10-batches-py/, written on first use."""
    root = Path(cache_dir or default_cache_dir()).expanduser() / f"cifar10-synthetic-{per_file}-s{seed}"
    folder = root / "cifar-10-batches-py"

    def write() -> None:
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

    _set_once(cache_dir, "CIFAR-10", [root, folder], write)
    return str(root)


def _synthetic_folder(cache_dir: str, name: str, files: Dict[str, Callable[[], bytes]]) -> str:
    """`cache_dir`/name holding `files` (each written from its function), written on first use: its path."""
    folder = Path(cache_dir or default_cache_dir()).expanduser() / name

    def write() -> None:
        for file_name, make in files.items():
            _write_bytes(folder / file_name, make())

    _set_once(cache_dir, name, [folder], write)
    return str(folder)


def _set_once(cache_dir: str, what: str, folders: List[Path], write: Callable[[], None]) -> None:
    """The set in `folders` (the last holds its files and the `complete` marker) as this user wrote it: read where
    whole, else written (a half-written one again). Its folders must be this user's own and writable by no one
    else: a set another user planted in a shared cache folder (a `complete` marker over no images) is refused,
    never trained on; the cache folder itself may be shared (sticky, as /tmp)."""
    marker = folders[-1] / COMPLETE
    try:
        _make_dir(folders[0].parent, shared=True)
        for d in folders:
            _make_dir(d)
        if marker.is_file() and not marker.is_symlink() and marker.lstat().st_uid == os.geteuid():
            return
        write()
        _write_bytes(marker, b"")
    except OSError as exc:
        raise DataError(f"data.cache_dir={cache_dir!r}: cannot use the synthetic {what} files there "
                        f"({exc.strerror or exc}); allowed: a folder this user owns and can write (default "
                        f"{default_cache_dir()})") from None


def synthetic_text(cache_dir: str, alphabet: str, chars: int = SYNTHETIC_TEXT_CHARS, seed: int = 0) -> str:
    """A UTF-8 text file of `chars` characters drawn from `alphabet` (data=synthetic's characters): its path."""
    def text() -> bytes:
        picks = np.random.default_rng(seed).integers(0, len(alphabet), chars)
        return "".join(alphabet[i] for i in picks).encode("utf-8")

    folder = _synthetic_folder(cache_dir, f"text-synthetic-{len(alphabet)}-{chars}-s{seed}", {"input.txt": text})
    return os.path.join(folder, "input.txt")


def synthetic_pairs(cache_dir: str, src_vocab: int, tgt_vocab: int, mean_len: float, max_len: int,
                    pairs: int = SYNTHETIC_PAIRS, seed: int = 0) -> str:
    """A folder with train.en and train.vi, line i of one paired with line i of the other, of tokens s<id> / t<id>
    (data=synthetic's vocabularies), ~mean_len tokens a sentence: its path."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.poisson(mean_len, pairs), 3, max_len)
    tgt_lengths = np.clip((lengths * rng.uniform(0.9, 1.4, pairs)).astype(int), 3, max_len)

    def side(prefix: str, vocab: int, lens: np.ndarray) -> Callable[[], bytes]:
        return lambda: "".join(" ".join(f"{prefix}{v}" for v in rng.integers(3, vocab, n)) + "\n"
                               for n in lens).encode()

    return _synthetic_folder(cache_dir, f"iwslt15-synthetic-{src_vocab}-{tgt_vocab}-{pairs}-s{seed}",
                             {"train.en": side("s", src_vocab, lengths), "train.vi": side("t", tgt_vocab, tgt_lengths)})


def synthetic_squad(cache_dir: str, word_vocab: int, questions: int = SYNTHETIC_QUESTIONS, seed: int = 0) -> str:
    """A SQuAD v1.1 JSON file of ~120-word contexts of words w<id> (data=synthetic's), 5 questions each with an
    answer span that lies in its context: its path."""
    def document() -> bytes:
        rng = np.random.default_rng(seed)
        paragraphs = []
        for p in range(max(1, questions // 5)):
            context = " ".join(f"w{int(v) % word_vocab}" for v in rng.zipf(1.2, int(np.clip(rng.poisson(120), 20, 400))))
            words = context.split(" ")
            offsets = np.cumsum([0] + [len(w) + 1 for w in words])
            qas = []
            for q in range(5):
                first = int(rng.integers(0, len(words) - 3))
                last = first + int(rng.integers(0, 3))
                question = " ".join(f"w{int(v) % word_vocab}" for v in rng.zipf(1.2, 10)) + " ?"
                qas.append({"id": f"{p}-{q}", "question": question,
                            "answers": [{"text": " ".join(words[first: last + 1]), "answer_start": int(offsets[first])}]})
            paragraphs.append({"context": context, "qas": qas})
        return json.dumps({"version": "1.1", "data": [{"title": "synthetic", "paragraphs": paragraphs}]}).encode()

    folder = _synthetic_folder(cache_dir, f"squad-synthetic-{word_vocab}-{questions}-s{seed}",
                               {"train-v1.1.json": document})
    return os.path.join(folder, "train-v1.1.json")


def _make_dir(path: Path, shared: bool = False) -> None:
    """A folder that exists as a real folder (not a link another user planted), made 0700 where new. An existing one
    must be this user's and writable by no one else; `shared` (the cache folder itself): or root's, or sticky."""
    try:
        os.mkdir(path, 0o700)
        return
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise OSError(0, f"{path} is not a folder (a link or a file), refused")
    ours = st.st_uid == os.geteuid()
    if shared and (ours or st.st_uid == 0 or st.st_mode & stat.S_ISVTX):
        return
    if not ours:
        raise OSError(0, f"{path} belongs to another user (uid {st.st_uid}), refused")
    if st.st_mode & 0o022:
        raise OSError(0, f"{path} may be written by other users (mode {stat.S_IMODE(st.st_mode):o}), refused")


def _write_pickle(path: Path, obj: dict) -> None:
    _write_bytes(path, pickle.dumps(obj, protocol=2))  # protocol 2, as the real set's files


def _write_bytes(path: Path, data: bytes) -> None:
    """Write under a fresh temporary name (O_EXCL: never an existing file or link), then rename into place."""
    write_whole(str(path), data, mode=0o600, sync=False)
