"""BERT for SQuAD span prediction (Devlin, Chang, Lee, Toutanova, "BERT: Pre-training of Deep
Bidirectional Transformers for Language Understanding", NAACL 2019): token + position + segment
embeddings with layer norm, a stack of post-norm transformer encoder layers (GELU), and a linear head that
gives a start and an end logit per token; loss = mean of the two cross-entropies. BERT-base by default
(12 layers, hidden 768, 12 heads, 3072 feed-forward, 30,522-token vocabulary, ~109M parameters), built
from torch.nn transformer layers and randomly initialized (no pretrained weights can be fetched here).

Inputs are `[CLS] question [SEP] context [SEP]` padded to `seq_len` (384, the paper's SQuAD setting).
The tokenizer is our own word tokenizer, not WordPiece: the vocabulary is the data's most frequent
words, capped at `vocab_size`, the embedding table stays vocab_size rows. An answer cut off by the window
points at [CLS], as BERT's own SQuAD code does.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from models.qa import pad_ids, word_index
from mtbench.data.base import SQUAD, BatchRecipe, QAExample
from mtbench.workload.base import SetupContext, StepLoss, Workload, optimizer_from

PAD, UNK, CLS, SEP = 0, 1, 2, 3


class BertQA(nn.Module):
    def __init__(self, vocab_size: int, hidden: int, layers: int, heads: int, intermediate: int,
                 max_positions: int, dropout: float) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, hidden, padding_idx=PAD)
        self.positions = nn.Embedding(max_positions, hidden)
        self.segments = nn.Embedding(2, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(hidden, heads, intermediate, dropout, activation="gelu",
                                           batch_first=True, norm_first=False, layer_norm_eps=1e-12)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.qa = nn.Linear(hidden, 2)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)  # BERT's initializer_range
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, ids: torch.Tensor, segments: torch.Tensor):
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        x = self.dropout(self.norm(self.tokens(ids) + self.positions(pos) + self.segments(segments)))
        x = self.encoder(x, src_key_padding_mask=ids == PAD)
        start, end = self.qa(x).unbind(-1)
        return start, end


class BERT(Workload):
    MICROBATCH = True  # its loss is a mean over the batch's examples (memory.plan=microbatch)
    STEP_LEAVES_ONLY_STATE = True  # inputs of one shape; a step keeps only gradients and optimizer state

    def __init__(self, optimizer: Any, vocab_size: int = 30522, hidden: int = 768, layers: int = 12, heads: int = 12,
                 intermediate: int = 3072, max_positions: int = 512, seq_len: int = 384, max_question: int = 64,
                 dropout: float = 0.1) -> None:
        self.make_optimizer = optimizer
        self.vocab_size, self.seq_len, self.max_question = int(vocab_size), int(seq_len), int(max_question)
        if self.seq_len > max_positions:
            from mtbench.errors import UsageError

            raise UsageError(f"model.workload.seq_len={seq_len} exceeds max_positions={max_positions}")
        self.net = BertQA(vocab_size, hidden, layers, heads, intermediate, max_positions, dropout)

    def setup(self, ctx: SetupContext) -> None:
        examples = ctx.data.squad_examples(ctx.batch_size * ctx.batches, ctx.seed)
        self.words = word_index(examples, ["[PAD]", "[UNK]", "[CLS]", "[SEP]"], self.vocab_size)
        self.net.to(ctx.device).train()
        self.optimizer = optimizer_from(self.make_optimizer, self.net.parameters())
        all_ids, all_seg, all_start, all_end = self._encode(examples)
        b = ctx.batch_size
        self.batches = [tuple(t[i: i + b].to(ctx.device) for t in (all_ids, all_seg, all_start, all_end))
                        for i in range(0, len(examples), b)]
        self.i = 0

    def _encode(self, examples: Sequence[QAExample]):
        """(ids, segments, start, end) of `[CLS] question [SEP] context [SEP]` per example, padded to seq_len."""
        ids, segments, starts, ends = [], [], [], []
        for e in examples:
            q = [self.words.get(w.lower(), UNK) for w in e.question[: self.max_question]]
            room = self.seq_len - len(q) - 3
            c = [self.words.get(w.lower(), UNK) for w in e.context[:room]]
            offset = len(q) + 2  # [CLS] q [SEP] come before the context
            ids.append([CLS] + q + [SEP] + c + [SEP])
            segments.append([0] * offset + [1] * (len(c) + 1))
            inside = e.end < len(c)
            starts.append(e.start + offset if inside else 0)
            ends.append(e.end + offset if inside else 0)
        return pad_ids(ids, PAD, self.seq_len), pad_ids(segments, 0, self.seq_len), torch.tensor(starts), \
            torch.tensor(ends)

    def batch_recipe(self) -> Optional[BatchRecipe]:
        return BatchRecipe(SQUAD, self._encode, describe="words to ids per example, padded to seq_len")

    def take_batch(self, batch: Any) -> None:
        self.batches, self.i = [tuple(batch)], 0

    def step(self) -> StepLoss:
        ids, seg, start, end = self.batches[self.i % len(self.batches)]
        self.i += 1
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.planned_backward(self._loss, ids, seg, start, end)  # memory.plan=microbatch: per example, mean
        self.optimizer.step()
        return loss

    def _loss(self, ids: torch.Tensor, seg: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        p1, p2 = self.net(ids, seg)
        return (F.cross_entropy(p1, start) + F.cross_entropy(p2, end)) / 2

    def modules(self) -> List[nn.Module]:
        return [self.net]

    def units_per_sample(self):
        return {"tokens": float(self.seq_len)}
