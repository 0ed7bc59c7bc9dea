"""A job's memory plan: set before the first step, re-chosen between steps when the watched budget file changes."""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
from typing import Any, Callable, Dict, List, Optional

import torch

from mtbench.device.budget import (apply_budget, budget_failure, compared_bytes, job_budget, release_budget,
                                   target_from_cfg)
from mtbench.device import hugepages, peak
from mtbench.device.select import sync
from mtbench.device.targets import Target
from mtbench.config import setting
from mtbench.errors import UsageError
from mtbench.planning import choose as plan_select
from mtbench.planning.malloc import choose_cpu_malloc
from mtbench.planning.budget_file import BudgetFile, read_budget_file  # noqa: F401 - tests import it here
from mtbench.workload.plans import NONE, MemoryPlan, PlanSettings, settings_from_cfg
from mtbench.workload.torch_internals import on_device

log = logging.getLogger("mtbench")

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


class Planner:
    """memory.plan of one job. `before_build` before the model exists, `start` once the workload is set up,
    `before_step` before each step (outside its timed window), `summary` for summary.json."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.settings: PlanSettings = settings_from_cfg(cfg)
        self.select = setting(cfg, "memory.select", "auto")
        self.budget_bytes, self.budget_source = job_budget(cfg)  # the one budget of the job
        self.watch = BudgetFile(self.settings.budget_file) if self.settings.budget_file else None
        if self.settings.plan == "auto" and self.budget_bytes is None and self.watch is None:
            raise UsageError("memory.plan=auto needs a budget; allowed: target=<board> (e.g. target=nano), "
                             "memory.budget_gb=<GiB> or memory.budget_file=<path>")
        # the CUDA caching allocator's settings as they took effect (CUDA jobs only; None on CPU)
        self.allocator: Optional[Dict[str, Any]] = None
        device = cfg.get("device") if hasattr(cfg, "get") else None
        if self.settings.expandable_segments and str(device.get("name", "auto") if device else "auto") != "cpu":
            self._set_allocator_conf()
        # an untimed step is owed before the next measured one: the plan changed after warm-up (auto's probes, a
        # re-plan), and new shapes make cuDNN's autotuner try its algorithms inside the next step
        self.settle_pending = False
        self.settle_steps: List[int] = []  # the steps an untimed step ran before
        self.plan: MemoryPlan = NONE
        self.choice: Optional[plan_select.Choice] = None
        self.guide: Optional[plan_select.Guide] = None  # the predictor's order for the probes (its peak untrusted)
        self.labels: Dict[int, str] = {}  # step index -> the plan it ran under
        self.replans: List[Dict[str, Any]] = []
        self.runtime_bytes: Optional[int] = None
        self.workload: Any = None
        self.device: Optional[torch.device] = None
        self.is_oom: Callable[[BaseException], bool] = lambda exc: False

        # the board whose memory budget the job must fit (target=none: no budget); memory.budget_gb replaces the
        # target's budget, and the job is held to it as to a board's
        self.target: Target = target_from_cfg(cfg)
        if self.settings.budget_bytes is not None:
            self.target = dataclasses.replace(self.target, memory_budget_bytes=self.settings.budget_bytes)
        # how the budget is held (summary.json): set by hold_budget before the model is built
        self.held: Dict[str, Any] = {"budget_bytes": self.target.memory_budget_bytes, "budget_enforced_by": None}

    def hold_budget(self) -> None:
        """Before the model is built: read what the runtime holds (CPU), cap the CUDA allocator at the budget, or
        on CPU set glibc's malloc for the peak check (memory.cpu_malloc)."""
        assert self.device is not None, "before_build first"
        # what the runtime owns before the model exists, in the measure the CPU budget compares (device/budget.py)
        self.runtime_bytes = (peak.budget_runtime_bytes()
                              if self.device.type == "cpu" or peak.integrated(self.device) else None)
        cpu_malloc = self.settings.cpu_malloc
        self.held = apply_budget(self.target, self.device, cpu_malloc)
        if self.runtime_bytes is not None:  # taken off the training (board) peak a budget compares; unbudgeted too,
            self.held["budget_runtime_bytes"] = self.runtime_bytes  # for a calibration's fit (predict/fit.py)
        if self.held["budget_bytes"] is None and self.device.type == "cpu":
            # no peak check: memory.cpu_malloc as asked (auto: live where memory.budget_file alone steers the plan,
            # so that its probes measure as a budgeted job's; else glibc's own settings)
            chosen = peak.set_cpu_malloc(cpu_malloc, budgeted=self.budget_bytes is not None)
            if chosen is not None:
                self.held["cpu_malloc"] = chosen

    def budget_failure(self, mem: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """After the measured steps (CPU peak check): failure {"kind": "budget", ...} when over the budget."""
        return budget_failure(self.target, mem, self.held["budget_enforced_by"], self.runtime_bytes)

    def release_budget(self) -> None:
        if self.device is not None:
            release_budget(self.device)

    # -- before the model exists ------------------------------------------------------------------------------
    def _set_allocator_conf(self) -> None:
        """expandable_segments must be set before the CUDA caching allocator makes its first segment. Torch < 2.9
        reads the environment when CUDA starts in this process (the job's child, before resolve_device); torch >=
        2.9 parsed it when the library loaded in the parent, so there only the allocator-settings call of
        `before_build` takes effect."""
        conf = os.environ.get(ALLOC_CONF, "")
        if "expandable_segments" not in conf:
            os.environ[ALLOC_CONF] = ",".join(p for p in (conf, "expandable_segments:True") if p)

    def _apply_allocator_settings(self, device: torch.device) -> Dict[str, Any]:
        """The allocator setting on a CUDA device, as set (summary.json; what took effect: summary())."""
        requested = self.settings.expandable_segments
        if requested and getattr(torch.cuda.get_device_properties(device), "is_integrated", False):
            # a Jetson: the driver's virtual-memory calls behind expandable segments fail (every job would be "oom")
            raise UsageError("memory.expandable_segments=true is not possible on an integrated GPU (a Jetson: "
                             "the driver's virtual-memory calls fail there); allowed: memory.expandable_segments=false")
        record: Dict[str, Any] = {"requested": requested, "set_through": ALLOC_CONF if requested else None}
        setter = (getattr(torch._C, "_accelerator_setAllocatorSettings", None)  # torch >= 2.9
                  or getattr(torch.cuda.memory, "_set_allocator_settings", None))  # torch 2.1-2.8
        if requested and setter is not None:  # applies to segments made from now on
            setter("expandable_segments:True")
            record["set_through"] = f"{ALLOC_CONF} and the allocator-settings call"
        # torch >= 2.9 gives back the settings string as it was last set: what was asked, not a confirmation that
        # the allocator applies it (that is the segments' count, summary())
        getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
        settings = str(getter()) if getter is not None else None
        record.update(settings_set=settings, expandable_segments_set=None if settings is None else
                      "expandable_segments:true" in settings.replace(" ", "").lower(),
                      settings_note=("the settings string as last set, given back as it was given: not what the "
                                     "allocator applied (its segments say that)") if settings is not None else
                      (f"torch {torch.__version__} does not give its allocator settings back (torch >= 2.9 gives "
                       "the string set); the segments' count says what took effect"))
        return record

    def _warn_untimed_autotune(self, device: torch.device) -> None:
        if device.type == "cuda" and int(self.cfg.get("warmup", 1)) == 0 and self.cfg.get("cudnn_benchmark", True):
            print("mtbench: warning: warmup=0 with cudnn_benchmark=true: cuDNN tries its algorithms inside the "
                  "first measured steps; use warmup>=1 or cudnn_benchmark=false", file=sys.stderr, flush=True)

    def before_build(self, device: torch.device) -> None:
        """Before the model exists and before the runtime's memory is read: the allocator setting, the watched
        budget, and (auto) the predictor's choice: its imports and caches stay in the process, so they must count
        as runtime, not as the job's training memory."""
        self.device = device
        budgeted = self.target.memory_budget_bytes is not None or self.budget_bytes is not None
        if device.type == "cpu" and peak.resolved_cpu_malloc(self.settings.cpu_malloc, budgeted) == "live":
            hugepages.ask_torch()  # read at torch's first CPU tensor, and the trace below makes some
        if device.type == "cuda":
            self.allocator = self._apply_allocator_settings(device)
            self._warn_untimed_autotune(device)
        if self.watch is not None and self.watch.changed():
            self.budget_bytes, self.budget_source = self._read_watched(), f"budget_file {self.watch.path}"
        if self._chooses() and self.select != "probes" and self.budget_bytes is not None:
            if not hasattr(torch.device("meta"), "__enter__"):  # torch < 2.0 (JetPack 4's 1.13): no device context
                self.choice = plan_select.Choice(NONE, "probes-needed", f"the predictor needs torch >= 2.5; this is "
                                                                        f"torch {torch.__version__}")
                return
            from mtbench.config import instantiate

            with on_device("meta"):  # what the workload can run, without allocating it
                shell = instantiate(self.cfg.model.workload, "model.workload")
            self.choice = self._choose(shell, probe=False)

    def _chooses(self) -> bool:
        """Whether the plan is chosen under the budget: auto, or recompute with memory.recompute_share=auto."""
        return self.settings.plan == "auto" or (self.settings.plan == "recompute" and
                                                 self.settings.recompute_share is None)

    def _read_watched(self) -> Optional[int]:
        assert self.watch is not None
        try:
            return read_budget_file(self.watch.path) or self.budget_bytes
        except (ValueError, OSError) as exc:
            log.warning("memory.budget_file: %s; the budget stays %s bytes", exc, self.budget_bytes)
            return self.budget_bytes

    # -- once the workload is set up --------------------------------------------------------------------------
    def start(self, workload: Any, is_oom: Callable[[BaseException], bool]) -> None:
        """Once the workload is set up: the plan (auto: the predictor's choice, or probes of real steps)."""
        self.workload, self.is_oom = workload, is_oom
        s = self.settings
        if s.plan == "none":
            plan, self.choice = NONE, plan_select.Choice(NONE, "fixed", "memory.plan=none")
        elif s.plan == "recompute" and (s.recompute_share is not None or self.budget_bytes is None):
            plan = MemoryPlan(segments=s.recompute, share=s.recompute_share or 100)
            self.choice = plan_select.Choice(plan, "fixed", "memory.plan=recompute" + (
                f", memory.recompute_share={s.recompute_share}" if s.recompute_share else ""))
        elif s.plan == "microbatch":
            plan = MemoryPlan(microbatch=s.microbatch)
            self.choice = plan_select.Choice(plan, "fixed", f"memory.plan=microbatch, memory.microbatch={s.microbatch}")
        else:
            if self.choice is None or self.choice.method == "probes-needed":
                self.choice = self._choose(workload, probe=True, why=self.choice.chosen_because or None
                                           if self.choice else None, guide=self.guide)
            self.choice = self._confirmed(workload, self.choice)
            plan = self.choice.plan
            self._choose_cpu_malloc(workload, plan)
        workload.set_memory_plan(plan)  # a plan the workload cannot run: UsageError naming what it can
        self.plan = plan
        # the probes ran other plans' shapes last: the chosen one's settles before a measured step
        self.settle_pending = bool(self.choice and self.choice.method == "probes")

    def _confirmed(self, workload: Any, choice: plan_select.Choice) -> plan_select.Choice:
        """A plan chosen from the predictor runs one probe (two steps: the higher peak counts) before it is used: the
        prediction can be low (a workspace, an allocator's rounding), and a job must never train over its budget.
        A plan whose probe does not fit is replaced by the probes' choice."""
        if choice.method != "predictor" or self.budget_bytes is None:
            return choice
        assert self.device is not None
        limit = plan_select.probe_limit(self.budget_bytes, self.device.type)
        probe = plan_select.probe_step(workload, choice.plan, self.device, self.runtime_bytes, self.is_oom, limit)
        choice.probed_peak_bytes = probe["peak_bytes"]
        if not probe["oom"] and probe["peak_bytes"] is not None and probe["peak_bytes"] <= limit:
            choice.chosen_because += f"; confirmed by a probe step: peak {probe['peak_bytes']} bytes"
            return choice
        measured = "ran out of memory" if probe["oom"] else f"peaked at {probe['peak_bytes']} bytes"
        why = (f"the predicted plan {choice.plan.label} {measured} in its probe step, over {limit} bytes (the "
               f"budget {self.budget_bytes}{' less the CPU margin' if limit < self.budget_bytes else ''})")
        log.info("memory.plan=auto: %s; choosing by probes", why)
        self.settle_pending = True
        return self._choose(workload, probe=True, why=why)

    def _choose_cpu_malloc(self, workload: Any, plan: MemoryPlan) -> None:
        """memory.cpu_malloc=auto in a CPU job whose plan was chosen under a budget: `cached` where the budget has
        room for the heap it keeps, else `live` (planning/malloc.py); only once the chosen plan's probe fits."""
        held = self.held.get("cpu_malloc") or {}
        budgets = [b for b in (self.budget_bytes, self.target.memory_budget_bytes) if b is not None]
        probed = self.choice.probed_peak_bytes if self.choice is not None else None
        if (self.device is None or self.device.type != "cpu" or self.settings.cpu_malloc != "auto" or not budgets
                or held.get("setting") != "live" or probed is None or probed > min(budgets)):
            return
        self.held["cpu_malloc"] = choose_cpu_malloc(workload, plan, self.device, self.runtime_bytes, self.is_oom,
                                                    min(budgets), live_peak_bytes=probed)

    def over_budget_bytes(self, mem: Dict[str, Any]) -> Optional[int]:
        """How far the measured peak went over the budget (as the budget compares it: CUDA reserved, CPU resident
        less the runtime), or None where it did not or there is no budget."""
        if self.budget_bytes is None or self.device is None:
            return None
        peak = (mem.get("mem_peak_reserved_bytes") if self.device.type == "cuda"
                else compared_bytes(mem, self.runtime_bytes))
        return int(peak) - self.budget_bytes if peak is not None and peak > self.budget_bytes else None

    def _choose(self, workload: Any, probe: bool = True, why: Optional[str] = None,
                guide: Optional[plan_select.Guide] = None) -> plan_select.Choice:
        """memory.plan=auto under the current budget (or none when there is no budget yet): the predictor where its
        peak is trusted, else probes of real steps on `workload`, in the order of expected cost its traces give
        (`guide`), or in a fixed order where it cannot be used (probe=False: say that probes are needed)."""
        assert self.device is not None
        if self.budget_bytes is None:
            return plan_select.Choice(NONE, "fixed", "memory.plan=auto without a budget yet: none")
        batch = int(self.cfg.batch)
        try:
            nets = workload.modules()
        except AttributeError:  # a workload that builds its networks in setup (a shell on meta has none)
            nets = []
        batchnorm = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for net in nets for m in net.modules())
        if self.settings.plan == "recompute":  # recomputation alone: the least share of the activations that fits
            plans = plan_select.recompute_candidates(self.settings.recompute)
        else:
            plans = plan_select.candidates(bool(workload.blocks()), bool(workload.MICROBATCH), batch,
                                           self.settings.recompute, batchnorm)
        reason = why
        if self.select in ("auto", "predictor") and why is None and guide is None:
            try:
                predictor = plan_select.job_predictor(self.cfg, self.device.type, self.budget_bytes)
                model = str(self.cfg.model.name)
                untrusted = None if self.select == "predictor" else plan_select.peak_untrusted(
                    self.device.type, calibrated_non_tensor(predictor), plans)
                if untrusted is None and (self.select == "predictor" or plan_select.has_step_time(predictor)):
                    choice = plan_select.choose_by_prediction(
                        plans, self.budget_bytes, lambda p: plan_select.predict_plan(predictor, model, batch, p),
                        batchnorm)
                    choice.predictor_peak_trusted = True
                    return choice
                # no trusted peak, or no step time to compare plans by: probes, in the order the traces give
                guide = plan_select.guide_from_traces(plans, lambda p: plan_select.traced_plan(
                    predictor, model, batch, p, peak=untrusted is None), batchnorm, untrusted)
            except Exception as exc:  # no predictor here (torch < 2.5), or it cannot trace this step: probe
                if self.select == "predictor" and isinstance(exc, UsageError):
                    raise
                reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                log.info("memory.plan=auto: the predictor failed (%s); choosing by probes", reason)
        if not probe:
            self.guide = guide
            return plan_select.Choice(NONE, "probes-needed", reason or "", predictor_peak_trusted=(
                guide.untrusted_because is None if guide else None),
                untrusted_because=guide.untrusted_because if guide else None)
        limit = plan_select.probe_limit(self.budget_bytes, self.device.type)
        choice = plan_select.choose_by_probes(plans, limit, lambda p: plan_select.probe_step(
            workload, p, self.device, self.runtime_bytes, self.is_oom, limit), guide)
        if limit < self.budget_bytes:
            choice.chosen_because += (f" ({limit} bytes: the budget less {plan_select.CPU_PROBE_MARGIN:.0%}, as a "
                                      "CPU's resident peak varies between runs)")
        if guide is not None:
            choice.predictor_peak_trusted = guide.untrusted_because is None
            choice.untrusted_because = guide.untrusted_because
            choice.chosen_because += (f" (the predictor's peak is not trusted here: {guide.untrusted_because})"
                                      if guide.untrusted_because else " (the predictor has no step time here: its "
                                      "traces order the plans; a plan whose predicted peak exceeds the budget is not "
                                      "probed)")
        elif reason:
            choice.chosen_because += f" (the predictor could not be used: {reason})"
        return choice

    # -- between steps ----------------------------------------------------------------------------------------
    def before_step(self, index: int) -> None:
        if self.watch is not None and self.workload is not None and self.watch.changed():
            budget = self._read_watched()
            if budget != self.budget_bytes:
                self._replan(index, budget)
        self._settle(index)
        self.labels[index] = self.plan.label

    def _settle(self, index: int) -> None:
        """After a plan change, one untimed step before the next measured one (a warm-up step settles by itself):
        cuDNN's autotuner and the allocator meet the new shapes there, not inside a measured step."""
        if not self.settle_pending or self.workload is None:
            return
        self.settle_pending = False
        if index < int(self.cfg.get("warmup", 0)):
            return
        assert self.device is not None
        self.workload.step()
        sync(self.device)
        self.settle_steps.append(index)

    def _replan(self, index: int, budget: Optional[int]) -> None:
        before = self.plan
        if (self.held.get("cpu_malloc") or {}).get("setting") == "cached" and self.settings.cpu_malloc == "auto":
            # the re-plan's probes measure what the job holds: live again (cached was chosen for the old budget)
            self.held["cpu_malloc"] = {**(peak.set_cpu_malloc("live", budgeted=True) or {}),
                                       "chosen_because": f"a new budget before step {index}: live for the re-plan"}
            peak.release_memory(self.device or torch.device("cpu"))
        self.budget_bytes, self.budget_source = budget, f"budget_file {self.watch.path if self.watch else ''}"
        if self.device is not None and self.device.type == "cuda" and budget is not None:
            torch.cuda.empty_cache()  # segments cached under the old budget go back before the cap changes
            apply_budget(dataclasses.replace(Target.none(), name="budget_file", memory_budget_bytes=budget),
                         self.device)
        if self._chooses():
            self.choice = self._choose(self.workload)
            self.plan = self.choice.plan
            self.workload.set_memory_plan(self.plan)
        self.settle_pending = True  # a new plan, or the old one under a new cap: new shapes or new segments
        self.replans.append({"before_step": index, "budget_bytes": budget, "from": before.label,
                             "to": self.plan.label,
                             "chosen_because": self.choice.chosen_because if self.choice else None})
        log.info("memory budget now %s bytes: step %d runs under %s (was %s)", budget, index, self.plan.label,
                 before.label)

    # -- results ----------------------------------------------------------------------------------------------
    def summary(self, mem: Dict[str, Any]) -> Dict[str, Any]:
        choice = self.choice
        runs = self.workload.runs_used(self.plan) if self.plan.segments and self.workload is not None else None
        out: Dict[str, Any] = {
            **self.plan.to_dict(),
            "segments_used": len(runs) if runs else (0 if not self.plan.segments else None),
            "setting": self.settings.plan,
            "method": choice.method if choice else None,
            "chosen_because": choice.chosen_because if choice else None,
            "predicted_peak_bytes": choice.predicted_peak_bytes if choice else None,
            "predicted_step_time_s": choice.predicted_step_time_s if choice else None,
            "probed_peak_bytes": choice.probed_peak_bytes if choice else None,
            "measured_peak_bytes": mem.get("mem_peak_bytes"),
            "budget_bytes": self.budget_bytes,
            "budget_source": self.budget_source,
            "over_budget_bytes": self.over_budget_bytes(mem),
            "predictor_peak_trusted": choice.predictor_peak_trusted if choice else None,
            "predictor_untrusted_because": choice.untrusted_because if choice else None,
            "order": choice.order if choice else None,
            "considered": choice.considered if choice else [],
            "replans": self.replans,
            "cpu_malloc": self.held.get("cpu_malloc"),
            "untimed_steps_before": self.settle_steps,
        }
        if self.allocator is not None:  # CUDA jobs only: a CPU job has no caching allocator to describe
            reserved, allocated = mem.get("mem_peak_reserved_bytes"), mem.get("mem_peak_bytes")
            segments = expandable_segment_count()
            out["allocator"] = {**self.allocator, "segments": segments}
            # what took effect: the allocator's own segments; without any, not known (the settings given back are
            # only what was set)
            out["expandable_segments"] = segments["expandable"] > 0 if segments and segments["total"] else None
            out["fragmentation_bytes"] = (int(reserved) - int(allocated)
                                          if reserved is not None and allocated is not None else None)
        return out


def calibrated_non_tensor(predictor: Any) -> bool:
    """Whether the predictor's memory that is not tensors comes from a calibration of this device (else assumed)."""
    cal = getattr(predictor, "calibration", None)
    return cal is not None and getattr(cal, "non_tensor_bytes", None) is not None


def expandable_segment_count() -> Optional[Dict[str, int]]:
    """The CUDA caching allocator's segments now, and how many of them are expandable (its snapshot; torch >= 2.1
    marks each segment `is_expandable`); None where the snapshot cannot say."""
    try:
        segments = torch.cuda.memory_snapshot()
    except (RuntimeError, AttributeError):
        return None
    if segments and "is_expandable" not in segments[0]:
        return None
    return {"total": len(segments), "expandable": sum(1 for s in segments if s.get("is_expandable"))}
