"""Short human-readable output on the terminal (rich)."""
from __future__ import annotations

import re
import sys
from typing import Any, Dict, List, Optional

from rich.console import Console
from rich.markup import escape
from rich.table import Table

# piped output (a log file, CI) is not cut at 80 columns
console = Console(highlight=False, width=None if sys.stdout.isatty() else 140)


def fmt_bytes(n: Optional[float]) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024.0
    return str(n)


def _num(v: Optional[float], spec: str = ".3g", unit: str = "") -> str:
    return "n/a" if v is None else f"{v:{spec}}{unit}"


def print_summary(summary: Dict[str, Any], out_dir: str, compact: bool = False) -> None:
    ok = summary["success"]
    if compact:  # one line per job inside a sweep; the table at its end has the rest
        step = (summary.get("step_time_s") or {}).get("median")
        result = "ok" if ok else f"FAILED ({(summary['failure'] or {}).get('kind')})"
        noisy = noise_line(summary)
        console.print(f"    {summary['model']} batch {summary['batch_size']}: {result}, "
                      f"last step time median {_num(step, '.4f', ' s')}, results in {out_dir}"
                      + (f" (NOISY: {noisy})" if noisy else ""), markup=False, soft_wrap=True)
        return
    title = f"{summary['model']}  batch {summary['batch_size']}  on {summary['device']}  ({summary['data']})"
    table = Table(title=title, show_header=False, box=None, pad_edge=False)
    if not ok:
        failure = summary["failure"] or {}
        table.add_row("[red]FAILED[/red]", f"{failure.get('kind')}: {failure.get('message')}")
    step = summary.get("step_time_s") or {}
    table.add_row("step time", f"median {_num(step.get('median'), '.4f', ' s')}  "
                  f"p90 {_num(step.get('p90'), '.4f', ' s')}  ({summary['measured_steps']} steps)")
    table.add_row("throughput", _num(summary.get("throughput_samples_per_s"), ".2f", " samples/s"))
    if (summary.get("profile") or {}).get("overhead_ratio"):  # profile=true: the figures above are of slowed steps
        table.add_row("profiler", profiler_slowdown(summary["profile"]))
    cpu = summary.get("cpu_util_pct") or {}
    per_core = " ".join(_num(c, ".0f") for c in cpu.get("per_core") or [])
    by_type = cpu_by_core_type(summary)  # a Jetson: each core type apart (a TX2's Denver2 and A57 cores)
    typed = f"  {core_types_line(by_type)}" if by_type else ""
    table.add_row("CPU util", f"{_num(cpu.get('mean'), '.1f', ' %')}{typed}  per core [{per_core}]")
    gpu = summary.get("gpu_util_pct")
    table.add_row("GPU util", escape(_num(gpu.get("mean"), ".1f", " %") if gpu else why_null(summary, "gpu_util_pct")))
    power = summary.get("power_w")
    table.add_row("power", escape(", ".join(f"{k} {v:.2f} W" for k, v in power.items() if v is not None)
                                  if power else why_null(summary, "power_w")))
    energy = summary.get("energy_j")
    per_step = energy.get("per_step_mean") if energy else None
    table.add_row("energy/step", escape(_num(per_step, ".3f", " J") if per_step is not None
                                        else (why_null(summary, "energy_j.total", "n/a") if energy
                                                     else why_null(summary, "energy_j"))))
    target = target_line(summary)
    if target:  # a run to a target (until.*): what it took to get there
        table.add_row("to target", escape(target))
    table.add_row("peak memory", f"{fmt_bytes(summary.get('mem_peak_bytes'))} ({summary.get('mem_peak_source')})")
    table.add_row("memory breakdown", breakdown_line(summary))
    if summary.get("mem_fragmentation_bytes") is not None:
        table.add_row("fragmentation", f"{fmt_bytes(summary['mem_fragmentation_bytes'])} (allocator reserved - allocated)")
    if summary.get("budget_bytes") is not None:
        table.add_row("target", f"{summary.get('target')}: budget {fmt_bytes(summary['budget_bytes'])} "
                                f"({summary.get('budget_enforced_by')})")
    over = (summary.get("memory_plan") or {}).get("over_budget_bytes") if isinstance(summary.get("memory_plan"), dict) \
        else None
    if over:  # never a silent success: the peak went over the budget the plan was chosen for
        table.add_row("[yellow]WARNING[/yellow]", f"the measured peak went {fmt_bytes(over)} over the memory budget "
                                                  f"(memory_plan.over_budget_bytes)")
    if repeats_line(summary):
        table.add_row("repeats", escape(repeats_line(summary) or ""))
    if noise_line(summary):  # a spread figure is still a figure: said, never silently reported like any other
        table.add_row("[yellow]NOISY[/yellow]", escape(noise_line(summary) or ""))
    table.add_row("results", str(out_dir))
    console.print(table)


