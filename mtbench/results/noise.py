"""Was the measurement noisy: steps whose times vary, or other processes busy on the machine (summary.json's `noise`)."""
from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

STEP_CV_LIMIT = 0.10  # a job whose measured steps' coefficient of variation (std / mean) is above this is noisy
# % of the machine's CPU (all cores) that processes other than the job's may keep busy during its measured steps
BUSY_OTHER_LIMIT_PCT = 10.0


def step_cv(durations_s: Sequence[float]) -> Optional[float]:
    """The coefficient of variation of the step times (sample std / mean); None for fewer than 2 steps."""
    values = [float(d) for d in durations_s if d is not None and math.isfinite(d)]
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    if mean <= 0:
        return None
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(var) / mean


def busy_other_pct(summary: Mapping[str, Any]) -> Tuple[Optional[float], Optional[str]]:
    """(% of the machine's CPU that other processes kept busy during the measured steps, None) or (None, why).

    From the samples' tick-exact figures: the machine's busy ticks (cpu_util_pct.mean over its cores) less the
    job's own process (process_cpu_pct) and, in sampler.mode=process, the sampling process (sampler.cpu_pct_of_one
    _core), which is the measurement's and not a disturbance. A DataLoader's worker processes count as other."""
    cpu = summary.get("cpu_util_pct")
    job = summary.get("process_cpu_pct")
    if not isinstance(cpu, dict) or cpu.get("mean") is None or not cpu.get("per_core"):
        return None, "no per-core CPU figures over the measured steps (the procfs sensor gives them)"
    if job is None:
        return None, "no CPU time of the job's process over the measured steps (the procfs sensor gives it)"
    cores = len(cpu["per_core"])
    sampler = summary.get("sampler") or {}
    own = sampler.get("cpu_pct_of_one_core") if sampler.get("mode") == "process" else None
    other_core_pct = cpu["mean"] * cores - job - (own or 0.0)  # in % of one core
    return max(0.0, other_core_pct / cores), None


def assess(summary: Mapping[str, Any], durations_s: Sequence[float]) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """({noisy, step_cv, reasons: [why it is noisy], busy_other_pct}, {noise.field: why it is null})."""
    cv = step_cv(durations_s)
    other, why_other = busy_other_pct(summary)
    reasons = []
    if cv is not None and cv > STEP_CV_LIMIT:
        reasons.append(f"the measured steps' times vary: coefficient of variation {100 * cv:.0f} % > "
                       f"{100 * STEP_CV_LIMIT:.0f} %")
    if other is not None and other > BUSY_OTHER_LIMIT_PCT:
        reasons.append(f"other processes kept {other:.0f} % of the machine's CPU busy during the measured steps "
                       f"(> {BUSY_OTHER_LIMIT_PCT:.0f} %)")
    missing = {}
    if cv is None:
        missing["noise.step_cv"] = "fewer than 2 measured steps"
    if why_other:
        missing["noise.busy_other_pct"] = why_other
    return {"noisy": bool(reasons), "step_cv": cv, "reasons": reasons, "busy_other_pct": other}, missing
