"""SQuAD v1.1 as a data source (`data=squad`); the file format, its tokenizing and parsing: squad_files."""
from __future__ import annotations

import numpy as np

from mtbench.data.base import SQUAD, LocalFiles
from mtbench.data.sets import text_set
from mtbench.data.squad_files import parse_squad
from mtbench.data.text import read_text
from mtbench.errors import DataError


class SQuAD(LocalFiles):
    name = "squad"
    gives = "SQuAD question/context examples"
    needs = "data.path=FILE (a SQuAD v1.1 JSON file, e.g. train-v1.1.json)"

    def __init__(self, path: str = "", **loader) -> None:
        super().__init__(path, **loader)
        self.skipped = 0  # answers that could not be placed in their context

    def pipeline_set(self, recipe, cache_dir):
        return text_set(recipe, self.location) if recipe.kind == SQUAD else super().pipeline_set(recipe, cache_dir)

    def squad_examples(self, count, seed):
        examples, self.skipped = parse_squad(read_text(self.location, "data.path"), self.location)
        if not examples:
            raise DataError(f"{self.location}: holds no question whose answer could be placed in its context")
        order = np.random.default_rng(seed).permutation(len(examples))
        return [examples[i] for i in np.resize(order, count)]
