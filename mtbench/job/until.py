"""A run to a target (until.accuracy / until.loss): the checks between steps, the stop, the figures and evals.csv.

Each check runs after a step's closing synchronization and before the next step's start, so it lies outside every
step's window: the step times, and the energy integrated over the steps' windows, never include it. Its own window
(start and end on the sampler's monotonic clock) is kept, and evals.csv gives its time and energy beside the
training's (docs/measurement.md "Runs to a target").
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from mtbench.config import setting
from mtbench.device.select import sync
from mtbench.errors import UsageError
from mtbench.results.files import atomic_write, csv_text
from mtbench.sampling.windows import Rails

CURVE_FILE = "evals.csv"  # one row per check, beside steps.csv


@dataclass(frozen=True)
class Target:
    metric: str  # "accuracy": held-out top-1, 0-1, reached at >=; "loss": mean training loss, reached at <=
    value: float
    eval_every: int  # training steps between checks (warm-up steps count: they train too)

    def met(self, measured: float) -> bool:
        if not math.isfinite(measured):  # a run that diverged meets no target
            return False
        return measured >= self.value if self.metric == "accuracy" else measured <= self.value

    def describe(self) -> str:
        return f"{self.metric} {'>=' if self.metric == 'accuracy' else '<='} {self.value:g}"


@dataclass(frozen=True)
class Check:
    index: int  # the step after which it ran (warm-up steps counted, from 0)
    start_s: float  # monotonic seconds, the sampler's clock
    end_s: float
    value: float  # the accuracy on the held-out batches, or the mean training loss since the last check


def target_of(cfg: Any) -> Optional[Target]:
    """until.* of a composed config: the target, or None for an ordinary run; a UsageError for a bad value."""
    accuracy, loss = setting(cfg, "until.accuracy"), setting(cfg, "until.loss")
    every = setting(cfg, "until.eval_every", 10)
    if accuracy is not None and loss is not None:
        raise UsageError(f"until.accuracy={accuracy:g} and until.loss={loss:g} are both set; allowed: one of them")
    if accuracy is None and loss is None:
        return None
    if setting(cfg, "profile", False):
        raise UsageError("until.* with profile=true: the checks would run inside the profiled steps' profile; "
                         "allowed: profile=false for a run to a target")
    return Target("accuracy", accuracy, every) if accuracy is not None else Target("loss", loss, every)


class TargetRun:
    """The checks of one job against its target; a job without one (until.* null) checks nothing."""

    def __init__(self, cfg: Any, batch_size: int) -> None:
        self.target = target_of(cfg)
        self.model = str(cfg["model"]["name"])
        self.batch_size = batch_size
        self.held_out: List[Any] = []  # until.accuracy: the held-out batches, made before timing
        self.checks: List[Check] = []
        self.reached_at: Optional[int] = None  # the step index after whose check the target was met
        self._losses: List[float] = []  # until.loss: the headline losses since the last check

    def prepare(self, data: Any, workload: Any) -> None:
        """Before timing: the held-out batches of until.accuracy, or one line why this model or data has none."""
        if self.target is None or self.target.metric != "accuracy":
            return
        if not workload.EVALUATES_ACCURACY:
            raise UsageError(f"until.accuracy: model={self.model} measures no accuracy (not a classifier); "
                             "allowed: until.loss=L, or until.accuracy with a classification model")
        self.held_out = workload.held_out_batches(data, self.batch_size)

    def reached(self, job: Any, index: int, last: bool) -> bool:
        """After step `index` (`last`: no step follows): check the target when due, outside every step's window;
        True when it is met and the run stops."""
        if self.target is None:
            return False
        self._losses += list(job.losses.get(index, {}).values())[:1]
        if (index + 1) % self.target.eval_every and not last:
            return False
        start = time.monotonic()
        if self.target.metric == "accuracy":
            value = job.workload.accuracy(self.held_out)
            sync(job.device)  # a CPU-GPU sync point: the check's kernels end inside its own window
        else:
            value = sum(self._losses) / len(self._losses) if self._losses else math.nan
        self._losses = []
        self.checks.append(Check(index, start, time.monotonic(), float(value)))
        if self.target.met(value):
            self.reached_at = index
        return self.reached_at is not None

    def figures(self, samples: Any, sampler: Any, interval_ms: float) -> Optional[Dict[str, Any]]:
        """summary.json's keys of a run to a target (results/summary.py TARGET_KEYS), with `unavailable` reasons;
        None for an ordinary run."""
        if self.target is None:
            return None
        marks = list(sampler.marks) if sampler is not None else []
        out: Dict[str, Any] = {
            "until": {"metric": self.target.metric, "value": self.target.value,
                      "eval_every": self.target.eval_every},
            "target_reached": self.reached_at is not None,
            "checks": {"count": len(self.checks), "time_s": sum(c.end_s - c.start_s for c in self.checks),
                       "last_value": self.checks[-1].value if self.checks else None,
                       "best_value": _best(self.target, [c.value for c in self.checks])},
        }
        keys = ("steps_to_target", "samples_to_target", "time_to_target_s", "wall_to_target_s", "energy_to_target_j")
        if self.reached_at is None:
            best = out["checks"]["best_value"]
            why = (f"the target ({self.target.describe()}) was not met in {len(marks)} steps"
                   + (f" (best {best:.4g} in {len(self.checks)} checks)" if best is not None else " (no check ran)"))
            out.update({k: None for k in keys})
            out["unavailable"] = {k: why for k in keys}
            return out
        steps = [m for m in marks if m.index <= self.reached_at]
        check = next(c for c in self.checks if c.index == self.reached_at)
        energy, why = _energy_j(samples, interval_ms, steps)
        out.update({
            "steps_to_target": self.reached_at + 1,
            "samples_to_target": (self.reached_at + 1) * self.batch_size,
            "time_to_target_s": sum(m.end_s - m.start_s for m in steps),  # the training steps' windows only
            # from the first step's start to the end of the check that met the target: checks and gaps included
            "wall_to_target_s": check.end_s - steps[0].start_s if steps else None,
            "energy_to_target_j": energy,
            "unavailable": {"energy_to_target_j": why} if why else {},
        })
        return out

    def write_curve(self, out_dir: Path, samples: Any, sampler: Any, interval_ms: float) -> None:
        """evals.csv: one row per check: the training so far (steps, samples, step time, energy) and the check's
        own window, time and energy, never part of the training's."""
        if self.target is None or not self.checks:
            return
        marks = list(sampler.marks) if sampler is not None else []
        rails = Rails(samples, interval_ms) if samples is not None else None
        rows = []
        for c in self.checks:
            steps = [m for m in marks if m.index <= c.index]
            energy = _energy_j(samples, interval_ms, steps, rails)[0]
            check_energy = _energy_j(samples, interval_ms, [c], rails)[0]
            rows.append([c.index, c.index + 1, (c.index + 1) * self.batch_size,
                         _f(sum(m.end_s - m.start_s for m in steps)), _f(c.end_s - marks[0].start_s if marks else None),
                         _f(energy), _f(c.start_s), _f(c.end_s), _f(c.end_s - c.start_s), _f(check_energy),
                         _f(c.value), int(self.target.met(c.value))])
        header = ["index", "steps", "samples", "train_time_s", "wall_s", "train_energy_j", "check_start_s",
                  "check_end_s", "check_time_s", "check_energy_j", self.target.metric, "met"]
        atomic_write(Path(out_dir) / CURVE_FILE, csv_text(header, rows))


def _energy_j(samples: Any, interval_ms: float, windows: Sequence[Any], rails: Optional[Rails] = None):
    """(J over the windows on the rails whose sum is the total, the reason where None)."""
    if samples is None:
        return None, "no samples (the sampler failed or never started)"
    rails = rails or Rails(samples, interval_ms)
    if not rails.total:
        return None, ("no power sensor sampled the job's total (sampler.sensors has no power rail here)"
                      if not rails.names else rails.total_note())
    spans = [(w.start_s, w.end_s) for w in windows]
    if not spans:
        return None, "no step ran"
    parts = [rails.spans_j(r, spans)[0] for r in rails.total]
    if any(p is None for p in parts):
        return None, "a power rail gave no energy over the steps' windows (steps.csv's energy_j_null_reason says why)"
    return float(sum(parts)), None


def _best(target: Target, values: List[float]) -> Optional[float]:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return None
    return max(finite) if target.metric == "accuracy" else min(finite)


def _f(value: Optional[float]) -> Optional[str]:
    return None if value is None else f"{value:.6f}"
