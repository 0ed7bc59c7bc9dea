"""Fit a device's time and runtime-memory model from a sweep's summaries; store and find it per target and device."""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from mtbench.errors import UsageError
from mtbench.regular_files import RefusedFile, read_regular
from mtbench.results.files import atomic_write

SCHEMA = "mtbench.calibration/1"
# Where calibrations live: $MTBENCH_CALIBRATION_DIR, else ~/.cache/mtbench/calibration/<target>-<device>.json
ENV_DIR = "MTBENCH_CALIBRATION_DIR"

# The time model: step_s = c0 + c1 * x_flops + c2 * x_bytes + c3 * ops, all c >= 0, where x_flops is FLOPs /
# the target's peak FLOP/s and x_bytes is bytes moved / its DRAM bandwidth (a roofline whose two terms are
# scaled by fitted inverse efficiencies), or the raw FLOPs and bytes where the target gives no peak figures
# (the host CPU, target=none). c0 is per-step overhead, c3 the cost of one op (dispatch, kernel launch).
TIME_FEATURES = ("overhead_s", "flops", "bytes", "ops")


def calibration_dir() -> Path:
    env = os.environ.get(ENV_DIR)
    return Path(env) if env else Path.home() / ".cache" / "mtbench" / "calibration"


def calibration_key(target: str, device_type: str) -> str:
    return f"{target}-{device_type}"


@dataclass
class Calibration:
    """What `mtbench calibrate` fitted for one target and device type."""

    key: str  # "<target>-<device type>", e.g. "none-cpu", "orin_nano-cuda"
    target: str
    device_type: str  # "cpu" | "cuda"
    device_name: str  # the CPU or GPU the sweep ran on (env.device_name)
    source: str  # the sweep folder
    runs: int  # summaries used
    created: str  # when (UTC, ISO 8601)
    time_coef: Optional[List[float]] = None  # TIME_FEATURES' coefficients; None: no time fit
    time_scaled: bool = False  # x_flops / x_bytes scaled by the target's peaks (else raw FLOPs and bytes)
    time_fit_mape_pct: Optional[float] = None  # on the runs it was fitted on
    time_stat: str = "median"  # the step-time statistic fitted: median, or min (the fastest measured step)
    # the per-op-class model (mtbench.predict.opcost.FEATURES: seconds per FLOP, per byte, per op of each class),
    # which predicts where present; time_coef stays as the whole-step fallback
    op_coef: Optional[List[float]] = None
    op_features: List[str] = field(default_factory=list)  # the names of op_coef's entries
    op_fit_mape_pct: Optional[float] = None  # step time, on the runs it was fitted on
    op_profiled_runs: int = 0  # runs whose measured per-op times (ops.csv) were fitted, beside every run's step
    # the last-level cache the traces modelled (a matrix product's re-read of what the step touched within it is not
    # counted in its bytes): predictions with this calibration trace with the same; None: made before it (none)
    cache_bytes: Optional[int] = None
    # training memory that is not tensors = non_tensor_bytes + non_tensor_per_op_bytes * ops
    #                                       + non_tensor_per_transient_byte * transient tensor bytes at the peak
    #                                       + non_tensor_per_conv_weight_byte * convolution weight bytes
    # (transient: what the step allocates and frees, i.e. the tensors less parameters, gradients, optimizer
    # state and inputs). The constant is the libraries' pages and arenas; per op, the kernels' primitives and
    # autograd's nodes; per transient byte, what the C allocator keeps of freed blocks (fragmentation).
    non_tensor_bytes: Optional[int] = None
    non_tensor_per_op_bytes: float = 0.0
    non_tensor_per_transient_byte: float = 0.0
    # + non_tensor_per_conv_weight_byte * the step's convolution weight bytes: on a CPU oneDNN keeps the weights (and
    # their gradients) reordered into its blocked layout, outside any tensor the trace sees (the runtime that
    # made xception and resnet50 miss by 19-30 % when it was not a term)
    non_tensor_per_conv_weight_byte: float = 0.0
    runtime_spread_bytes: Optional[List[int]] = None  # min and max of measured - tensors over the runs
    non_tensor_note: str = ""  # what the runtime part holds, or why it was not fitted
    schema: str = SCHEMA
    runs_used: List[str] = field(default_factory=list)  # "<model> b<batch>" of each run

    def describe(self, features: Optional[Sequence[str]] = None) -> str:
        """Where it was fitted and which model it gives; with `features` (this mtbench's per-op-class terms), a
        per-op-class fit made with other terms is said to be unused (the predictor then takes the whole-step one)."""
        if self.op_coef is None:
            model = "whole-step model"
        elif features is not None and list(self.op_features) != list(features):
            model = ("whole-step model: its per-op-class fit has other terms than this mtbench's (an older one made "
                     "it; `mtbench calibrate` on its sweep again gives them)")
        else:
            model = f"per-op-class model, per-op times of {self.op_profiled_runs}"
        return (f"calibrated on {self.runs} runs of {self.source} ({self.device_name}, {self.created[:10]}, "
                f"{self.time_stat} step time; {model})")

    def efficiencies(self) -> Dict[str, Optional[float]]:
        """The fitted fraction of peak FLOP/s and bandwidth (only where scaled by a target's peaks)."""
        if not self.time_scaled or self.time_coef is None:
            return {"flops": None, "bandwidth": None}
        c = self.time_coef
        return {"flops": 1.0 / c[1] if c[1] > 0 else None, "bandwidth": 1.0 / c[2] if c[2] > 0 else None}