def noise_line(summary: Dict[str, Any]) -> Optional[str]:
    """Why the job's measurement is noisy (summary.json's `noise`), or None where it is not."""
    noise = summary.get("noise")
    if not isinstance(noise, dict) or not noise.get("noisy"):
        return None
    return "; ".join(str(r) for r in noise.get("reasons") or []) or "noisy"


def target_line(summary: Dict[str, Any]) -> Optional[str]:
    """A run to a target (summary.json's `until` and the *_to_target keys): 'until.accuracy=0.9 reached: 12 steps
    (96 samples), training time 1.234 s, wall time with checks 2.01 s, energy 11.1 J', or why it was not reached;
    None for an ordinary run."""
    until = summary.get("until")
    if not isinstance(until, dict) or "target_reached" not in summary:
        return None
    value = until.get("value")
    what = f"until.{until.get('metric')}" + (f"={value:g}" if isinstance(value, (int, float)) else "")
    if not summary.get("target_reached"):
        why = (summary.get("unavailable") or {}).get("steps_to_target")
        return f"{what} NOT reached" + (f": {why}" if why else "")
    energy = summary.get("energy_to_target_j")
    return (f"{what} reached: {_num(summary.get('steps_to_target'), '')} steps "
            f"({_num(summary.get('samples_to_target'), '')} samples), "
            f"training time {_num(summary.get('time_to_target_s'), '.4g', ' s')}, "
            f"wall time with checks {_num(summary.get('wall_to_target_s'), '.4g', ' s')}, "
            f"energy {_num(energy, '.4g', ' J') if energy is not None else why_null(summary, 'energy_to_target_j')}")


def repeats_line(summary: Dict[str, Any]) -> Optional[str]:
    """'3 runs (repeat-1 ... repeat-3): median step time 0.1234 s, std 0.0021 s, 95 % CI 0.1182-0.1286 s'."""
    repeats = summary.get("repeats")
    if not isinstance(repeats, dict):
        return None
    step = repeats.get("step_time_s") if isinstance(repeats.get("step_time_s"), dict) else {}
    ci = step.get("ci95") or [None, None]
    spread = (f"mean {_num(step.get('mean'), '.4f', ' s')}, std {_num(step.get('std'), '.4f', ' s')}, "
              f"95 % CI {_num(ci[0], '.4f')}-{_num(ci[1], '.4f', ' s')}" if step.get("ci95") else
              f"no spread ({step.get('reason') or 'n/a'})")
    return (f"{repeats.get('n')} runs, {repeats.get('succeeded', repeats.get('n'))} succeeded; median step time "
            f"across them: {spread}; this summary is {repeats.get('summary_of')}'s")


NOT_MEASURED = "not measured on this machine"


def why_null(summary: Dict[str, Any], key: str, default: str = NOT_MEASURED) -> str:
    """Why a figure is null, from the reason summary.json records: "not measured on this machine" where no sensor
    in use gives it (or no reason is recorded), else "n/a (<the reason>)": e.g. rails that were sampled but whose
    samples left a gap the gap rule does not allow."""
    reason = (summary.get("unavailable") or {}).get(key)
    if not reason:
        return default
    if str(reason).startswith("no sensor in use gives it"):
        return NOT_MEASURED
    return f"n/a ({reason})"


# env.CPU_PARTS' core types as NVIDIA's data sheets and the paper name them (cortex-a57 -> A57)
CORE_TYPE_NAMES = {"denver2": "Denver2", "carmel": "Carmel", "neoverse-v2": "Neoverse-V2"}


def core_type_name(kind: str) -> str:
    if kind in CORE_TYPE_NAMES:
        return CORE_TYPE_NAMES[kind]
    return kind[len("cortex-"):].upper() if kind.startswith("cortex-") else kind


def core_ranges(cores: List[int]) -> str:
    """[0, 3, 4, 5] -> '0,3-5'."""
    spans: List[List[int]] = []
    for c in sorted(cores):
        if spans and c == spans[-1][1] + 1:
            spans[-1][1] = c
        else:
            spans.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def per_core_numbers(summary: Dict[str, Any]) -> Optional[List[int]]:
    """The CPU number of each entry of cpu_util_pct.per_core, or None where nothing says it. The procfs sensor's
    fields (cpuN_busy_ticks, in per_core's order) say it: a core offline when sampling began (a TX2 power mode
    turns the Denver2 cores off) is absent from /proc/stat and from per_core, so index and number can differ."""
    per_core = (summary.get("cpu_util_pct") or {}).get("per_core") or []
    for sensor in (summary.get("sampler") or {}).get("sensors") or []:
        found = (re.fullmatch(r"cpu(\d+)_busy_ticks", str(f)) for f in (sensor or {}).get("fields") or [])
        cores = [int(m.group(1)) for m in found if m]
        if cores and len(cores) == len(per_core):
            return cores
    # a summary without the sensor's fields: env's online cores, where they are as many as the figures
    online = [c.get("cpu") for c in _env_cores(summary) if c.get("online")]
    return online if online and len(online) == len(per_core) else None


