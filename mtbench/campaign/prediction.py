"""The predictor's max batch for the guided search (`mtbench maxbatch --search guided`), traced in processes beside."""
from __future__ import annotations

import functools
import os
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Union

from mtbench.config_schema import last_override, sets_key

MAX_TRACERS = 2  # traces side by side: each is one busy Python thread; the search's rounds hold two batches


class Prediction(NamedTuple):
    batch: Optional[int]  # the predicted max batch; None where there is none (`why` says why)
    why: str
    # the trace's growth of training memory per sample at the answer: the smaller of its growth to the next batch
    # traced above the answer and its growth from the smallest batch traced (None: none traced on either side)
    growth_bytes: Optional[float] = None


def predicted_max_batch(model: str, target: str, overrides: List[str], anchor: int,
                        measured: Optional[Tuple[int, int]] = None) -> Prediction:
    """The predictor's max batch for `model` under the probes' overrides, with why and the trace's growth per
    sample there; batch None (and why) where it has none: the guided search then falls back to the full one.

    `measured` (batch, bytes): a probe's training memory on a CPU (what the budget is held against). Every
    predicted peak is then shifted by what it measured beyond the prediction at that batch: the memory that is not
    tensors, which the predictor can only assume, is the job's own and about constant in the batch (docs/memory.md
    has the figures).

    The traces run in processes forked here, one per usable core up to MAX_TRACERS, all forked before any of them
    traces: a trace runs autograd, after which torch refuses autograd in every process that process forks ("Unable
    to handle autograd's threading in combination with fork-based multiprocessing"), and each probe is such a fork.
    The search's rounds then trace their batches side by side (maxsearch.largest_batch with width=2: the guess and
    the batch 1 % above it in the time of one trace)."""
    from mtbench.predict.maxsearch import largest_batch
    from mtbench.predict.tracers import TraceFailed, TracerDied, Tracers

    width = max(1, min(MAX_TRACERS, len(os.sched_getaffinity(0))))
    try:
        with Tracers(functools.partial(_predictor, target, overrides), width) as tracers:
            if tracers.budget is None:
                return Prediction(None, "target none has no memory budget")
            shift: List[int] = []  # measured less predicted at the measured batch, once known
            seen: Dict[int, int] = {}  # every batch traced, its peak

            def peaks(batches: List[int]) -> List[Union[int, BaseException]]:
                if measured is None:
                    return traced(batches)
                extra = [] if shift or measured[0] in batches else [measured[0]]
                out = traced(batches + extra)
                if not shift:
                    at = out[(batches + extra).index(measured[0])]
                    if isinstance(at, BaseException):
                        raise at
                    shift.append(measured[1] - int(at))
                return [p if isinstance(p, BaseException) else int(p) + shift[0] for p in out[:len(batches)]]

            def traced(batches: List[int]) -> List[Union[int, BaseException]]:
                out = tracers.peaks(model, batches)
                seen.update((b, int(p)) for b, p in zip(batches, out) if not isinstance(p, BaseException))
                return out

            best, why, _ = largest_batch(peaks, int(tracers.budget), anchor, width=width)
    except (TracerDied, TraceFailed) as exc:  # no tracer, or the model cannot be traced: the full search needs none
        return Prediction(None, f"no prediction ({exc}); the full search runs instead")
    if shift and measured is not None:
        why += (f" (each prediction shifted by {shift[0] / 2**20:+.1f} MiB: the probe at batch {measured[0]} "
                "measured that beyond it)")
    return Prediction(best, why, _growth(seen, best))


def _growth(seen: Dict[int, int], best: int) -> Optional[float]:
    """Bytes per sample at `best` from the traced peaks: the smaller of the growth to the next batch traced above it
    and the growth from the smallest traced below it (a step in the peak between two neighbours, a buffer that
    grows in blocks, does not then count as growth per sample); None where either is missing or not positive."""
    above = [b for b in seen if b > best]
    below = [b for b in seen if b < best]
    if best not in seen or not above or not below:
        return None
    nxt, first = min(above), min(below)
    growth = min((seen[nxt] - seen[best]) / (nxt - best), (seen[best] - seen[first]) / (best - first))
    return growth if growth > 0 else None


def _predictor(target: str, overrides: List[str]) -> Any:
    """The Predictor of the probes' overrides (made in each tracer process)."""
    from mtbench.predict.predictor import Predictor

    device = last_override(overrides, "device", "auto")
    rest = [o for o in overrides if not (sets_key(o, "target") or sets_key(o, "device"))]
    return Predictor(target_name=target, device=device, overrides=tuple(rest))
