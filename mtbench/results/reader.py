"""The one reader of summary.json: a typed error for any file that is not a summary, and a light check of the
value types that the readers of a summary rely on (docs/results.md)."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

from mtbench.errors import UsageError
from mtbench.regular_files import RefusedFile, open_regular

SCHEMA_PREFIX = "mtbench.summary/"
MAX_SUMMARY_BYTES = 64 * 2**20  # a real summary is a few tens of KiB; a profile's, a few hundred
MAX_DEPTH = 64  # a real summary nests about 8 levels (its config); deeper than this is not one
MISSING = "no such file"


class UnreadableSummary(UsageError):
    """A summary.json that cannot be read as one: `path` and `reason` (e.g. "not JSON: ...")."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{path}: not a readable summary.json ({reason})")

    @property
    def missing(self) -> bool:
        return self.reason == MISSING


def read_summary(out_dir: Path, require_schema: bool = True) -> Dict[str, Any]:
    """The summary.json in the job folder `out_dir` (UnreadableSummary if it is not one)."""
    return read_summary_file(Path(out_dir) / "summary.json", require_schema)


def read_summary_file(path: Path, require_schema: bool = True) -> Dict[str, Any]:
    """The summary at `path`: a JSON object whose schema is mtbench.summary/N. Raises UnreadableSummary, and
    nothing else, for a missing file, a link, a FIFO or other non-regular file (never opened for reading: it
    could block), one over MAX_SUMMARY_BYTES, bytes that are not UTF-8, text that is not JSON, JSON that is not
    an object or nests deeper than MAX_DEPTH, and another schema (`require_schema=False`: or none)."""
    path = Path(path)
    text = _read_text(path)
    try:
        value = json.loads(text)
    except RecursionError:
        raise UnreadableSummary(path, f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, or an integer of more digits than Python converts
        raise UnreadableSummary(path, f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UnreadableSummary(path, f"JSON {_kind(value)}, not an object")
    if _depth(value) > MAX_DEPTH:
        raise UnreadableSummary(path, f"JSON nested deeper than {MAX_DEPTH} levels")
    schema = value.get("schema")
    wrong = not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX)
    if wrong and (require_schema or "schema" in value):
        raise UnreadableSummary(path, f"schema is {schema!r}, not {SCHEMA_PREFIX}N")
    return value


def _read_text(path: Path) -> str:
    try:
        f = open_regular(str(path))  # never a link or a FIFO: a planted name neither redirects nor blocks the read
    except FileNotFoundError:
        raise UnreadableSummary(path, MISSING) from None
    except RefusedFile as exc:
        reason = ("a symbolic link (not followed)" if os.path.islink(path) else
                  "not a regular file" if "not a regular file" in str(exc) else str(exc))
        raise UnreadableSummary(path, reason) from None
    try:
        with f:
            data = f.read(MAX_SUMMARY_BYTES + 1)
    except OSError as exc:
        raise UnreadableSummary(path, exc.strerror or str(exc)) from None
    if len(data) > MAX_SUMMARY_BYTES:
        raise UnreadableSummary(path, f"over the limit of {MAX_SUMMARY_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableSummary(path, f"not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array",
            dict: "an object"}.get(type(value), type(value).__name__)


def _depth(value: Any) -> int:
    """How deep arrays and objects nest (iterative: the depth is what is being checked)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if d <= MAX_DEPTH:
                todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


# ---------------------------------------------------------------------------------------------------------
# The light check: the type each field must have where the readers (console, sweep table, resume, report,
# calibration, maxbatch) use it. A field of another type is unreadable: `checked` nulls it and says why.

Check = Callable[[Any], bool]


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _opt(check: Check) -> Check:
    return lambda v: v is None or check(v)


def _obj(**fields: Check) -> Check:
    """An object whose named fields (where present) pass their checks; other fields are not looked at."""
    return lambda v: isinstance(v, dict) and all(k not in v or c(v[k]) for k, c in fields.items())


def _map(check: Check) -> Check:
    return lambda v: isinstance(v, dict) and all(check(x) for x in v.values())


def _list(check: Check) -> Check:
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


_str = lambda v: isinstance(v, str)  # noqa: E731
_bool = lambda v: isinstance(v, bool)  # noqa: E731
_num, _int = _opt(_number), _opt(_integer)
_STATS = _obj(median=_num, mean=_num, min=_num, max=_num, p90=_num)

FIELD_TYPES: Dict[str, Tuple[Check, str]] = {
    "model": (_opt(_str), "a string or null"),
    "batch_size": (_int, "an integer or null"),
    "device": (_opt(_str), "a string or null"),
    "data": (_opt(_str), "a string or null"),
    "success": (_bool, "true or false"),
    "failure": (_opt(_obj(kind=_opt(_str), message=_opt(_str))), "null or {kind: string, message: string}"),
    "warmup_steps": (_int, "an integer"),
    "measured_steps": (_int, "an integer"),
    "step_time_s": (_opt(_STATS), "null or {median, mean, min, max, p90: numbers}"),
    "throughput_samples_per_s": (_num, "a number or null"),
    "cpu_util_pct": (_opt(_obj(mean=_num, per_core=_opt(_list(_num)))), "null or {mean: number, per_core: [numbers]}"),
    "process_cpu_pct": (_num, "a number or null"),
    "gpu_util_pct": (_opt(_obj(mean=_num)), "null or {mean: number, ...}"),
    "power_w": (_opt(_map(_num)), "null or {rail: watts}"),
    "energy_j": (_opt(_obj(per_step_mean=_num, total=_num, by_rail=_opt(_map(_num)),
                           total_rails=_opt(_list(_str)))),
                 "null or {per_step_mean: number, total: number, by_rail: {rail: joules}, ...}"),
    "unavailable": (_opt(_map(_str)), "{figure: reason}"),
    "mem_peak_bytes": (_num, "a number of bytes or null"),
    "mem_peak_source": (_opt(_str), "a string or null"),
    "mem_system_peak_bytes": (_num, "a number of bytes or null"),
    "mem_runtime_bytes": (_num, "a number of bytes or null"),
    "budget_runtime_bytes": (_num, "a number of bytes or null"),
    "mem_training_bytes": (_num, "a number of bytes or null"),
    "mem_training_sampled_bytes": (_num, "a number of bytes or null"),
    "mem_file_bytes": (_num, "a number of bytes or null"),
    "mem_training_step": (_opt(_str), "a string or null"),
    "mem_mkl_bytes": (_num, "a number of bytes or null"),
    "mem_mkl_note": (_opt(_str), "a string or null"),
    "mem_breakdown_bytes": (_opt(_obj(parameters=_num, gradients=_num, optimizer_state=_num, activations=_num,
                                      inputs=_num, other=_num, tracked_peak=_num)), "null or {part: bytes, ...}"),
    "mem_fragmentation_bytes": (_num, "a number of bytes or null"),
    "target": (_opt(_str), "a string or null"),
    "budget_bytes": (_num, "a number of bytes or null"),
    "memory_plan": (_opt(_obj(label=_opt(_str), setting=_opt(_str), replans=_opt(_list(_obj())))),
                    "null or {label, setting, replans: [objects]}"),
    "sampler": (_opt(_obj(sensors=_opt(_list(_obj())))), "an object"),
    "env": (_opt(_obj(jetson=_opt(_obj()))), "an object"),
    "config": (_opt(_obj()), "an object"),
    "profiled": (_opt(_bool), "true or false"),
    "profile": (_opt(_obj()), "an object or null"),
    "write_error": (_opt(_str), "a string or null"),
    "noise": (_opt(_obj(noisy=_bool, step_cv=_num, reasons=_list(_str), busy_other_pct=_num)),
              "null or {noisy: boolean, step_cv: number, reasons: [strings], busy_other_pct: number}"),
    "repeats": (_opt(_obj(n=_integer, folders=_list(_str))), "null or {n: integer, folders: [strings], ...}"),
}


def field_problems(summary: Dict[str, Any]) -> Dict[str, str]:
    """{field: why} for each field present whose value is not of the type its readers rely on."""
    problems = {}
    for key, (check, wanted) in FIELD_TYPES.items():
        if key in summary and not check(summary[key]):
            problems[key] = f"{_kind(summary[key])} where {wanted} was expected"
    return problems


def checked(summary: Dict[str, Any]) -> Dict[str, Any]:
    """The summary with each field of the wrong type null, its reason in `unavailable` ("unreadable: ...") and
    in `_unreadable` ({field: why}, empty when every field is readable)."""
    problems = field_problems(summary)
    out = dict(summary)
    for key in problems:
        out[key] = None
    unavailable = dict(out.get("unavailable") or {})
    unavailable.update({k: f"unreadable in summary.json: {why}" for k, why in problems.items() if k != "unavailable"})
    out["unavailable"] = unavailable
    out["_unreadable"] = problems
    return out


def read_checked(path: Path) -> Dict[str, Any]:
    """read_summary_file, then `checked`."""
    return checked(read_summary_file(path))


def unreadable_text(summary: Dict[str, Any]) -> Optional[str]:
    """'energy_j: a number where ... was expected; ...' for a checked summary with unreadable fields, else None."""
    problems = summary.get("_unreadable") or {}
    return "; ".join(f"{k}: {why}" for k, why in problems.items()) or None
