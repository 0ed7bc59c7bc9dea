"""seq2seq with attention, the IWSLT15 English-Vietnamese setup of the NMT tutorials (Luong, Brevdo, Zhao
2017; Sutskever, Vinyals, Le 2014; Luong, Pham, Manning 2015): a 2-layer LSTM encoder and a 2-layer LSTM
decoder of 512 units, dropout 0.2, multiplicative (Luong) attention over the encoder states, teacher
forcing, padded batches with the padding masked out of attention and loss.

Without input feeding the attention of every target position is computed at once after the decoder LSTM
(Luong's "global attention"); this keeps the step one cuDNN LSTM call per layer, as the tutorials' fast path.
"""
from __future__ import annotations

import functools
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from mtbench.data.base import BOS, EOS, PAIRS, UNK, BatchRecipe
from mtbench.workload.base import SetupContext, StepLoss, Workload, optimizer_from


class AttentionSeq2Seq(nn.Module):
    def __init__(self, src_vocab: int, tgt_vocab: int, hidden: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.src_pad, self.tgt_pad = src_vocab, tgt_vocab  # one extra embedding row each for padding
        self.src_embed = nn.Embedding(src_vocab + 1, hidden, padding_idx=src_vocab)
        self.tgt_embed = nn.Embedding(tgt_vocab + 1, hidden, padding_idx=tgt_vocab)
        self.encoder = nn.LSTM(hidden, hidden, layers, batch_first=True, dropout=dropout)
        self.decoder = nn.LSTM(hidden, hidden, layers, batch_first=True, dropout=dropout)
        self.score = nn.Linear(hidden, hidden, bias=False)  # Luong "general": h_t^T W h_s
        self.combine = nn.Linear(2 * hidden, hidden, bias=False)
        self.project = nn.Linear(hidden, tgt_vocab)
        self.dropout = nn.Dropout(dropout)

    def forward(self, src, src_len, tgt_in) -> torch.Tensor:
        # No GPU->CPU sync in the step: src_len lives on the CPU, where pack_padded_sequence wants it, and the
        # batch is sorted by source length at setup (enforce_sorted=False would make pad_packed_sequence call
        # .cpu() on its GPU unsort indices)
        packed = pack_padded_sequence(self.dropout(self.src_embed(src)), src_len, batch_first=True,
                                      enforce_sorted=True)
        enc, state = self.encoder(packed)
        enc, _ = pad_packed_sequence(enc, batch_first=True, total_length=src.shape[1])  # B x S x H
        dec, _ = self.decoder(self.dropout(self.tgt_embed(tgt_in)), state)  # B x T x H
        scores = torch.bmm(self.score(dec), enc.transpose(1, 2))  # B x T x S
        scores = scores.masked_fill((src == self.src_pad).unsqueeze(1), float("-inf"))
        context = torch.bmm(scores.softmax(-1), enc)
        attended = torch.tanh(self.combine(torch.cat([context, dec], -1)))
        return self.project(self.dropout(attended))  # B x T x V


class Seq2Seq(Workload):
    PADDED_PER_BATCH = True  # batches padded to their own longest example (the predictor traces the largest)
    def __init__(self, optimizer: Any, src_vocab: int = 17191, tgt_vocab: int = 7709, hidden: int = 512,
                 layers: int = 2, dropout: float = 0.2) -> None:
        self.make_optimizer = optimizer
        self.arch = dict(hidden=hidden, layers=layers, dropout=dropout)
        self.net = AttentionSeq2Seq(src_vocab, tgt_vocab, **self.arch)
        self.tokens_per_pair = 0.0

    def setup(self, ctx: SetupContext) -> None:
        corpus = ctx.data.parallel_corpus(ctx.batch_size * ctx.batches, ctx.seed)
        vocabs = (len(corpus.src_vocab), len(corpus.tgt_vocab))
        if vocabs != (self.net.src_pad, self.net.tgt_pad):
            self.net = AttentionSeq2Seq(*vocabs, **self.arch)
        self.index = [{tok: i for i, tok in enumerate(v)} for v in (corpus.src_vocab, corpus.tgt_vocab)]
        self.net.to(ctx.device).train()
        self.optimizer = optimizer_from(self.make_optimizer, self.net.parameters())
        self.batches = []
        for b in range(ctx.batches):
            pairs = slice(b * ctx.batch_size, (b + 1) * ctx.batch_size)
            src, src_len, tgt_in, tgt_out = self._pad(corpus.src[pairs], corpus.tgt[pairs], *vocabs)
            # the lengths stay on the CPU (see AttentionSeq2Seq.forward): no sync in the timed step
            self.batches.append((src.to(ctx.device), src_len, tgt_in.to(ctx.device), tgt_out.to(ctx.device)))
        # tokens a sentence pair carries through the step: source + target (+ its </s>)
        self.tokens_per_pair = float(np.mean([len(s) + len(t) + 1 for s, t in zip(corpus.src, corpus.tgt)]))
        self.i = 0

    @staticmethod
    def _pad(src: List[np.ndarray], tgt: List[np.ndarray], src_pad: int, tgt_pad: int):
        """(source ids, source lengths on the CPU, target input, target output), longest source first."""
        order = sorted(range(len(src)), key=lambda i: -len(src[i]))
        src, tgt = [src[i] for i in order], [tgt[i] for i in order]
        s_len = torch.tensor([len(s) for s in src])
        t_len = max(len(t) for t in tgt) + 1
        src_t = torch.full((len(src), int(s_len.max())), src_pad, dtype=torch.long)
        tgt_in = torch.full((len(tgt), t_len), tgt_pad, dtype=torch.long)
        tgt_out = torch.full((len(tgt), t_len), tgt_pad, dtype=torch.long)
        for i, (s, t) in enumerate(zip(src, tgt)):
            src_t[i, : len(s)] = torch.from_numpy(s)
            tgt_in[i, : len(t) + 1] = torch.from_numpy(np.concatenate([[BOS], t]))  # teacher forcing input
            tgt_out[i, : len(t) + 1] = torch.from_numpy(np.concatenate([t, [EOS]]))
        return src_t, s_len, tgt_in, tgt_out

    def batch_recipe(self) -> Optional[BatchRecipe]:
        return BatchRecipe(PAIRS, functools.partial(encode_pairs, *self.index, self.net.src_pad, self.net.tgt_pad),
                           describe="tokens to ids, padded per batch, longest source first")

    def take_batch(self, batch: Any) -> None:
        src, src_len, tgt_in, tgt_out = batch
        self.batches, self.i = [(src, src_len.cpu(), tgt_in, tgt_out)], 0  # the lengths stay on the CPU (forward)

    def step(self) -> StepLoss:
        src, src_len, tgt_in, tgt_out = self.batches[self.i % len(self.batches)]
        self.i += 1
        self.optimizer.zero_grad(set_to_none=True)
        logits = self.net(src, src_len, tgt_in)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1), ignore_index=self.net.tgt_pad)
        loss.backward()
        nn.utils.clip_grad_norm_(self.net.parameters(), 5.0)
        self.optimizer.step()
        return loss.detach()  # per target token: the mean over the tokens that are not padding

    def modules(self) -> List[nn.Module]:
        return [self.net]

    def units_per_sample(self) -> Dict[str, float]:
        return {"tokens": self.tokens_per_pair} if self.tokens_per_pair else {}


def encode_pairs(src_index: Mapping[str, int], tgt_index: Mapping[str, int], src_pad: int, tgt_pad: int,
                 pairs: Sequence[Tuple[List[str], List[str]]]):
    """A batch of (source tokens, target tokens) as Seq2Seq's padded tensors (unknown tokens: <unk>)."""
    encode = lambda tokens, index: np.array([index.get(t, UNK) for t in tokens], dtype=np.int64)  # noqa: E731
    return Seq2Seq._pad([encode(s, src_index) for s, _ in pairs], [encode(t, tgt_index) for _, t in pairs],
                        src_pad, tgt_pad)