def _env_cores(summary: Dict[str, Any]) -> List[Dict[str, Any]]:
    jetson = (summary.get("env") or {}).get("jetson") or {}
    return [c for c in jetson.get("cpu_cores") or [] if isinstance(c, dict) and isinstance(c.get("cpu"), int)]


def cpu_by_core_type(summary: Dict[str, Any]) -> Optional[List[Dict[str, Any]]]:
    """CPU utilization per core type, where env.jetson gives each core's type; None elsewhere.

    [{"type": "denver2", "name": "Denver2", "cores": [1, 2], "pct": mean busy % of those cores or None}, ...] in
    order of each type's first core; cores of unknown type (offline when env was read) come last, type None.
    """
    cores = _env_cores(summary)
    if not any(c.get("type") for c in cores):
        return None
    per_core = (summary.get("cpu_util_pct") or {}).get("per_core") or []
    numbers = per_core_numbers(summary)
    pct_of = dict(zip(numbers, per_core)) if numbers else {}
    members: Dict[Optional[str], List[Dict[str, Any]]] = {}
    for core in sorted(cores, key=lambda c: c["cpu"]):
        members.setdefault(core.get("type"), []).append(core)
    groups = []
    for kind, group in sorted(members.items(), key=lambda kv: (kv[0] is None, kv[1][0]["cpu"])):
        cpus = [c["cpu"] for c in group]
        pcts = [pct_of[c] for c in cpus if pct_of.get(c) is not None]
        offline = not any(c.get("online") for c in group)
        name = core_type_name(kind) if kind else ("offline" if offline else "unknown type")
        groups.append({"type": kind, "name": name, "cores": cpus, "pct": sum(pcts) / len(pcts) if pcts else None})
    return groups


def core_types_line(groups: List[Dict[str, Any]]) -> str:
    """'A57 (cores 0,3-5) 21 %, Denver2 (cores 1-2) 63 %' (an offline group: 'offline (cores 1-2)')."""
    parts = []
    for g in groups:
        where = f"core{'s' if len(g['cores']) > 1 else ''} {core_ranges(g['cores'])}"
        parts.append(f"{g['name']} ({where})" + ("" if g["type"] is None and g["pct"] is None
                                                  else f" {_num(g['pct'], '.0f', ' %')}"))
    return ", ".join(parts)


def breakdown_line(summary: Dict[str, Any]) -> str:
    """Where the peak went (mem_breakdown_bytes), or why that is unknown."""
    parts = summary.get("mem_breakdown_bytes")
    if not parts:
        reason = (summary.get("unavailable") or {}).get("mem_breakdown_bytes")
        return f"n/a ({reason})" if reason else "n/a"
    names = (("parameters", "params"), ("gradients", "grads"), ("optimizer_state", "optimizer"),
             ("activations", "activations"), ("inputs", "inputs"), ("other", "other"))
    line = ", ".join(f"{label} {fmt_bytes(parts.get(key))}" for key, label in names)
    return f"{line} of {fmt_bytes(parts.get('tracked_peak'))} tracked (one extra step)"


def profiler_slowdown(profile: Dict[str, Any]) -> str:
    """profile=true: how much slower the profiled steps ran than as many unprofiled ones."""
    reference = (profile.get("unprofiled_step_time_s") or {}).get("median")
    return (f"these steps ran under the profiler, {profile['overhead_ratio']:.2f}x the unprofiled median "
            f"{_num(reference, '.4f', ' s')} (profile.overhead_ratio)")


def print_top_ops(header, rows, top: int = 8) -> None:
    """The operations that took the most time, and those that took the most energy."""
    col = {h: i for i, h in enumerate(header)}
    ops = [r for r in rows if r[col["device"]] is not None]
    for key, title in (("total_s", "time"), ("energy_j", "energy")):
        ranked = sorted((r for r in ops if r[col[key]] is not None), key=lambda r: -r[col[key]])[:top]
        if not ranked:
            console.print(f"top operations by {title}: not measured on this machine")
            continue
        table = Table(title=f"top operations by {title}")
        for h in ("name", "calls", "total_s", "share", "energy_j"):
            table.add_column(h, justify="left" if h == "name" else "right")
        for r in ranked:
            share = r[col["share_of_step_time"]]
            energy = r[col["energy_j"]]
            table.add_row(escape(str(r[0])[:60]), str(r[col["calls"]]), f"{r[col['total_s']]:.4f}",
                          "" if share is None else f"{100 * share:.1f} %", "n/a" if energy is None else f"{energy:.4f}")
        console.print(table)
