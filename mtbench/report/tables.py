"""The tables of a report: README.md's job and board tables and summary.csv's columns."""
from __future__ import annotations

import re
from urllib.parse import quote
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mtbench.results.console import cpu_by_core_type, core_types_line, noise_line
from mtbench.results.reader import unreadable_text
from mtbench.report.jobs import NOT_MEASURED, board_of, board_source, boards, flatten, has_batch, value_at


def noisy_jobs(jobs: List[Dict[str, Any]]) -> List[Tuple[str, str]]:
    """(folder, why) of each job whose measurement summary.json flags as noisy (steps that vary, other busy
    processes): its figures stand beside the flag, never alone."""
    return [(str(j["_dir"]), why) for j in jobs for why in [noise_line(j)] if why]


def plan_cell(job: Dict[str, Any]) -> str:
    """The memory plan a job ran under (memory_plan.label; `auto:` when auto chose it, `->` for each re-plan)."""
    plan = job.get("memory_plan")
    if not isinstance(plan, dict):
        return "none"  # a summary from before memory plans: plain training
    labels = [r.get("from") for r in plan.get("replans") or []] + [plan.get("label")]
    return ("auto: " if plan.get("setting") == "auto" else "") + " -> ".join(str(x) for x in labels)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # terminal escapes, newlines that would break a table's row
SPREADSHEET_FORMULA = ("=", "+", "-", "@", "\t", "\r")  # a cell a spreadsheet would run as a formula


