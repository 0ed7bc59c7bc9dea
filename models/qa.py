"""What BiDAF and BERT share: turning SQuAD examples into id tensors with vocabularies of our own."""
from __future__ import annotations

from typing import Dict, List, Sequence

import torch

from mtbench.data.base import QAExample
from mtbench.data.text import build_vocab


def word_index(examples: Sequence[QAExample], specials: List[str], max_size: int) -> Dict[str, int]:
    """Lower-cased words of contexts and questions, most frequent first, after `specials`."""
    sentences = ([w.lower() for w in ex.context + ex.question] for ex in examples)
    return {w: i for i, w in enumerate(build_vocab(sentences, specials, max_size))}


def pad_ids(rows: List[List[int]], pad: int, length: int = 0) -> torch.Tensor:
    length = max(length, max(len(r) for r in rows))
    out = torch.full((len(rows), length), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r[:length], dtype=torch.long)
    return out
