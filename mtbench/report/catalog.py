"""`mtbench models`: every model in conf/model/ with its parameters and its training FLOPs per sample.

FLOPs are counted by torch.utils.flop_counter.FlopCounterMode over one real training step of the workload
(forward, backward, optimizer) on the meta device: shapes only, nothing is allocated nor computed. The count
is what FlopCounterMode counts (matrix products and convolutions, 2 FLOPs per multiply-add; element-wise
work, normalization and the optimizer's update are not counted), per sample at the configured batch and
input size, on synthetic data shaped like the real set. Two corrections: torch's convolution backward
formula ignores groups (it counts a depthwise convolution's weight gradient `groups` times over), and an
LSTM on the meta device runs step by step through Python decompositions (seconds for one BiDAF step), so
each LSTM call is replaced by the same matrix products done for all time steps at once (the same FLOPs).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence

from hydra import compose, initialize_config_dir
from rich.table import Table

from mtbench.config import conf_dir, group_options, instantiate
from mtbench.report.flop_cache import FlopCache
from mtbench.results.console import console
from mtbench.results.live import WorkProgress
from mtbench.errors import UsageError, describe_error


@dataclass
class ModelRow:
    name: str
    parameters: int  # trained parameters
    paper_params: Optional[int]  # the count the paper's Table II gives, when it gives one
    flops_per_sample: Optional[float]  # forward + backward FLOPs of one training sample (None: see flops_note)
    flops_note: str  # the input the FLOPs are for ("3x32x32"), or why they are missing
    description: str


def model_rows(overrides: Sequence[str] = (), names: Optional[Sequence[str]] = None,
               cache: Optional[FlopCache] = None) -> List[ModelRow]:
    """One row per model (or per model in `names`), each composed with `overrides` (e.g. data.image_size=224,
    batch=1). A model that an override does not fit (model.workload.net.variant for bert) is left out. With a
    `cache`, a row made before for the same overrides, conf/, torch and model code is read from it (nothing is
    composed nor built); the others are made (with a progress bar) and kept."""
    names = list(names if names is not None else group_options("model"))
    found: Dict[str, ModelRow] = {}
    for name in names if cache is not None else ():
        row = cache.load(cache.key(name, overrides))
        if row is not None:
            found[name] = ModelRow(**row)
    composed, skipped = [], []
    missing = [name for name in names if name not in found]
    if missing:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            for name in missing:
                try:
                    composed.append((name, compose(config_name="config", overrides=[f"model={name}", *overrides])))
                except Exception as exc:  # an override for keys this model does not have (model.workload.net...)
                    skipped.append((name, exc))
    if not composed and not found and skipped:
        raise UsageError(f"the overrides {' '.join(overrides)} apply to no model ({skipped[0][1]})")
    with WorkProgress("counting FLOPs (once per model and config; cached after)", len(composed)) as progress:
        for name, cfg in composed:
            progress.item(name)
            found[name] = _row(name, cfg)
            if cache is not None:
                cache.store(cache.key(name, overrides), asdict(found[name]))
    return [found[name] for name in names if name in found]


def _row(name: str, cfg: Any) -> ModelRow:
    import torch  # here, not at the top: a listing from the cache imports no torch

    from mtbench.report.flops import training_flops_per_sample
    from mtbench.workload.torch_internals import on_device

    with on_device("meta"):  # shapes only: a 140M-parameter VGG costs nothing to build
        workload = instantiate(cfg.model.workload, "model.workload")
    params = workload.parameter_count()
    try:
        flops, note = training_flops_per_sample(workload, cfg)
        params = workload.parameter_count()  # after setup: some models size their vocabulary from the data
    except Exception as exc:  # e.g. dcgan at data.image_size=224: the row keeps its parameters and says why
        flops, note = None, f"not counted: {describe_error(exc)}"
    return ModelRow(name, params, cfg.model.get("paper_params"), flops, note, cfg.model.description)


def print_models(overrides: Sequence[str] = (), cache: Optional[FlopCache] = None) -> None:
    rows = model_rows(overrides, cache=cache)
    table = Table(title="mtbench models" + (f" ({' '.join(overrides)})" if overrides else ""),
                  caption="GFLOP/sample: forward + backward of one training sample, at the configured batch "
                          "and input size (FlopCounterMode on the meta device; see README)")
    for column in ("model", "parameters", "paper (Table II)", "GFLOP/sample", "input", "description"):
        table.add_column(column, justify="right" if column in ("parameters", "paper (Table II)", "GFLOP/sample")
                         else "left")
    for row in rows:
        flops = f"{row.flops_per_sample / 1e9:.3g}" if row.flops_per_sample is not None else "n/a"
        table.add_row(row.name, f"{row.parameters / 1e6:.2f}M", f"{row.paper_params / 1e6:.0f}M" if row.paper_params
                      else "", flops, row.flops_note, row.description)
    console.print(table)
    left_out = sorted(set(group_options("model")) - {row.name for row in rows})
    if left_out:
        console.print(f"left out (the overrides do not apply to them): {', '.join(left_out)}")
