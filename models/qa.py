"""What BiDAF and BERT share: turning SQuAD examples into id tensors with vocabularies of our own."""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np
import torch

from mtbench.data.base import QAExample
from mtbench.data.text import build_vocab


def word_index(examples: Sequence[QAExample], specials: List[str], max_size: int) -> Dict[str, int]:
    """Lower-cased words of contexts and questions, most frequent first, after `specials`."""
    sentences = ([w.lower() for w in ex.context + ex.question] for ex in examples)
    return {w: i for i, w in enumerate(build_vocab(sentences, specials, max_size))}


def pad_ids(rows: List[List[int]], pad: int, length: int = 0) -> torch.Tensor:
    length = max(length, max(len(r) for r in rows))
    out = np.full((len(rows), length), pad, dtype=np.int64)  # filled in NumPy: one tensor op, also on fake tensors
    for i, r in enumerate(rows):
        r = r[:length]
        out[i, : len(r)] = r
    return torch.tensor(out)
