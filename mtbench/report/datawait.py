"""The input pipeline's figure: per model, the mean step split into compute and data wait across data.workers.

One bar per job that ran data.loader=dataloader (and the same model's data.loader=preloaded jobs as the reference
without a pipeline): its compute (the mean measured step, the window the job times) with the mean data wait (the
time the training loop blocked on its next batch) stacked on it, so the bar is the loop's time per step. The workers'
CPU (summary.json's data_pipeline.cpu) is written above each bar.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402

from mtbench.report.jobs import value_at  # noqa: E402
from mtbench.report.panels import save_png  # noqa: E402


def _pipeline(job: Dict[str, Any]) -> Dict[str, Any]:
    found = job.get("data_pipeline")
    return found if isinstance(found, dict) else {}


def bar_label(job: Dict[str, Any]) -> str:
    """"preloaded b32", or "2 workers b32" (", cold" where the page cache was dropped first)."""
    pipe = _pipeline(job)
    batch = f"b{job.get('batch_size')}"
    if pipe.get("loader") != "dataloader":
        return f"preloaded {batch}"
    workers = pipe.get("workers")
    cold = ", cold" if pipe.get("cache") in ("cold", "drop_caches") else ""
    return f"{workers} worker{'' if workers == 1 else 's'} {batch}{cold}"


def _order(job: Dict[str, Any]) -> tuple:
    pipe = _pipeline(job)
    loader = pipe.get("loader") == "dataloader"
    workers = pipe.get("workers") if isinstance(pipe.get("workers"), int) else -1
    return (value_at(job, "batch_size") or 0, loader, workers, str(pipe.get("cache")))


def _workers_cpu(job: Dict[str, Any]) -> Optional[float]:
    return value_at(_pipeline(job), "cpu", "workers_cpu_pct")


def fig_datawait(jobs: List[Dict[str, Any]], out: Path) -> List[str]:
    """datawait_<model>.png per model with at least one data.loader=dataloader job that finished (none: [])."""
    ok = [j for j in jobs if j.get("success") and value_at(j, "step_time_s", "mean") is not None]
    models = sorted({str(j.get("model")) for j in ok if _pipeline(j).get("loader") == "dataloader"})
    names = []
    for model in models:
        mine = sorted((j for j in ok if str(j.get("model")) == model), key=_order)
        compute = [value_at(j, "step_time_s", "mean") or 0.0 for j in mine]
        wait = [value_at(j, "data_wait_s", "mean") or 0.0 for j in mine]
        fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(mine) + 2), 4.2))
        xs = range(len(mine))
        ax.bar(xs, compute, color="C0", label="compute (the timed step)")
        ax.bar(xs, wait, bottom=compute, color="C1", label="data wait (blocked on the next batch)")
        for x, j, c, w in zip(xs, mine, compute, wait):
            cpu = _workers_cpu(j)
            share = value_at(j, "data_wait_share")
            text = [f"wait {100 * share:.0f} %" if share is not None else ""]
            if cpu is not None:
                text.append(f"workers {cpu:.0f} % CPU")
            ax.annotate("\n".join(t for t in text if t), (x, c + w), xytext=(0, 3), textcoords="offset points",
                        ha="center", va="bottom", fontsize=7)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([bar_label(j) for j in mine], rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("seconds per step (mean)")
        ax.set_title(f"{model}: step time split into compute and data wait")
        ax.set_ylim(0, max(c + w for c, w in zip(compute, wait)) * 1.25 or 1.0)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8, loc="upper left")
        fig.tight_layout()
        name = f"datawait_{model}.png"
        save_png(fig, out / name)
        plt.close(fig)
        names.append(name)
    return names
