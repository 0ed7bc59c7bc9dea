"""IWSLT15 English-Vietnamese in the Stanford NMT layout.

`<root>/train.en` and `<root>/train.vi`: tokenized text, one sentence a line, line i of one the translation
of line i of the other. `vocab.en` / `vocab.vi` (one token a line, starting with `<unk> <s> </s>`) are used
when present; otherwise the vocabulary is built from the text (most frequent first, at most `max_vocab`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import numpy as np

from mtbench.data.base import UNK, LocalFiles, ParallelCorpus
from mtbench.data.text import build_vocab, read_text
from mtbench.errors import DataError

SPECIALS = ["<unk>", "<s>", "</s>"]


def _vocab(root: Path, lang: str, sentences: List[List[str]], max_vocab: int) -> List[str]:
    file = root / f"vocab.{lang}"
    if not file.exists():
        return build_vocab(sentences, SPECIALS, max_vocab)
    vocab = [line.strip() for line in read_text(str(file), "vocab").splitlines() if line.strip()]
    if vocab[:3] != SPECIALS:
        raise DataError(f"{file}: a vocab file must start with <unk> <s> </s>, one a line (starts with {vocab[:3]})")
    return vocab


class IWSLT15(LocalFiles):
    name = "iwslt15"
    gives = "sentence pairs"
    needs = "data.root=DIR (holding train.en and train.vi)"

    def __init__(self, root: str = "", src: str = "en", tgt: str = "vi", max_vocab: int = 50000,
                 max_len: int = 50, **loader) -> None:
        super().__init__(root, **loader)
        self.src, self.tgt = src, tgt
        self.max_vocab, self.max_len = max_vocab, max_len

    def pipeline_set(self, recipe, cache_dir):
        from mtbench.data.base import PAIRS
        from mtbench.data.sets import text_set

        if recipe.kind != PAIRS:
            return super().pipeline_set(recipe, cache_dir)
        return text_set(recipe, self.location, src=self.src, tgt=self.tgt, max_len=self.max_len)

    def parallel_corpus(self, pairs, seed):
        root = Path(self.location).expanduser()
        sides: Dict[str, List[List[str]]] = {}
        for lang in (self.src, self.tgt):
            lines = read_text(str(root / f"train.{lang}"), "data.root").splitlines()
            sides[lang] = [line.split() for line in lines]
        n_src, n_tgt = len(sides[self.src]), len(sides[self.tgt])
        if n_src != n_tgt:
            raise DataError(f"{root}: train.{self.src} has {n_src} lines but train.{self.tgt} has {n_tgt}; "
                            "line i of one must translate line i of the other")
        # like the NMT tutorials: drop empty pairs, cut sentences at max_len tokens
        kept = [(s[: self.max_len], t[: self.max_len]) for s, t in zip(sides[self.src], sides[self.tgt]) if s and t]
        if not kept:
            raise DataError(f"{root}: train.{self.src} / train.{self.tgt} hold no non-empty sentence pairs")
        vocabs = {lang: _vocab(root, lang, sides[lang], self.max_vocab) for lang in (self.src, self.tgt)}
        index = {lang: {tok: i for i, tok in enumerate(v)} for lang, v in vocabs.items()}

        def encode(tokens: List[str], lang: str) -> np.ndarray:
            return np.array([index[lang].get(t, UNK) for t in tokens], dtype=np.int64)

        order = np.random.default_rng(seed).permutation(len(kept))
        chosen = [kept[i] for i in np.resize(order, pairs)]
        return ParallelCorpus([encode(s, self.src) for s, _ in chosen], [encode(t, self.tgt) for _, t in chosen],
                              vocabs[self.src], vocabs[self.tgt])
