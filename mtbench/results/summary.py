"""The one summary builder: the contract's dict (docs/results.md) for a finished job and for one whose process died."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

from mtbench.results import noise
from mtbench.results.files import SCHEMA, stats

# figures that are null with a reason in `unavailable`, never a silent null or a 0
FIGURE_KEYS = ("cpu_util_pct", "process_cpu_pct", "gpu_util_pct", "power_w", "energy_j", "mem_peak_bytes",
               "mem_system_peak_bytes", "mem_training_bytes", "mem_breakdown_bytes", "loss", "data_wait_s", "data_wait_share")
# keys every job's summary holds beside the required ones (null where the job did not get that far)
JOB_KEYS = ("mem_peak_source", "mem_baseline_bytes", "mem_runtime_bytes", "mem_file_bytes", "mem_training_step",
            "mem_mkl_bytes", "mem_mkl_note",
            "mem_fragmentation_bytes", "budget_runtime_bytes",
            "target", "budget_bytes", "budget_enforced_by", "parameters", "cudnn_benchmark", "data_pipeline", "power_mode", "memory_plan",
            "sampler", "env", "config")
# a run to a target (until.*; docs/results.md): only in such a run's summary, null with the reason where not reached
TARGET_KEYS = ("until", "target_reached", "steps_to_target", "samples_to_target", "time_to_target_s",
               "wall_to_target_s", "energy_to_target_j", "checks")


def build_summary(*, model: Optional[str], batch_size: Optional[int], device: str, data: str,
                  failure: Optional[Dict[str, str]], warmup_steps: int, durations_s: Sequence[float],
                  figures: Mapping[str, Any], reasons: Mapping[str, str], null_reason: str,
                  units_per_sample: Optional[Mapping[str, float]] = None, job: Optional[Mapping[str, Any]] = None,
                  extra: Optional[Mapping[str, Any]] = None,
                  losses: Optional[Sequence[Mapping[str, float]]] = None,
                  data_wait_s: Optional[Sequence[float]] = None,
                  target_run: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """A job's summary. `figures`: the values of FIGURE_KEYS it has (the others are null); `reasons`: why a figure
    is null, where known ({key or key.field: reason}); `null_reason`: the reason of every other null figure;
    `job`: the JOB_KEYS it has and any other key of the job (the budget's); `extra` is added last (the workload's
    own metrics); `losses`: what each measured step's `step()` returned, by name (None or empty: `null_reason`
    says why there is no loss); `data_wait_s`: the seconds each measured step blocked on its batch
    (data.loader=dataloader; the job gives the reason where batches were made before timing); `target_run`: the
    TARGET_KEYS of a run to a target and their reasons in its `unavailable` (None: an ordinary run)."""
    measured = len(durations_s)
    total_s = float(sum(durations_s))
    throughput = batch_size * measured / total_s if batch_size and total_s > 0 else None
    summary: Dict[str, Any] = {
        "schema": SCHEMA,
        "model": model,
        "batch_size": batch_size,
        "device": device,
        "data": data,
        "success": failure is None,
        "failure": failure,
        "warmup_steps": warmup_steps,
        "measured_steps": measured,
        "step_time_s": stats(durations_s),
        "throughput_samples_per_s": throughput,
        "throughput_units_per_s": {k: v * throughput for k, v in (units_per_sample or {}).items()} if throughput
        else {},
    }
    waits = list(data_wait_s or [])
    # the share of the training loop's time spent waiting for data: waits / (waits + step times)
    loop_s = sum(waits) + total_s
    figures = {**figures, **_loss_figures(losses), "data_wait_s": stats(waits),
               "data_wait_share": sum(waits) / loop_s if waits and loop_s > 0 else None}
    summary.update({k: figures.get(k) for k in FIGURE_KEYS})
    # training memory is what the training process owns, anonymous and shmem (docs/memory.md "Training memory"):
    # on CPU the kernel's high-water mark less the file-backed pages (device/peak.py, what a budget compares), else
    # the sampler's 5 ms samples of it, which are recorded beside
    summary["mem_training_sampled_bytes"] = summary["mem_training_bytes"]
    summary["mem_training_source"] = "rss_anon_sampled" if summary["mem_training_bytes"] is not None else None
    if (job or {}).get("mem_training_peak_bytes") is not None:
        summary["mem_training_bytes"] = job["mem_training_peak_bytes"]  # type: ignore[index]
        summary["mem_training_source"] = "rss_hwm_less_file"
    if "losses" in figures:
        summary["losses"] = figures["losses"]
    unavailable = dict(reasons)
    if losses and summary["loss"] is None:  # steps measured, none with a loss (no steps: the job's reason)
        unavailable["loss"] = "the workload's training step returns no loss"
    unavailable.update({k: null_reason for k in FIGURE_KEYS if summary[k] is None and k not in unavailable})
    if target_run is not None:
        unavailable.update(target_run.get("unavailable") or {})
        summary.update({k: target_run.get(k) for k in TARGET_KEYS})
    summary["unavailable"] = unavailable
    summary.update({k: None for k in JOB_KEYS})
    summary["profiled"] = False
    summary.update(job or {})
    summary.pop("mem_training_peak_bytes", None)  # it is mem_training_bytes (source rss_hwm_less_file)
    summary.update(extra or {})
    summary["noise"], why = noise.assess(summary, durations_s)  # varying steps, other busy processes
    unavailable.update(why)
    return summary


def loss_stats(values: Sequence[float]) -> Dict[str, Any]:
    """{first, last, min} of one loss over the measured steps; a NaN or infinite loss (a run that diverged) is null
    in first / last, left out of min, and counted in nonfinite_steps."""
    finite = [v for v in values if math.isfinite(v)]
    return {"first": values[0], "last": values[-1], "min": min(finite) if finite else None,
            "nonfinite_steps": len(values) - len(finite)}


def _loss_figures(losses: Optional[Sequence[Mapping[str, float]]]) -> Dict[str, Any]:
    """summary.json's `loss` (the headline: a workload's first loss, with its `name`) and, for a workload with
    several named losses, `losses` ({name: stats})."""
    names: List[str] = []
    for step in losses or ():
        names += [n for n in step if n not in names]
    if not names:
        return {}
    by_name = {n: loss_stats([float(s[n]) for s in losses or () if n in s]) for n in names}
    figures: Dict[str, Any] = {"loss": {**by_name[names[0]], "name": names[0]}}
    if len(names) > 1:
        figures["losses"] = by_name
    return figures
