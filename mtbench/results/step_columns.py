"""Columns a job adds to steps.csv beside the sampler's: each step's losses and the wait for its batch."""
from __future__ import annotations

from typing import Dict, List, Optional


def seconds(value: Optional[float]) -> Optional[str]:
    return None if value is None else f"{value:.6f}"


def with_losses(header: List[str], rows: List[list], losses: Dict[int, Dict[str, float]]):
    """steps.csv's loss columns: `loss` (the headline, a workload's first loss) and, for a workload with named
    losses, one column per name (DCGAN: loss_d, loss_g); empty where a step returned none."""
    names: List[str] = []
    for step in losses.values():
        names += [n for n in step if n not in names]
    named = [n for n in names if n != "loss"]
    out = []
    for row in rows:
        values = losses.get(row[0], {})
        headline = next(iter(values.values()), None)
        out.append(row + [headline] + [values.get(n) for n in named])
    return header + ["loss"] + named, out
