"""BiDAF (Seo, Kembhavi, Farhadi, Hajishirzi, "Bidirectional Attention Flow for Machine Comprehension",
ICLR 2017) on SQuAD: a character CNN (8-d character embeddings, 100 filters of width 5, max-pooled) and
100-d word embeddings, a 2-layer highway network, contextual bi-LSTMs (d = 100), the attention flow layer
(context-to-query and query-to-context attention from one similarity matrix), a 2-layer bi-LSTM modeling
layer, and start / end outputs (the end through one more bi-LSTM), trained with the sum of the two
cross-entropy losses.

The paper uses fixed pre-trained GloVe vectors. No pretrained vectors can be fetched here, so the word
embeddings are randomly initialized; they stay frozen as in the paper, so the trained parameters and the
work per step match.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.qa import pad_ids, word_index
from mtbench.data.base import SQUAD, BatchRecipe, QAExample
from mtbench.workload.base import SetupContext, StepLoss, Workload, optimizer_from

PAD, UNK = 0, 1


class Highway(nn.Module):
    def __init__(self, dim: int, layers: int = 2) -> None:
        super().__init__()
        self.transform = nn.ModuleList([nn.Linear(dim, dim) for _ in range(layers)])
        self.gate = nn.ModuleList([nn.Linear(dim, dim) for _ in range(layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for transform, gate in zip(self.transform, self.gate):
            g = torch.sigmoid(gate(x))
            x = g * F.relu(transform(x)) + (1 - g) * x
        return x


def masked_softmax_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return logits.masked_fill(~mask, float("-inf"))


class BiDAFNet(nn.Module):
    def __init__(self, words: int, chars: int, d: int = 100, word_dim: int = 100, char_dim: int = 8,
                 char_filters: int = 100, char_width: int = 5, dropout: float = 0.2) -> None:
        super().__init__()
        self.word_embed = nn.Embedding(words, word_dim, padding_idx=PAD)
        self.word_embed.weight.requires_grad_(False)  # fixed, as the paper keeps GloVe fixed
        self.char_embed = nn.Embedding(chars, char_dim, padding_idx=PAD)
        self.char_conv = nn.Conv1d(char_dim, char_filters, char_width, padding=char_width // 2)
        self.highway = Highway(word_dim + char_filters)
        self.context_lstm = nn.LSTM(word_dim + char_filters, d, batch_first=True, bidirectional=True)
        self.similarity = nn.Linear(6 * d, 1, bias=False)
        self.modeling = nn.LSTM(8 * d, d, 2, batch_first=True, bidirectional=True, dropout=dropout)
        self.end_lstm = nn.LSTM(2 * d, d, batch_first=True, bidirectional=True)
        self.start_out = nn.Linear(10 * d, 1)
        self.end_out = nn.Linear(10 * d, 1)
        self.dropout = nn.Dropout(dropout)
        self.d = d

    def embed(self, words: torch.Tensor, chars: torch.Tensor) -> torch.Tensor:
        b, n, w = chars.shape
        c = self.char_embed(chars.view(b * n, w)).transpose(1, 2)  # (B*N) x C x W
        c = F.relu(self.char_conv(self.dropout(c))).max(dim=2).values.view(b, n, -1)
        h = self.highway(torch.cat([self.word_embed(words), c], -1))
        return self.context_lstm(self.dropout(h))[0]  # B x N x 2d

    def forward(self, cw, cc, qw, qc):
        c_mask, q_mask = cw != PAD, qw != PAD
        h, u = self.embed(cw, cc), self.embed(qw, qc)  # B x T x 2d, B x J x 2d
        # S_tj = w^T [h_t; u_j; h_t * u_j], split so that no B x T x J x 6d tensor is built
        w_h, w_u, w_hu = self.similarity.weight.view(3, -1)
        s = (h @ w_h).unsqueeze(2) + (u @ w_u).unsqueeze(1) + torch.bmm(h * w_hu, u.transpose(1, 2))
        a = masked_softmax_logits(s, q_mask.unsqueeze(1)).softmax(-1)  # context-to-query
        u_tilde = torch.bmm(a, u)
        b = masked_softmax_logits(s.max(-1).values, c_mask).softmax(-1)  # query-to-context
        h_tilde = torch.bmm(b.unsqueeze(1), h).expand_as(h)
        g = torch.cat([h, u_tilde, h * u_tilde, h * h_tilde], -1)  # B x T x 8d
        m = self.modeling(self.dropout(g))[0]
        m2 = self.end_lstm(self.dropout(m))[0]
        start = masked_softmax_logits(self.start_out(torch.cat([g, m], -1)).squeeze(-1), c_mask)
        end = masked_softmax_logits(self.end_out(torch.cat([g, m2], -1)).squeeze(-1), c_mask)
        return start, end


class BiDAF(Workload):
    MICROBATCH = True  # its loss is a mean over the batch's examples (memory.plan=microbatch)
    PADDED_PER_BATCH = True  # batches padded to their own longest example (the predictor traces the largest)

    def __init__(self, optimizer: Any, d: int = 100, words: int = 100000, chars: int = 300,
                 max_word_len: int = 16, max_context: int = 400, dropout: float = 0.2) -> None:
        self.make_optimizer = optimizer
        self.max_words, self.max_chars = int(words), int(chars)
        self.max_word_len, self.max_context = int(max_word_len), int(max_context)
        self.arch = dict(d=d, dropout=dropout)
        self.net = BiDAFNet(self.max_words, self.max_chars, **self.arch)

    def setup(self, ctx: SetupContext) -> None:
        examples = ctx.data.squad_examples(ctx.batch_size * ctx.batches, ctx.seed)
        # answers past the context cut cannot be trained on; refill to batch x batches from the rest
        usable = [e for e in examples if e.end < self.max_context] or examples[:1]
        examples = [usable[k % len(usable)] for k in range(len(examples))]
        self.words = word_index(examples, ["<pad>", "<unk>"], self.max_words)
        chars = sorted({ch for e in examples for w in e.context + e.question for ch in w})
        self.chars = {ch: i + 2 for i, ch in enumerate(chars[: self.max_chars - 2])}
        self.net = BiDAFNet(max(len(self.words), 2), self.max_chars, **self.arch)
        self.net.to(ctx.device).train()
        self.optimizer = optimizer_from(self.make_optimizer, (p for p in self.net.parameters() if p.requires_grad))
        self.batches = []
        for i in range(0, len(examples), ctx.batch_size):
            chunk = examples[i: i + ctx.batch_size]
            self.batches.append(tuple(t.to(ctx.device) for t in self._encode(chunk)))
        self.i = 0

    def _chars(self, tokens: List[List[str]]) -> torch.Tensor:
        longest = max(len(t) for t in tokens)
        # filled in NumPy, one tensor at the end: a tensor op per word made the predictor's fake-tensor trace of 8
        # prepared batches take 14 s
        out = np.zeros((len(tokens), longest, self.max_word_len), dtype=np.int64)
        for i, words in enumerate(tokens):
            for j, w in enumerate(words):
                ids = [self.chars.get(ch, UNK) for ch in w[: self.max_word_len]]
                out[i, j, : len(ids)] = ids
        return torch.tensor(out)

    def _encode(self, examples: Sequence[QAExample]):
        ctxs = [e.context[: self.max_context] for e in examples]
        qs = [e.question for e in examples]
        ids = lambda rows: pad_ids([[self.words.get(w.lower(), UNK) for w in r] for r in rows], PAD)  # noqa: E731
        start = torch.tensor([e.start for e in examples])
        end = torch.tensor([min(e.end, self.max_context - 1) for e in examples])
        return ids(ctxs), self._chars(ctxs), ids(qs), self._chars(qs), start, end

    def batch_recipe(self) -> Optional[BatchRecipe]:
        return BatchRecipe(SQUAD, self._encode, describe="words and characters to ids per example, padded per batch")

    def take_batch(self, batch: Any) -> None:
        self.batches, self.i = [tuple(batch)], 0

    def step(self) -> StepLoss:
        cw, cc, qw, qc, start, end = self.batches[self.i % len(self.batches)]
        self.i += 1
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.planned_backward(self._loss, cw, cc, qw, qc, start, end)  # memory.plan=microbatch: per example
        self.optimizer.step()
        return loss

    def _loss(self, cw: torch.Tensor, cc: torch.Tensor, qw: torch.Tensor, qc: torch.Tensor, start: torch.Tensor,
              end: torch.Tensor) -> torch.Tensor:
        p1, p2 = self.net(cw, cc, qw, qc)
        return F.cross_entropy(p1, start) + F.cross_entropy(p2, end)

    def modules(self) -> List[nn.Module]:
        return [self.net]

    def parameter_count(self) -> int:
        # trained parameters: the frozen word embeddings are not among them
        return sum(p.numel() for p in self.net.parameters() if p.requires_grad)
