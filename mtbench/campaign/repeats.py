"""`repeat=N`: a job run N times, each in its own process, and the group's summary (mean, std, 95 % CI across runs)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from omegaconf import DictConfig

from mtbench.config import setting
from mtbench.results import files as results
from mtbench.results.reader import UnreadableSummary, read_summary
# the group's summary and spreads are results (a report merges jobs run twice the same way)
from mtbench.results.repeat_group import group_summary, spread, t975  # noqa: F401 (spread, t975: tests)


def run_repeats(cfg: DictConfig, out_dir: Path, run: Optional[Callable[[DictConfig, Path], Dict[str, Any]]] = None,
                say: Callable[[str], None] = lambda line: print(line, flush=True)) -> Dict[str, Any]:
    """Run the job `repeat` times (each through `run`: run_isolated, a process of its own) into out_dir/repeat-K/,
    write the group's summary to out_dir/summary.json and return it; repeat=1 is one plain job in out_dir.

    A UsageError (the user's value, before anything ran) propagates; Ctrl-C or SIGTERM in repeat K leaves the group's
    summary of the repeats so far, K's own "interrupted" one included, and is re-raised."""
    if run is None:
        from mtbench.job.isolation import run_isolated as run
    count = setting(cfg, "repeat", 1)
    out_dir = Path(out_dir)
    if count == 1:
        return run(cfg, out_dir)
    summaries: List[Dict[str, Any]] = []
    folders: List[str] = []
    for k in range(1, count + 1):
        folder = out_dir / f"repeat-{k}"
        say(f"    repeat {k} of {count}: {folder}")
        try:
            summaries.append(run(cfg, folder))
        except KeyboardInterrupt:
            done = _written(folder)
            if done is not None:
                summaries.append(done)
                folders.append(folder.name)
            if summaries:
                results.write_summary(out_dir, group_summary(summaries, folders))
            raise
        folders.append(folder.name)
    group = group_summary(summaries, folders)
    results.write_summary(out_dir, group)
    return group


def _written(folder: Path) -> Optional[Dict[str, Any]]:
    try:
        return read_summary(folder)
    except UnreadableSummary:
        return None
