"""memory.plan=auto: among plans whose predicted (or probed) peak fits the budget, the one with the least step time."""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch

from mtbench.planning import cost as plan_cost
from mtbench.workload.plans import AUTO_SEGMENTS, NONE, SHARES, MemoryPlan

log = logging.getLogger("mtbench")


def expected_cost(plan: MemoryPlan) -> float:
    """A rough step-time factor over `none`, to order plans where nothing better is known: recomputation runs the
    checkpointed segments' forward again (~+33 % of a step for all of them, Chen et al. 2016; in proportion to the
    share of activation bytes recomputed, a rough stand-in for their share of the forward's time); each doubling of
    the micro-batches costs ~10 % (smaller kernels, the weights read once per micro-batch)."""
    recompute = 1.0 + 0.33 * plan.share / 100 if plan.segments else 1.0
    return recompute * (1.0 + 0.1 * math.log2(plan.microbatch))


def candidates(segmentable: bool, microbatchable: bool, batch: int, segments: int = AUTO_SEGMENTS,
               batchnorm: bool = False) -> List[MemoryPlan]:
    """The plans auto considers, in order of expected cost: none, recomputation (when the workload offers blocks) of
    25, 50, 75 and 100 % of the activation bytes, 2, 4, 8, ... micro-batches (at least one sample each), alone and
    with full recomputation. With BatchNorm (which normalizes each micro-batch by its own statistics, so
    micro-batches change the gradients) the plans that keep the full batch's gradients come first."""
    seg = segments if segmentable else 0
    out = [NONE] + (recompute_candidates(seg) if seg else [])
    n = 2
    while microbatchable and n <= batch:
        out.append(MemoryPlan(microbatch=n))
        if seg:
            out.append(MemoryPlan(segments=seg, microbatch=n))
        n *= 2
    if batchnorm:
        return sorted(out, key=lambda p: (p.microbatch > 1, expected_cost(p)))
    return sorted(out, key=expected_cost)  # stable: ties keep the order above


def recompute_candidates(segments: int = AUTO_SEGMENTS) -> List[MemoryPlan]:
    """memory.plan=recompute under a budget (memory.recompute_share=auto): the shares of SHARES, cheapest first."""
    return [MemoryPlan(segments=segments, share=share) for share in SHARES]


@dataclass
class Choice:
    plan: MemoryPlan
    method: str  # "predictor" | "probes" | "fixed"
    chosen_because: str
    predicted_peak_bytes: Optional[int] = None
    predicted_step_time_s: Optional[float] = None
    probed_peak_bytes: Optional[int] = None
    considered: List[Dict[str, Any]] = field(default_factory=list)  # every candidate with its figures
    # whether the predictor's peak decided (None: it was not asked), and why not
    predictor_peak_trusted: Optional[bool] = None
    untrusted_because: Optional[str] = None
    order: str = "fixed"  # how the candidates were ordered: "fixed" (expected_cost), "trace" (plan_cost), "time"


@dataclass
class Guide:
    """What the predictor's traces tell the probes where its peak is not trusted: the candidates in order of expected
    cost, each one's cost interval, and the traced tensor peak, a lower bound of the measured one (a plan whose
    tensors alone exceed the budget is not probed)."""

    plans: List[MemoryPlan]
    costs: Dict[MemoryPlan, plan_cost.PlanCost]
    tensor_bytes: Dict[MemoryPlan, int]  # the bound: traced tensors, or (a trusted predictor) its predicted peak
    untrusted_because: Optional[str]  # None: the predictor's peak is trusted (it has no step time to order by)

    @property
    def bound_name(self) -> str:
        return "traced_tensor_bytes" if self.untrusted_because else "predicted_peak_bytes"


# The predictor's CPU peak is its traced tensor peak (exact for every plan: tests/planning/test_plan_defaults.py) plus the
# memory that is not tensors (oneDNN's reordered weights, the libraries' pages a step touches, glibc's small-block
# heap): an assumed 256 MiB without a calibration, and a calibration is fitted on plain runs, while recomputation
# changes that memory (measured on a small MobileNetV2: 52 MB plain, 61-67 MB recomputing; docs/memory.md).
UNTRUSTED_CPU = ("on a CPU its peak adds an assumed figure for the memory that is not tensors (no calibration of "
                 "this device: `mtbench calibrate`); the traced tensor peak is exact and only bounds the peak from "
                 "below")
UNTRUSTED_RECOMPUTE = ("on a CPU the calibrated memory that is not tensors was fitted on plain runs; recomputation "
                       "changes it (+17-28 % measured)")