def save(cal: Calibration, path: Optional[Path] = None) -> Path:
    path = Path(path) if path is not None else calibration_dir() / f"{cal.key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(asdict(cal), indent=2))
    return path


MAX_FILE_BYTES = 1 << 20  # a calibration is a few KB: a larger file is not one
# "runtime" meant two things (here: training memory that is not tensors; in summary.json's mem_runtime_bytes: memory
# held before the model was built); the calibration's keys now say theirs, and older files still read
RENAMED = {"runtime_bytes": "non_tensor_bytes", "runtime_per_op_bytes": "non_tensor_per_op_bytes",
           "runtime_per_transient_byte": "non_tensor_per_transient_byte",
           "runtime_per_conv_weight_byte": "non_tensor_per_conv_weight_byte", "runtime_note": "non_tensor_note"}


def load(key: str, path: Optional[Path] = None) -> Optional[Calibration]:
    """The stored calibration for `key`, or the file `path` the user named; None when there is none.

    A named file that is not a calibration is a UsageError (one line). A stored one that is not (a torn write, a
    hand edit, another version's schema) is left out with a one-line warning naming it, so that one bad file does
    not stop every later prediction; `mtbench calibrate` writes it again."""
    named = path is not None
    path = Path(path) if named else calibration_dir() / f"{key}.json"
    if not os.path.lexists(path):
        if named:
            raise UsageError(f"calibration={path} does not exist; allowed: a file `mtbench calibrate` wrote")
        return None
    try:
        return _read(path)
    except ValueError as exc:
        if named:
            raise UsageError(f"calibration={path} is not a calibration file ({exc}); allowed: a file "
                             "`mtbench calibrate` wrote") from None
        print(f"mtbench: warning: the stored calibration {path} is left out ({exc}); `mtbench calibrate` writes it "
              "again", file=sys.stderr)
        return None


def _read(path: Path) -> Optional[Calibration]:
    """The calibration in `path`; ValueError says why it is not one (None: another schema, not ours to read)."""
    try:
        raw = read_regular(str(path), MAX_FILE_BYTES)  # never a link or a FIFO a user could plant
    except RefusedFile as exc:
        raise ValueError(str(exc)) from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"not JSON: {type(exc).__name__}") from None
    if not isinstance(data, dict):
        raise ValueError(f"a JSON {type(data).__name__}, not an object")
    if data.get("schema") != SCHEMA:
        raise ValueError(f"schema {str(data.get('schema'))[:40]!r}, not {SCHEMA}")
    try:
        data = {RENAMED.get(k, k): v for k, v in data.items()}  # files written before the names said what they hold
        cal = Calibration(**{k: v for k, v in data.items() if k in Calibration.__dataclass_fields__})
    except TypeError as exc:  # a field missing
        raise ValueError(str(exc).replace("__init__() ", "")) from None
    problem = _field_problem(cal)
    if problem is not None:
        raise ValueError(problem)
    cal.non_tensor_note = "".join(c for c in cal.non_tensor_note if c.isprintable())  # no terminal escapes
    return cal


def _finite(n: Any, minimum: Optional[float] = None) -> bool:
    return isinstance(n, (int, float)) and not isinstance(n, bool) and math.isfinite(n) and \
        (minimum is None or n >= minimum)


