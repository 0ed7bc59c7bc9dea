"""The paper's character model on Shakespeare ("LSTM+CONV"): character embedding, a 1-D convolution
front end over the sequence, then LSTM layers and a softmax over the characters at every position
(next-character prediction). `conv_channels: 0` gives the plain 2-layer character LSTM (Karpathy's
char-rnn). Sizes are config keys; the defaults are a mid-sized model for 100-character sequences.
"""
from __future__ import annotations

import functools
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mtbench.data.base import CHARS, BatchRecipe
from mtbench.workload.base import SetupContext, StepLoss, Workload, optimizer_from


def encode_windows(index: Mapping[str, int], windows: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Windows of seq_len + 1 characters -> (input ids, next-character ids), B x seq_len each (unknown: id 0)."""
    ids = torch.tensor([[index.get(ch, 0) for ch in w] for w in windows], dtype=torch.long)
    return ids[:, :-1], ids[:, 1:]


class CharConvLSTM(nn.Module):
    def __init__(self, vocab: int, embed: int, conv_channels: int, kernel: int, hidden: int, layers: int,
                 dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        # causal padding: position t sees characters <= t only, so the task stays next-character prediction
        self.conv = nn.Conv1d(embed, conv_channels, kernel) if conv_channels else None
        self.kernel = kernel
        self.lstm = nn.LSTM(conv_channels or embed, hidden, layers, batch_first=True,
                            dropout=dropout if layers > 1 else 0.0)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)  # B x T x E
        if self.conv is not None:
            h = F.relu(self.conv(F.pad(h.transpose(1, 2), (self.kernel - 1, 0)))).transpose(1, 2)
        out, _ = self.lstm(h)
        return self.head(out)  # B x T x V


class CharRNN(Workload):
    MICROBATCH = True  # its loss is a mean over the batch's examples (memory.plan=microbatch)
    STEP_LEAVES_ONLY_STATE = True  # inputs of one shape; a step keeps only gradients and optimizer state

    def __init__(self, optimizer: Any, seq_len: int = 100, vocab: int = 65, embed: int = 64,
                 conv_channels: int = 128, kernel: int = 5, hidden: int = 256, layers: int = 2,
                 dropout: float = 0.2) -> None:
        self.make_optimizer = optimizer
        self.seq_len = int(seq_len)
        self.arch = dict(embed=embed, conv_channels=conv_channels, kernel=kernel, hidden=hidden, layers=layers,
                         dropout=dropout)
        self.net = CharConvLSTM(vocab, **self.arch)  # the data's alphabet may resize it in setup

    def setup(self, ctx: SetupContext) -> None:
        need = ctx.batch_size * ctx.batches * (self.seq_len + 1)
        corpus = ctx.data.char_corpus(need, ctx.seed)
        if len(corpus.ids) < self.seq_len + 1:
            from mtbench.errors import DataError

            raise DataError(f"the text has {len(corpus.ids)} characters; seq_len={self.seq_len} needs at least "
                            f"{self.seq_len + 1} (lower model.workload.seq_len)")
        if len(corpus.vocab) != self.net.head.out_features:
            self.net = CharConvLSTM(len(corpus.vocab), **self.arch)
        self.index = {ch: i for i, ch in enumerate(corpus.vocab)}  # data.loader=dataloader encodes with it
        self.net.to(ctx.device).train()
        self.optimizer = optimizer_from(self.make_optimizer, self.net.parameters())
        rng = np.random.default_rng(ctx.seed)
        starts = rng.integers(0, len(corpus.ids) - self.seq_len, (ctx.batches, ctx.batch_size))
        offsets = np.arange(self.seq_len + 1)
        windows = torch.from_numpy(corpus.ids[starts[..., None] + offsets])  # batches x B x (T+1)
        self.batches = [(w[:, :-1].to(ctx.device), w[:, 1:].to(ctx.device)) for w in windows]
        self.i = 0

    def step(self) -> StepLoss:
        x, y = self.batches[self.i % len(self.batches)]
        self.i += 1
        self.optimizer.zero_grad(set_to_none=True)
        # memory.plan=microbatch: every sequence has seq_len characters, so the mean over a micro-batch's
        # characters weighted by its share of the sequences is the batch's mean
        loss = self.planned_backward(self._loss, x, y)
        nn.utils.clip_grad_norm_(self.net.parameters(), 5.0)
        self.optimizer.step()
        return loss  # mean cross-entropy per character

    def batch_recipe(self) -> Optional[BatchRecipe]:
        return BatchRecipe(CHARS, functools.partial(encode_windows, self.index), self.seq_len,
                           "characters to ids per batch")

    def take_batch(self, batch: Any) -> None:
        self.batches, self.i = [tuple(batch)], 0

    def _loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.net(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def modules(self) -> List[nn.Module]:
        return [self.net]

    def units_per_sample(self) -> Dict[str, float]:
        return {"chars": float(self.seq_len)}