def peak_untrusted(device_type: str, calibrated_non_tensor: bool, plans: List[MemoryPlan]) -> Optional[str]:
    """Why the predictor's peak cannot decide among `plans` within 5 % (docs/memory.md), or None where it can (a
    CUDA device: its allocator model and the cuBLAS workspace; the choice is still confirmed by a probe)."""
    if device_type == "cuda":
        return None
    if not calibrated_non_tensor:
        return UNTRUSTED_CPU
    if any(p.segments for p in plans):
        return UNTRUSTED_RECOMPUTE
    return None


def _fits(peak: Optional[int], budget: Optional[int]) -> bool:
    return budget is None or (peak is not None and peak <= budget)


AFTER_FIRST_FIT = 2  # plans predicted after the first that fits (a trace takes seconds on a CPU)


def choose_by_prediction(plans: List[MemoryPlan], budget: int,
                         predict: Callable[[MemoryPlan], Any], batchnorm: bool = False) -> Choice:
    """predict(plan) -> a Prediction (peak_bytes, step_time_s). Plans are predicted in order of expected cost until
    the first that fits and AFTER_FIRST_FIT more; among those that fit, the least predicted step time (ties: the
    order of expected cost); without predicted times, the first that fits. With BatchNorm, a plan without
    micro-batches that fits is taken before any with them (exact gradients before speed)."""
    rows: List[Dict[str, Any]] = []
    left = None
    for plan in plans:
        p = predict(plan)
        rows.append({**plan.to_dict(), "predicted_peak_bytes": p.peak_bytes, "predicted_step_time_s": p.step_time_s,
                     "fits": _fits(p.peak_bytes, budget)})
        if left is None and rows[-1]["fits"]:
            left = AFTER_FIRST_FIT
        elif left is not None:
            left -= 1
        if left == 0:
            break
    plans = plans[:len(rows)]
    fitting = [(r, plan) for r, plan in zip(rows, plans) if r["fits"]]
    if not fitting:
        r, plan = min(zip(rows, plans), key=lambda rp: rp[0]["predicted_peak_bytes"])
        why = (f"no plan's predicted peak fits the budget of {budget} bytes: the smallest predicted peak "
               f"({r['predicted_peak_bytes']} bytes, {plan.label})")
        return Choice(plan, "predictor", why, r["predicted_peak_bytes"], r["predicted_step_time_s"], considered=rows)
    exact = [(r, plan) for r, plan in fitting if plan.microbatch == 1]
    note = ""
    if batchnorm and exact and len(exact) < len(fitting):
        fitting, note = exact, "; BatchNorm: plans without micro-batches first (the full batch's gradients)"
    timed = [(r, plan) for r, plan in fitting if r["predicted_step_time_s"] is not None]
    if timed:
        best = min(r["predicted_step_time_s"] for r, _ in timed)
        # times within 0.1 % are a tie (a roofline gives micro-batches the same time): the cheaper order wins
        r, plan = next((r, p) for r, p in timed if r["predicted_step_time_s"] <= best * 1.001)
        why = (f"least predicted step time ({r['predicted_step_time_s']:.4g} s) of the {len(fitting)} of "
               f"{len(plans)} plans whose predicted peak fits {budget} bytes")
    else:
        r, plan = fitting[0]
        why = (f"first in order of expected cost whose predicted peak fits {budget} bytes (the predictor "
               "has no step time for this target: not calibrated)")
    return Choice(plan, "predictor", why + note, r["predicted_peak_bytes"], r["predicted_step_time_s"],
                  considered=rows)


# On a CPU one plan's resident peak varies from run to run: squeezenet (32x32) under microbatch/4 at batch 69 peaked
# 104.6 MB in auto's probe and 113.4 MB in a job of its own (+8.4 %; microbatch/8: 86.2 and 86.0 MB). A plan probed
# on a CPU must leave this share of the budget free, so that the job it runs is not over the budget the probe met.
CPU_PROBE_MARGIN = 0.10


def probe_limit(budget: int, device_type: str) -> int:
    """The peak a probe must stay under: the budget, less CPU_PROBE_MARGIN on a CPU (a GPU's allocator is capped)."""
    return int(budget * (1 - CPU_PROBE_MARGIN)) if device_type == "cpu" else budget


UNSURE_PROBES = 3  # plans probed after the first that fits, whose expected cost cannot be told from its
PROBE_TIME_TIE = 0.05  # probed step times within 5 % of the least: the plan first in order of expected cost wins


