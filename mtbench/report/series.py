"""The series of the figures across batch sizes: one line per model, board and combination of the settings that vary
between that model's jobs (power.cpu_cores=1,2: two lines), and one point per batch size on each line."""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from mtbench.config import NOT_MEASURED_KEYS
from mtbench.report.jobs import board_of, boards, has_batch, varying_keys
from mtbench.results.logger_rows import flat_config
from mtbench.results.repeat_group import group_summary

NOT_RECORDED = "not recorded"  # a job whose summary has no config (an old one): what its settings are is unknown


def setting(job: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """The job's config as {dotted.key: value} less batch (the figures' x axis) and the keys that do not change what
    it measures (config.NOT_MEASURED_KEYS); None where its summary records no config."""
    if not isinstance(job.get("config"), dict) or not job["config"]:
        return None
    return {k: v for k, v in flat_config(job).items() if k != "batch" and k.split(".")[0] not in NOT_MEASURED_KEYS}


def _text(value: Any) -> str:
    """A value as a user types it in an override (null, true), a `_target_` by its class's name."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def variant_label(keys: Sequence[str], values: Mapping[str, Any]) -> str:
    """"cpu_cores=1 nvpmodel=2": each varying key by its last part (the whole key where two share one); a group
    whose choice varies (its `name` or `_target_`) as one part, "data=Synthetic", its other keys left out."""
    chosen = {k.rsplit(".", 1)[0]: k for k in keys if "." in k and k.rsplit(".", 1)[1] in ("name", "_target_")}
    parts: List[Tuple[str, str]] = []
    for k in keys:
        owner = next((p for p in chosen if k.startswith(p + ".")), None)
        if owner is None:
            parts.append((k, _text(values.get(k))))
        elif k == chosen[owner]:  # the group's choice names it; its other keys are left out
            shown = _text(values.get(k))
            parts.append((owner, shown.rsplit(".", 1)[-1] if k.endswith("._target_") else shown))
    tails = [k.rsplit(".", 1)[-1] for k, _ in parts]
    return " ".join(f"{k if tails.count(t) > 1 else t}={v}" for (k, v), t in zip(parts, tails))


def _variants(jobs: List[Dict[str, Any]]) -> Dict[int, str]:
    """{id(job): the label of its settings that vary among `jobs` ("" where none vary)}."""
    settings = {id(j): setting(j) for j in jobs}
    keys = varying_keys([s for s in settings.values() if s is not None])
    if not keys and len({s is None for s in settings.values()}) < 2:
        return {k: "" for k in settings}
    return {k: variant_label(keys, s) if s is not None else f"config {NOT_RECORDED}" for k, s in settings.items()}


def merge_runs(jobs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Jobs of one series at one batch size (one configuration run twice: two sweeps into one folder) as one job, the
    way `repeat=N` groups its runs (results/repeat_group.py): the median run's summary with the spread across them,
    which the figures draw as the point's 95 % interval (report/spread.py); where one failed, the group did."""
    if len(jobs) == 1:
        return jobs[0]
    ordered = sorted(jobs, key=lambda j: str(j.get("_dir")))
    merged = group_summary(ordered, [str(j.get("_dir")) for j in ordered])
    merged.pop("_steps", None)  # the median run's steps.csv is read again for it alone
    return merged


def by_series(jobs: List[Dict[str, Any]]) -> Dict[str, List[Dict[str, Any]]]:
    """{series label: its jobs in batch order, one per batch size} of the jobs with a batch size. A series is a model
    ("resnet50"), on a board where the jobs ran on several ("resnet50 @ quill"), and per combination of the settings
    that vary between that model's jobs on that board ("resnet50 cpu_cores=1"). Each job drawn carries its series'
    `_variant` (the settings' label) for its line style."""
    several = len(boards(jobs)) > 1
    per_model: Dict[Tuple[str, str], List[Dict[str, Any]]] = defaultdict(list)
    for j in jobs:
        if has_batch(j):
            per_model[(str(j.get("model")), str(j.get("_board") or board_of(j)))].append(j)
    groups: Dict[str, Dict[Any, List[Dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    variant_of: Dict[str, str] = {}
    for (model, board), js in per_model.items():
        variants = _variants(js)
        for j in js:
            name = " ".join(p for p in (model, variants[id(j)]) if p) + (f" @ {board}" if several else "")
            groups[name][j.get("batch_size")].append(j)
            variant_of[name] = variants[id(j)]
    out: Dict[str, List[Dict[str, Any]]] = {}
    for name in sorted(groups):
        points = [merge_runs(runs) for _, runs in sorted(groups[name].items(), key=lambda item: item[0] or 0)]
        for p in points:
            p["_variant"] = variant_of[name]
        out[name] = points
    return out
