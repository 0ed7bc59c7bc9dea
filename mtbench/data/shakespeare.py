"""A character corpus from one plain UTF-8 text file (e.g. tiny Shakespeare); the vocabulary is its characters."""
from __future__ import annotations

import numpy as np

from mtbench.data.base import CharCorpus, LocalFiles
from mtbench.data.text import read_text
from mtbench.errors import DataError


class Shakespeare(LocalFiles):
    name = "shakespeare"
    gives = "a character corpus"
    needs = "data.path=FILE (a plain UTF-8 text file)"

    def __init__(self, path: str = "", **loader) -> None:
        super().__init__(path, **loader)

    def pipeline_set(self, recipe, cache_dir):
        from mtbench.data.base import CHARS
        from mtbench.data.sets import text_set

        return text_set(recipe, self.location) if recipe.kind == CHARS else super().pipeline_set(recipe, cache_dir)

    def char_corpus(self, min_chars, seed):
        text = read_text(self.location, "data.path")
        if len(text) < 2:
            raise DataError(f"{self.location}: holds {len(text)} characters; a character model needs at least 2")
        vocab = sorted(set(text))
        index = {c: i for i, c in enumerate(vocab)}
        return CharCorpus(np.fromiter((index[c] for c in text), dtype=np.int64, count=len(text)), vocab)
