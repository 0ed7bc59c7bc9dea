"""The time-energy Pareto front of jobs that vary power.* keys: a figure per model and a table (pareto.md)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402

from mtbench.report.jobs import value_at, varying_keys  # noqa: E402
from mtbench.report.panels import save_png  # noqa: E402
from mtbench.results.files import atomic_write  # noqa: E402


def setting_of(job: Dict[str, Any]) -> Dict[str, Any]:
    """The power.* keys a job asked for (null ones left out)."""
    power = (job.get("config") or {}).get("power") or {}
    return {k: v for k, v in power.items() if v is not None and v is not False and k != "sysfs_root"}


def label(setting: Dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(setting.items())) or "as the device was"


def knob_axis(jobs: List[Dict[str, Any]]) -> Optional[str]:
    """The one power.* key whose values differ between `jobs`, where each job sets it to a number; else None."""
    settings = [setting_of(j) for j in jobs]
    varying = varying_keys(settings)
    if len(varying) != 1:
        return None
    values = [s.get(varying[0]) for s in settings]
    return varying[0] if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values) else None


def front(points: List[Tuple[float, float, Any]]) -> List[Tuple[float, float, Any]]:
    """The points no other point beats in both time and energy (lower is better), by time."""
    best: List[Tuple[float, float, Any]] = []
    for p in sorted(points, key=lambda p: (p[0], p[1])):
        if not best or p[1] < best[-1][1]:
            best.append(p)
    return best


def _energy_per_sample(job: Dict[str, Any]) -> Optional[float]:
    energy, batch = value_at(job, "energy_j", "per_step_mean"), value_at(job, "batch_size")
    return energy / batch if energy is not None and batch else None


def fig_pareto(jobs: List[Dict[str, Any]], out: Path) -> List[str]:
    """pareto_<model>.png per model whose jobs vary power.* (none: []), and pareto.md with every point."""
    ok = [j for j in jobs if j.get("success") and value_at(j, "step_time_s", "median") is not None]
    if len({label(setting_of(j)) for j in ok}) < 2:
        return []
    notes: List[str] = []
    names, rows = [], ["# Power settings: time and energy", "",
                       "| model | batch | power setting | step median s | energy/sample J | on the front |",
                       "|---|---|---|---|---|---|"]
    for model in sorted({str(j.get("model")) for j in ok}):
        mine = [j for j in ok if str(j.get("model")) == model]
        points = [(value_at(j, "step_time_s", "median"), _energy_per_sample(j), j) for j in mine]
        name = f"pareto_{model}.png"
        measured = [p for p in points if p[1] is not None]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        on_front: List[Any] = []
        if measured:
            on_front = [p[2] for p in front(measured)]
            ax.scatter([p[0] for p in measured], [p[1] for p in measured], color="0.6")
            best = front(measured)
            ax.plot([p[0] for p in best], [p[1] for p in best], "o-", color="C3", label="Pareto front")
            for t, e, j in best:
                ax.annotate(label(setting_of(j)), (t, e), fontsize=7, xytext=(4, 4), textcoords="offset points")
            ax.set_xlabel("median step time (s)")
            ax.set_ylabel("energy per sample (J)")
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # right of the data, never on it
        else:  # no power sensor here: time against the knob (or each setting), and the figure says so
            knob = knob_axis([p[2] for p in points])
            if knob is not None:  # one numeric knob varies (power.cpu_cores=1,2): a line over its values
                order = sorted(points, key=lambda p: setting_of(p[2])[knob])
                ax.plot([setting_of(p[2])[knob] for p in order], [p[0] for p in order], "o-", color="C0")
                ax.set_xlabel(f"power.{knob}")
            else:
                order = sorted(points, key=lambda p: label(setting_of(p[2])))
                ax.bar(range(len(order)), [p[0] for p in order], color="C0")
                ax.set_xticks(range(len(order)))
                ax.set_xticklabels([label(setting_of(p[2])) for p in order], rotation=20, fontsize=7, ha="right")
            ax.set_ylabel("median step time (s)")
            ax.text(0.5, 0.95, f"energy not measured on this machine: time against "
                    f"{'power.' + knob if knob else 'the power setting'}",
                    transform=ax.transAxes, ha="center", va="top", fontsize=8, color="0.4")
            notes.append(f"{model}: energy per sample is not measured here (no power sensor); {name} shows median "
                         f"step time against {'power.' + knob if knob else 'each power setting'} instead.")
        ax.set_title(f"{model}: time and energy per power setting")
        fig.tight_layout()
        save_png(fig, out / name)
        plt.close(fig)
        names.append(name)
        for t, e, j in sorted(points, key=lambda p: p[0]):
            rows.append(f"| {model} | {j.get('batch_size')} | {label(setting_of(j))} | {t:.4f} | "
                        f"{'n/a' if e is None else format(e, '.4f')} | "
                        f"{'yes' if any(j is f for f in on_front) else ('n/a' if e is None else 'no')} |")
    atomic_write(out / "pareto.md", "\n".join(rows + ([""] + notes if notes else [])) + "\n")
    return names
