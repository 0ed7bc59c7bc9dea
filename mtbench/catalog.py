"""`mtbench models`: every model in conf/model/ with its parameter count (built on the meta device: no memory)."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from hydra import compose, initialize_config_dir
from rich.table import Table

from mtbench.config import conf_dir, group_options, instantiate
from mtbench.console import console


def model_rows() -> List[Tuple[str, int, Optional[int], str]]:
    """(name, parameters, paper's parameter count or None, description) for every model."""
    rows = []
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        for name in group_options("model"):
            cfg = compose(config_name="config", overrides=[f"model={name}"])
            with torch.device("meta"):  # shapes only: a 140M-parameter VGG costs nothing to count
                workload = instantiate(cfg.model.workload)
            rows.append((name, workload.parameter_count(), cfg.model.get("paper_params"), cfg.model.description))
    return rows


def print_models() -> None:
    table = Table(title="mtbench models")
    for column in ("model", "parameters", "paper (Table II)", "description"):
        table.add_column(column, justify="right" if column in ("parameters", "paper (Table II)") else "left")
    for name, params, paper, description in model_rows():
        table.add_row(name, f"{params / 1e6:.2f}M", f"{paper / 1e6:.0f}M" if paper else "", description)
    console.print(table)