def choose_by_probes(plans: List[MemoryPlan], budget: int,
                     probe: Callable[[MemoryPlan], Dict[str, Any]], guide: Optional[Guide] = None) -> Choice:
    """probe(plan) -> {"peak_bytes", "step_time_s", "oom"}: real, unmeasured training steps under the plan.
    Without a guide: the first plan, in the order given (expected_cost), whose probed peak fits (probing stops
    there). With one (the predictor's traces): in its order of expected cost, skipping the plans whose traced
    tensors alone exceed the budget; after the first that fits, the next plans whose cost interval overlaps its
    own (up to UNSURE_PROBES) are probed too, and the least probed step time among those that fit wins."""
    if guide is not None and any(p not in guide.costs for p in plans):
        guide = None  # traced for other candidates (a shell whose blocks differ from the built workload's)
    order = [p for p in guide.plans if p in plans] if guide is not None else plans
    rows: List[Dict[str, Any]] = []
    fitting: List[Any] = []
    first: Optional[MemoryPlan] = None
    unsure_left = UNSURE_PROBES
    for plan in order:
        row: Dict[str, Any] = plan.to_dict()
        if guide is not None:
            row["expected_cost"] = guide.costs[plan].to_dict()
            row[guide.bound_name] = guide.tensor_bytes.get(plan)
        if first is not None:
            if guide is None or unsure_left == 0 or not plan_cost.unsure(guide.costs[first], guide.costs[plan]):
                break
            unsure_left -= 1
        bound = row.get(guide.bound_name) if guide is not None else None
        if guide is not None and bound is not None and bound > budget:
            what = "traced tensors alone" if guide.untrusted_because else "predicted peak"
            rows.append({**row, "fits": False, "skipped": f"its {what} ({bound} bytes) exceed the budget"})
            continue
        p = probe(plan)
        fits = not p["oom"] and _fits(p["peak_bytes"], budget)
        rows.append({**row, "probed_peak_bytes": p["peak_bytes"], "probed_step_time_s": p["step_time_s"],
                     "probed_steps": p.get("steps"), "oom": p["oom"], "fits": fits})
        if fits:
            fitting.append((plan, p))
            first = first or plan
    if fitting:
        plan, p = fitting[0]
        probed = sum(1 for r in rows if "probed_peak_bytes" in r)
        why = (f"first in order of expected cost whose probed peak ({p['peak_bytes']} bytes, the higher of "
               f"{p.get('steps', 1)} steps) fits {budget} bytes; {probed - len(fitting)} probed plan(s) before it "
               "did not")
        if len(fitting) > 1:
            # one probed step's time is noisy (a few %): a later plan wins only when clearly faster
            best = min(fp[1]["step_time_s"] for fp in fitting)
            plan, p = next(fp for fp in fitting if fp[1]["step_time_s"] <= best * (1 + PROBE_TIME_TIE))
            why = (f"least probed step time ({p['step_time_s']:.4g} s) of {len(fitting)} plans that fit {budget} "
                   f"bytes whose expected costs the trace cannot tell apart (first that fit: {fitting[0][0].label})")
        if guide is not None:
            why = "order: expected cost from the trace's FLOPs and ops; " + why
        return Choice(plan, "probes", why, probed_peak_bytes=p["peak_bytes"], considered=rows,
                      order="trace" if guide is not None else "fixed")
    probed_rows = [(r, plan) for r, plan in zip(rows, order) if "probed_peak_bytes" in r]
    ok = [(r, plan) for r, plan in probed_rows if not r["oom"] and r["probed_peak_bytes"] is not None]
    if ok:
        r, plan = min(ok, key=lambda rp: rp[0]["probed_peak_bytes"])
    else:
        r, plan = rows[-1], order[len(rows) - 1]
    why = f"no plan's probed peak fits {budget} bytes: the smallest probed peak ({plan.label})"
    if not probed_rows:
        why = f"no plan fits {budget} bytes: every plan's traced tensors alone exceed it ({plan.label}, the last)"
    return Choice(plan, "probes", why, probed_peak_bytes=r.get("probed_peak_bytes"), considered=rows,
                  order="trace" if guide is not None else "fixed")


