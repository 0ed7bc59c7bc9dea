"""Random data shaped like each real set, made once from a seeded generator (`data=synthetic`, the default)."""
from __future__ import annotations

import numpy as np
import torch

from mtbench.data.base import CharCorpus, DataSource, ParallelCorpus, QAExample, check_image_shape, check_image_size


class Synthetic(DataSource):
    """Random data shaped like the real sets, made once from a seeded generator.

    Sizes follow the real sets: CIFAR-10 3x32x32 in 10 classes (`image_size` sets the side, e.g. 224); tiny Shakespeare's 65 characters;
    IWSLT15 en-vi's 17,191 / 7,709-word vocabularies and ~20-token sentences (at most 50); SQuAD v1.1's
    ~120-word contexts, ~11-word questions and ~3-word answers; Atari 4x84x84 stacked frames, 6 actions.
    """

    name = "synthetic"
    gives = "every kind, shaped like the real sets"

    def __init__(self, char_vocab: int = 65, src_vocab: int = 17191, tgt_vocab: int = 7709,
                 word_vocab: int = 50000, mean_sentence: float = 20.0, max_sentence: int = 50,
                 image_size: int = 32, **loader) -> None:
        self.set_loader(loader)
        self.image_size = check_image_size(image_size)  # images are image_size x image_size
        self.char_vocab = char_vocab
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.word_vocab = word_vocab
        self.mean_sentence, self.max_sentence = mean_sentence, max_sentence

    def image_batches(self, batch_size, count, shape, num_classes, seed):
        check_image_shape(self.image_size, shape)
        gen = torch.Generator().manual_seed(seed)
        return [
            (torch.randn((batch_size, *shape), generator=gen),
             torch.randint(0, num_classes, (batch_size,), generator=gen))
            for _ in range(count)
        ]

    def pipeline_set(self, recipe, cache_dir):
        """A synthetic set in the real files' format (CIFAR-10 pickles, a text, IWSLT15's pair, a SQuAD JSON) of this
        source's sizes and vocabularies, written to data.cache_dir once."""
        from mtbench.data import ondisk, sets
        from mtbench.data.base import CHARS, IMAGES, PAIRS

        if recipe.kind == IMAGES:
            return sets.image_set(ondisk.synthetic_cifar_root(cache_dir, seed=0),
                                  *sets.cifar_train_transform(self.image_size))
        if recipe.kind == CHARS:
            alphabet = "".join(chr(32 + i) for i in range(self.char_vocab))  # char_corpus's vocabulary
            return sets.text_set(recipe, ondisk.synthetic_text(cache_dir, alphabet))
        if recipe.kind == PAIRS:
            root = ondisk.synthetic_pairs(cache_dir, self.src_vocab, self.tgt_vocab, self.mean_sentence,
                                          self.max_sentence)
            return sets.text_set(recipe, root, src="en", tgt="vi", max_len=self.max_sentence)
        return sets.text_set(recipe, ondisk.synthetic_squad(cache_dir, self.word_vocab))

    def char_corpus(self, min_chars, seed):
        rng = np.random.default_rng(seed)
        vocab = [chr(32 + i) for i in range(self.char_vocab)]
        return CharCorpus(rng.integers(0, self.char_vocab, min_chars, dtype=np.int64), vocab)

    def _lengths(self, rng, n, mean, low, high):
        return np.clip(rng.poisson(mean, n), low, high)

    def parallel_corpus(self, pairs, seed):
        rng = np.random.default_rng(seed)
        lengths = self._lengths(rng, pairs, self.mean_sentence, 3, self.max_sentence)
        # target sentences are about as long as their source (Vietnamese runs ~20 % longer)
        tgt_lengths = np.clip((lengths * rng.uniform(0.9, 1.4, pairs)).astype(int), 3, self.max_sentence)
        src = [rng.integers(3, self.src_vocab, n, dtype=np.int64) for n in lengths]
        tgt = [rng.integers(3, self.tgt_vocab, n, dtype=np.int64) for n in tgt_lengths]
        special = ["<unk>", "<s>", "</s>"]
        return ParallelCorpus(src, tgt, special + [f"s{i}" for i in range(3, self.src_vocab)],
                              special + [f"t{i}" for i in range(3, self.tgt_vocab)])

    def squad_examples(self, count, seed):
        rng = np.random.default_rng(seed)
        out = []
        for _ in range(count):
            n_ctx = int(self._lengths(rng, 1, 120, 20, 400)[0])
            n_q = int(self._lengths(rng, 1, 11, 3, 40)[0])
            # Zipf-like word draws, so that the word vocabulary has a realistic long tail
            words = lambda n: [f"w{int(v) % self.word_vocab}" for v in rng.zipf(1.2, n)]  # noqa: E731
            n_ans = int(min(n_ctx, self._lengths(rng, 1, 3, 1, 30)[0]))
            start = int(rng.integers(0, n_ctx - n_ans + 1))
            out.append(QAExample(words(n_ctx), words(n_q), start, start + n_ans - 1))
        return out

    def atari_env(self, seed):
        from mtbench.data.atari import SyntheticFrames

        return SyntheticFrames(seed=seed)