def _visible(text: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def md(value: Any) -> str:
    """A value as text in README.md: control bytes shown as \\xNN, & and < escaped (a folder named <img onerror=...>
    stays text: no tag opens; "->" stays as it is), a table's | escaped."""
    return _visible(str(value)).replace("&", "&amp;").replace("<", "&lt;").replace("|", "\\|")


def sheet_cell(value: Any) -> Any:
    """A summary.csv cell a spreadsheet shows as text: control bytes as \\xNN, and a text that a spreadsheet would run
    as a formula (=1+1, =HYPERLINK(...), +, -, @) prefixed with a quote, as OWASP's CSV-injection advice says.
    Numbers stay numbers."""
    if not isinstance(value, str):
        return value
    text = _visible(value)
    return "'" + text if text.startswith(SPREADSHEET_FORMULA) else text


def readme(jobs: List[Dict[str, Any]], figures: List[str], unreadable: Sequence[Dict[str, str]] = (),
           not_measured: Sequence[Tuple[str, str]] = ()) -> str:
    """README.md: a row per job (a summary.json that cannot be read: a row that says so and why), the boards,
    the failed jobs, the figures and what was not measured (no figure drawn for it)."""
    def cell(v: Optional[float], spec: str) -> str:
        return "n/a" if v is None else format(v, spec)

    typed = any(cpu_by_core_type(j) for j in jobs)  # a Jetson's core types: a column of CPU % per type
    columns = ["job", "model", "batch", "device", "board", "data", "result", "step median s", "samples/s", "CPU %"]
    columns += ["CPU % by core type"] if typed else []
    columns += ["GPU %", "energy/step J", "peak memory MiB", "memory plan"]
    lines = ["# mtbench report", "", f"{len(jobs)} job(s). n/a: {NOT_MEASURED} (or the job failed).", "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for j in jobs:
        result = "ok" if j.get("success") else f"**{md((j.get('failure') or {}).get('kind') or 'failed')}**"
        result += ", **NOISY**" if noise_line(j) else ""
        if j.get("_unreadable"):
            result += f" (**unreadable**: {md(', '.join(j['_unreadable']))})"
        mem = value_at(j, "mem_peak_bytes")
        by_type = cpu_by_core_type(j)
        row = [f"| {md(j['_dir'])}", md(j.get("model")), md(j.get("batch_size")), md(j.get("device")),
               md(j.get("_board") or board_of(j)), md(j.get("data")), result,
               cell(value_at(j, "step_time_s", "median"), ".4f"), cell(value_at(j, "throughput_samples_per_s"), ".2f"),
               cell(value_at(j, "cpu_util_pct", "mean"), ".1f")]
        row += [md(core_types_line(by_type)) if by_type else "n/a"] if typed else []
        row += [cell(value_at(j, "gpu_util_pct", "mean"), ".1f"), cell(value_at(j, "energy_j", "per_step_mean"), ".3f"),
                cell(mem / 2**20 if mem else None, ".1f"), md(plan_cell(j))]
        lines.append(" | ".join(row) + " |")
    for u in unreadable:
        lines.append(" | ".join([f"| {md(u['_dir'])}"] + [""] * 5 + ["**unreadable**"] + [""] * (len(columns) - 7)) + " |")
    lines += ["", "## Boards", "", "| board | jobs | named from | L4T | power mode |", "|---|---|---|---|---|"]
    for board in boards(jobs):
        js = [j for j in jobs if (j.get("_board") or board_of(j)) == board]
        sources = ", ".join(dict.fromkeys(j.get("_board_from") or board_source(j) for j in js))
        lines.append(f"| {md(board)} | {len(js)} | {md(sources)} | {md(jetson_cell(js, 'l4t'))} | "
                     f"{md(jetson_cell(js, 'power_mode'))} |")
    unbatched = [j["_dir"] for j in jobs if not has_batch(j)]
    if unbatched:
        lines += ["", f"Without a batch size (`mtbench-sample` runs), in this table and the power figure only, not "
                      f"on the batch-size axes: {md(', '.join(unbatched))}."]
    failed = [j for j in jobs if not j.get("success")]
    if failed:
        lines += ["", "## Failed jobs", ""] + [f"- {md(j['_dir'])}: {md((j.get('failure') or {}).get('kind'))}: "
                                                f"{md((j.get('failure') or {}).get('message'))}" for j in failed]
    noisy = noisy_jobs(jobs)
    if noisy:
        lines += ["", "## Noisy jobs", "", "Their figures were measured while something disturbed them; compare them "
                  "with care.", ""] + [f"- {md(d)}: NOISY: {md(why)}" for d, why in noisy]
    bad = [(u["_dir"], u["reason"]) for u in unreadable] + [(j["_dir"], unreadable_text(j)) for j in jobs
                                                             if j.get("_unreadable")]
    if bad:
        lines += ["", "## Unreadable summaries", "", "A summary.json that is not one is a row of its own; a field of "
                  "the wrong type is n/a in the tables and figures.", ""] + [f"- {md(d)}: {md(why)}" for d, why in bad]
    lines += ["", "## Figures", ""] + [f"![{md(f)}]({quote(f)})" for f in figures]
    if not_measured:
        lines += ["", "## Not measured", "", "Left out of the figures: nothing to draw.", ""] + [
            f"- {md(what)}: not measured: {md(why)}" for what, why in not_measured]
    return "\n".join(lines) + "\n"


def jetson_cell(jobs: List[Dict[str, Any]], key: str) -> str:
    """A Jetson field over a board's jobs: one value, or each value seen (a TX2 compared across power modes)."""
    seen = []
    for j in [j for j in jobs if isinstance((j.get("env") or {}).get("jetson"), dict)] or jobs:
        value = ((j.get("env") or {}).get("jetson") or {}).get(key)
        if isinstance(value, dict):  # power_mode: {"id": 0, "name": "MAXN"}
            value = f"{value.get('name')} ({value.get('id')})"
        text = "n/a" if value is None else str(value)
        if text not in seen:
            seen.append(text)
    return ", ".join(seen)


def csv_columns(job: Dict[str, Any]) -> Dict[str, Any]:
    """One summary.csv row: the board, every scalar of summary.json, and the CPU % per core type where known."""
    row = {"board": job.get("_board") or board_of(job)}
    row.update(flatten({k: v for k, v in job.items() if not k.startswith("_")}))
    if job.get("_unreadable"):
        row["unreadable"] = unreadable_text(job)
    for g in cpu_by_core_type(job) or []:
        if g["type"] is not None:
            row[f"cpu_util_pct.by_type.{g['type']}"] = None if g["pct"] is None else round(g["pct"], 3)
    return row