def guide_from_traces(plans: List[MemoryPlan], trace: Callable[[MemoryPlan], Any], batchnorm: bool,
                      why: Optional[str]) -> Guide:
    """trace(plan) -> (TracedStep, the bound in bytes: the traced tensor peak, or a trusted predictor's peak).
    Traces `none` and each recomputation share among `plans` (a micro-batch plan runs the FLOPs of the same plan
    without micro-batches, and its ops once per micro-batch: plan_cost), and orders the plans by expected cost."""
    base = {dataclasses.replace(p, microbatch=1) for p in plans} | {NONE}
    traced = {p: trace(p) for p in sorted(base, key=lambda p: (p.segments != 0, p.share))}
    bounds = {p: int(t[1]) for p, t in traced.items()}
    costs = {p: plan_cost.plan_cost(p, traced[NONE][0], traced[dataclasses.replace(p, microbatch=1)][0])
             for p in plans}
    return Guide(plan_cost.order_by_cost(plans, costs, batchnorm), costs, bounds, why)


def job_predictor(cfg: Any, device_type: str, budget_bytes: int) -> Any:
    """A predict.Predictor for this job's own config (no Hydra compose inside a running job), on the job's device
    type and with the job's budget. Raises when the predictor is missing or this torch is too old for it."""
    from mtbench.predict import require_torch
    from mtbench.predict.predictor import Predictor

    require_torch()
    predictor = Predictor(target_name=str(cfg.target.name) if "target" in cfg else "none", device=device_type,
                          job_config=cfg)
    predictor.target = dataclasses.replace(predictor.target, memory_budget_bytes=budget_bytes)
    return predictor


def traced_plan(predictor: Any, model: str, batch: int, plan: MemoryPlan, peak: bool = False) -> Any:
    """(TracedStep, traced tensor peak, or with `peak` the predicted peak) of one step under `plan`, for
    guide_from_traces."""
    prediction = predict_plan(predictor, model, batch, plan)
    trace, _ = predictor.trace(model, batch)  # cached by predict_plan
    optimizer_ops = int(trace.op_classes.get("optimizer", {}).get("ops", 0))
    bound = prediction.peak_bytes if peak else prediction.tensors_bytes
    return plan_cost.TracedStep(prediction.flops, prediction.ops, optimizer_ops), bound


def has_step_time(predictor: Any) -> bool:
    """Whether the predictor predicts step times here: a calibration's time model, or the target's peak figures
    (a roofline)."""
    cal = getattr(predictor, "calibration", None)
    if cal is not None and (cal.time_coef is not None or cal.op_coef is not None):
        return True
    target = predictor.target
    return bool(target.peak_fp32_flops and target.dram_bandwidth_bytes_per_s)


def predict_plan(predictor: Any, model: str, batch: int, plan: MemoryPlan) -> Any:
    """The predictor's prediction of one step under `plan` (its workloads are made with the plan set)."""
    from mtbench.workload.base import default_plan

    predictor.clear_traces()  # traces are cached by (model, batch): one per plan
    with default_plan(plan):
        return predictor.predict(model, batch)


def probe_step(workload: Any, plan: MemoryPlan, device: torch.device, runtime_bytes: Optional[int],
               is_oom: Callable[[BaseException], bool], budget_bytes: Optional[int] = None) -> Dict[str, Any]:
    """Real training steps under `plan`, outside the measured steps: their peak (as the budget compares it).

    A first step can peak lower than the steps after it (the optimizer's state, e.g. SGD's momentum, is made at its
    end; the figures: docs/benchmarks.md "Figures behind design choices"), so a plan
    whose first step fits `budget_bytes` takes a second step and the higher peak of the two counts."""
    from mtbench.device import budget
    from mtbench.device.peak import PeakMemory, release_memory
    from mtbench.device.timing import timed_step

    workload.set_memory_plan(plan)
    peaks: List[Optional[int]] = []
    seconds = math.nan
    for _ in range(2):
        release_memory(device)
        peak = PeakMemory(device)
        peak.reset()
        try:
            began, ended = timed_step(device, workload.step)  # as a job times its steps
        except BaseException as exc:  # noqa: B902 - an allocator OOM is the probe's answer; anything else is raised
            if not is_oom(exc):
                raise
            release_memory(device)
            return {"peak_bytes": None, "step_time_s": None, "oom": True, "steps": len(peaks) + 1}
        seconds = ended - began
        mem = peak.read()
        # on CUDA the budget caps what the allocator reserves; on CPU the resident peak less the runtime
        peaks.append(mem.get("mem_peak_reserved_bytes") if device.type == "cuda"
                     else budget.compared_bytes(mem, runtime_bytes))
        if not _fits(peaks[-1], budget_bytes):
            break
    # a step whose peak cannot be read leaves the probe's peak unknown: it does not fit
    peak_bytes = None if any(p is None for p in peaks) else max(peaks)  # type: ignore[type-var]
    return {"peak_bytes": peak_bytes, "step_time_s": seconds, "oom": False, "steps": len(peaks)}
