"""A group of runs of one configuration (`repeat=N`, or jobs a report finds twice): the group's summary and each
figure's mean, std and 95 % confidence interval across the runs."""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence


# Student's t, two-sided 95 % (the 0.975 quantile), for 1-30 degrees of freedom; beyond, Cornish-Fisher's expansion
# around the normal quantile (within 2e-6 of the exact value from 31 on)
T975 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139,
        2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922, 2.093024, 2.085963,
        2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272)
Z975 = 1.959964


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` >= 1 degrees of freedom."""
    if df <= len(T975):
        return T975[df - 1]
    z = Z975
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


def spread(values: Sequence[Optional[float]]) -> Dict[str, Any]:
    """{mean, std (sample, n-1), ci95: [lo, hi] (Student's t), values, reason}: null where a value is null or n < 2,
    `reason` then says why (else null)."""
    listed = [None if v is None or not math.isfinite(v) else float(v) for v in values]
    out: Dict[str, Any] = {"mean": None, "std": None, "ci95": None, "values": listed, "reason": None}
    if not listed or any(v is None for v in listed):
        out["reason"] = "a repeat has no value of this figure" if listed else "no repeat finished"
        return out
    n = len(listed)
    out["mean"] = mean = sum(listed) / n
    if n < 2:
        out["reason"] = "one repeat: a spread needs at least 2"
        return out
    out["std"] = std = math.sqrt(sum((v - mean) ** 2 for v in listed) / (n - 1))
    half = t975(n - 1) * std / math.sqrt(n)
    out["ci95"] = [mean - half, mean + half]
    return out


def _median_step_s(summary: Dict[str, Any]) -> Optional[float]:
    return (summary.get("step_time_s") or {}).get("median") if isinstance(summary.get("step_time_s"), dict) else None


def _energy_per_sample_j(summary: Dict[str, Any]) -> Optional[float]:
    per_step = (summary.get("energy_j") or {}).get("per_step_mean") if isinstance(summary.get("energy_j"), dict) \
        else None
    batch = summary.get("batch_size")
    return per_step / batch if per_step is not None and batch else None


# the figures whose spread across repeats the group gives, and how each is read from one repeat's summary
FIGURES: Dict[str, Callable[[Dict[str, Any]], Optional[float]]] = {
    "step_time_s": _median_step_s,  # each repeat's median step time
    "throughput": lambda s: s.get("throughput_samples_per_s"),
    "energy_per_sample_j": _energy_per_sample_j,
}


def group_summary(summaries: List[Dict[str, Any]], folders: List[str]) -> Dict[str, Any]:
    """The group's summary: the summary of the repeat with the median step time (the lower middle one of an even
    count) plus `repeats`; where a repeat failed, the first failed one's summary (the group did not succeed), the
    spreads still those of the repeats that succeeded."""
    pairs = list(zip(summaries, folders))
    ok = [(s, f) for s, f in pairs if s.get("success") and _median_step_s(s) is not None]
    failed = [(s, f) for s, f in pairs if not (s.get("success") and _median_step_s(s) is not None)]
    if failed:
        base, folder = failed[0]
    else:
        ranked = sorted(ok, key=lambda pair: _median_step_s(pair[0]))
        base, folder = ranked[(len(ranked) - 1) // 2]
    group = dict(base)
    # the group ran from the first repeat's start to the last one's end
    group["started_at"], group["finished_at"] = summaries[0].get("started_at"), summaries[-1].get("finished_at")
    group["repeats"] = {
        "n": len(summaries),
        "folders": list(folders),
        "succeeded": len(ok),
        "summary_of": folder,  # the repeat whose summary the group's is
        **{name: spread([read(s) for s, _ in ok]) for name, read in FIGURES.items()},
    }
    return group