def _whole(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def _field_problem(cal: Calibration) -> Optional[str]:
    """Why `cal`'s fields are not what `mtbench calibrate` writes (each of its kind and range), None where they are:
    a text or a number where a table belongs would give an empty prediction, a negative constant a negative peak."""
    texts = ("key", "target", "device_type", "device_name", "created", "source", "non_tensor_note", "schema")
    bad = [k for k in texts if not isinstance(getattr(cal, k), str)]
    if bad:
        return f"{bad[0]} must be a text"
    if cal.device_type not in ("cpu", "cuda"):
        return f"device_type {cal.device_type[:20]!r} is neither cpu nor cuda"
    if cal.time_stat not in ("median", "min"):
        return f"time_stat {str(cal.time_stat)[:20]!r} is neither median nor min"
    if not isinstance(cal.time_scaled, bool):
        return "time_scaled must be true or false"
    for k in ("runs", "op_profiled_runs"):
        if not _whole(getattr(cal, k)):
            return f"{k} must be a whole number >= 0"
    for k in ("non_tensor_bytes", "cache_bytes"):
        if getattr(cal, k) is not None and not _whole(getattr(cal, k)):
            return f"{k} must be a whole number of bytes >= 0, or null"
    for k in ("non_tensor_per_op_bytes", "non_tensor_per_transient_byte", "non_tensor_per_conv_weight_byte"):
        if not _finite(getattr(cal, k), 0.0):
            return f"{k} must be a finite number >= 0"
    for k in ("time_fit_mape_pct", "op_fit_mape_pct"):
        if getattr(cal, k) is not None and not _finite(getattr(cal, k), 0.0):
            return f"{k} must be a finite number >= 0, or null"
    if cal.time_coef is not None and (not isinstance(cal.time_coef, list) or len(cal.time_coef) != len(TIME_FEATURES)
                                      or not all(_finite(c) for c in cal.time_coef)):
        return f"time_coef must be a list of {len(TIME_FEATURES)} finite numbers, or null"
    if not isinstance(cal.op_features, list) or not all(isinstance(f, str) for f in cal.op_features):
        return "op_features must be a list of feature names"
    if cal.op_coef is not None and (not isinstance(cal.op_coef, list) or len(cal.op_coef) != len(cal.op_features)
                                    or not all(_finite(c) for c in cal.op_coef)):
        return "op_coef must be a list of finite numbers, one per op_features entry, or null"
    spread = cal.runtime_spread_bytes
    if spread is not None and (not isinstance(spread, list) or len(spread) != 2 or not all(_finite(b) for b in spread)):
        return "runtime_spread_bytes must be [min, max] bytes, or null"
    if not isinstance(cal.runs_used, list) or not all(isinstance(r, str) for r in cal.runs_used):
        return "runs_used must be a list of texts"
    return None


def time_features(flops: float, bytes_moved: float, ops: float, peak_flops: Optional[float],
                  bandwidth: Optional[float]) -> np.ndarray:
    scaled = peak_flops is not None and bandwidth is not None
    return np.array([1.0, flops / peak_flops if scaled else flops, bytes_moved / bandwidth if scaled else bytes_moved,
                     float(ops)])


def fit_nonnegative(x: np.ndarray, y: np.ndarray, scale: Optional[np.ndarray] = None) -> np.ndarray:
    """Least squares of y ~ x @ c with c >= 0, relative to `scale` (default y: each run counts by its
    percentage error).

    An active set: fit, drop the most negative coefficient, refit, until none is negative (a handful of
    features: at most that many rounds).
    """
    w = 1.0 / np.maximum(y if scale is None else scale, 1e-12)
    xs = x / np.maximum(np.abs(x).max(axis=0), 1e-300)  # columns of comparable size
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(xs[:, active] * w[:, None], y * w, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return coef / np.maximum(np.abs(x).max(axis=0), 1e-300)


def runtime_features(ops: float, transient_bytes: float, conv_weight_bytes: float = 0.0) -> np.ndarray:
    return np.array([1.0, float(ops), float(transient_bytes), float(conv_weight_bytes)])


def mape_pct(pred: Sequence[float], meas: Sequence[float]) -> float:
    p, m = np.asarray(pred, float), np.asarray(meas, float)
    return float(np.mean(np.abs(p - m) / m) * 100.0)
