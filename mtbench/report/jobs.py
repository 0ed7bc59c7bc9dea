"""The jobs of one or several result folders: their summaries, keyed by board and grouped per model."""
from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from mtbench.errors import UsageError
from mtbench.results.reader import UnreadableSummary, read_checked

NOT_MEASURED = "not measured on this machine"  # a metric's text where a machine did not measure it


def find_summaries(root: Path, label: str = "") -> Tuple[List[Dict[str, Any]], List[Dict[str, str]]]:
    """Every job under root, and every summary.json there that cannot be read ([{"_dir", "reason"}]). A job's `_dir`
    is its folder relative to root, under `label` when several roots are merged; a field of the wrong type in a
    readable summary is null, its reason in `unavailable` and `_unreadable` (results/reader.py `checked`)."""
    jobs, unreadable = [], []
    for path in sorted(root.rglob("summary.json")):
        if "report" in path.relative_to(root).parts[:-1]:
            continue
        rel = str(path.parent.relative_to(root))
        where = "/".join(p for p in (label, "" if rel == "." else rel) if p) or "."
        try:
            summary = read_checked(path)
        except UnreadableSummary as exc:
            unreadable.append({"_dir": where, "path": str(path), "reason": exc.reason})
            continue
        summary.update(_dir=where, _root=str(root), _rel=rel, _source=label)
        jobs.append(summary)
    return jobs, unreadable


def root_labels(roots: List[Path]) -> List[str]:
    """The shortest trailing parts of each folder's path that tell the folders apart ('' for a single folder)."""
    if len(roots) < 2:
        return [""] * len(roots)
    parts = [Path(os.path.abspath(r)).parts for r in roots]
    for n in range(1, max(len(p) for p in parts) + 1):
        labels = ["/".join(p[-n:]).lstrip("/") or "/" for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    raise UsageError(f"report: a folder is given twice: {' '.join(str(r) for r in roots)}")


def board_of(job: Dict[str, Any]) -> str:
    """What a job ran on: the Jetson board (env.jetson.board), else the GPU's name for a CUDA job, else the CPU
    model, else the host name."""
    env = job.get("env") if isinstance(job.get("env"), dict) else {}
    board = (env.get("jetson") or {}).get("board") if isinstance(env.get("jetson"), dict) else None
    if board:
        return str(board)
    if str(job.get("device", "")).startswith("cuda") and env.get("device_name"):
        return str(env["device_name"])
    return str(env.get("cpu_model") or env.get("host") or "unknown board")


def board_source(job: Dict[str, Any]) -> str:
    env = job.get("env") if isinstance(job.get("env"), dict) else {}
    if isinstance(env.get("jetson"), dict) and env["jetson"].get("board"):
        return "env.jetson.board"
    if str(job.get("device", "")).startswith("cuda") and env.get("device_name"):
        return "GPU name (env.device_name)"
    return "CPU model (env.cpu_model)" if env.get("cpu_model") else "host name (env.host)"


def assign_boards(jobs: List[Dict[str, Any]]) -> None:
    """Set each job's `_board`: board_of, refined by the host and then by the folder given to the report where
    two jobs of one (board, model, batch) came from different hosts or folders, so that no two of them are
    ever merged into one series point."""
    # a job whose process died before it read the board has a summary written by the sweep's parent, with
    # env.host() only (no "jetson" key): it ran on the Jetson its host names in its other jobs
    jetson_of_host: Dict[str, str] = {}
    for j in jobs:
        env = j.get("env") if isinstance(j.get("env"), dict) else {}
        if isinstance(env.get("jetson"), dict) and env["jetson"].get("board") and env.get("host"):
            jetson_of_host.setdefault(str(env["host"]), str(env["jetson"]["board"]))
    by_board: Dict[str, List[Dict[str, Any]]] = defaultdict(list)
    for j in jobs:
        env = j.get("env") if isinstance(j.get("env"), dict) else {}
        inherited = "jetson" not in env and str(env.get("host")) in jetson_of_host
        j["_board_from"] = "env.jetson.board of the host's other jobs" if inherited else board_source(j)
        by_board[jetson_of_host[str(env.get("host"))] if inherited else board_of(j)].append(j)
    for board, js in by_board.items():
        def host(j: Dict[str, Any]) -> str:
            return str((j.get("env") or {}).get("host") or "?")

        levels = [lambda j: board, lambda j: f"{board} @ {host(j)}",
                  lambda j: f"{board} @ {host(j)} [{j.get('_source') or '.'}]"]
        chosen = levels[-1]
        for key in levels:  # the first level at which one point of a series comes from one host and one folder
            origins: Dict[tuple, set] = defaultdict(set)
            for j in js:
                if has_batch(j):
                    origins[(key(j), j.get("model"), j.get("batch_size"))].add((host(j), j.get("_source")))
            if all(len(o) == 1 for o in origins.values()):
                chosen = key
                break
        for j in js:  # two jobs of one host and folder (a sweep over another knob) stay in one series
            j["_board"] = chosen(j)


def boards(jobs: List[Dict[str, Any]]) -> List[str]:
    return sorted(set(str(j.get("_board") or board_of(j)) for j in jobs))


def flatten(value: Any, prefix: str = "") -> Dict[str, Any]:
    if isinstance(value, dict):
        out: Dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list):
        out = {}
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}.{i}"))
        return out
    return {prefix: value}


def value_at(job: Dict[str, Any], *keys: str) -> Optional[float]:
    v: Any = job
    for k in keys:
        if not isinstance(v, dict):
            return None
        v = v.get(k)
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def has_batch(job: Dict[str, Any]) -> bool:
    """Jobs on a batch-size axis: a `mtbench-sample` run has no batch size (null) and is in the tables only."""
    b = job.get("batch_size")
    return isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0


def job_label(job: Dict[str, Any], with_board: bool = False) -> str:
    text = f"{job.get('model')}\nb{job.get('batch_size')}" if has_batch(job) else str(job.get("_dir"))
    return f"{text}\n{job.get('_board') or board_of(job)}" if with_board else text


def varying_keys(settings: Sequence[Mapping[str, Any]]) -> List[str]:
    """The keys whose values differ between these settings ({key: value} each; a key one lacks is None there),
    sorted."""
    keys = sorted({k for s in settings for k in s})
    return [k for k in keys if len({repr(s.get(k)) for s in settings}) > 1]


def job_folder(job: Dict[str, Any]) -> Path:
    """The folder a job's summary.json is in."""
    return Path(job.get("_root") or ".") / str(job.get("_rel") or ".")


def fold_repeats(jobs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The jobs less the single runs of a repeated job (summary["repeats"]["folders"], relative to the group's
    folder or absolute): the group's summary stands for them, with their spread as its error bars."""
    members = set()
    for j in jobs:
        group = j.get("repeats")
        folders = group.get("folders") if isinstance(group, dict) else None
        for f in folders if isinstance(folders, list) else []:
            if isinstance(f, str) and f:
                member = os.path.normpath(os.path.join(os.path.abspath(job_folder(j)), f))
                if member != os.path.normpath(os.path.abspath(job_folder(j))):
                    members.add(member)
    return [j for j in jobs if os.path.normpath(os.path.abspath(job_folder(j))) not in members]
