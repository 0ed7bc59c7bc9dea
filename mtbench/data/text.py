"""Plain-text helpers shared by the text loaders: reading a UTF-8 file with clear errors, and a word
tokenizer with character offsets (our own: torchtext is retired upstream and does not load beside torch 2.14).
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Iterable, List, Tuple

from mtbench.errors import DataError
from mtbench.regular_files import GIB, RefusedFile, read_regular

MAX_TEXT_BYTES = 2 * GIB  # a text data set read whole (IWSLT15 en-vi: 13 MB; SQuAD v1.1 train: 30 MB)
_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def read_text(path: str, what: str) -> str:
    """The whole file as text, or a DataError naming the file and what was wrong."""
    file = Path(path).expanduser()
    if not str(path):
        raise DataError(f"{what}: no file given")
    try:
        return read_regular(str(file), MAX_TEXT_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise DataError(f"{what}: missing file {file}") from None
    except RefusedFile as exc:  # a FIFO would block the job before its first step; a link may be a plant
        raise DataError(f"{what}: {exc}; allowed: a regular file") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{file}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except OSError as exc:
        raise DataError(f"{file}: cannot read ({exc.strerror})") from None


def tokenize(text: str) -> List[Tuple[str, int, int]]:
    """Words and single punctuation marks with their [start, end) character offsets."""
    return [(m.group(), m.start(), m.end()) for m in _TOKEN.finditer(text)]


def build_vocab(sentences: Iterable[Iterable[str]], specials: List[str], max_size: int) -> List[str]:
    """specials first, then tokens by falling frequency (ties alphabetical), at most max_size entries."""
    counts = Counter(tok for sentence in sentences for tok in sentence)
    for s in specials:
        counts.pop(s, None)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return specials + [tok for tok, _ in ranked[: max(0, max_size - len(specials))]]
