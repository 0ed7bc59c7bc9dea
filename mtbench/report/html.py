"""report.html: the report as one self-contained page (figures inline, a sortable table per board, no network)."""
from __future__ import annotations

import base64
import os
from collections import Counter
from html import escape
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple
from urllib.parse import quote

from mtbench.regular_files import MIB, read_regular
from mtbench.report.jobs import NOT_MEASURED, board_of, board_source, boards, job_folder, value_at
from mtbench.report.spread import Point, point
from mtbench.report.tables import jetson_cell, noisy_jobs, plan_cell
from mtbench.results.console import noise_line
from mtbench.results.files import atomic_write

FIGURE_LIMIT_BYTES = 64 * MIB
MIME = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}

# titles of the figure kinds this package draws; a kind not named here is titled from its file name
KIND_TITLES = {
    "step_time_throughput": "Step time and throughput", "utilization": "CPU and GPU utilization",
    "power": "Power per rail", "energy": "Energy per step and per sample", "memory": "Peak memory",
    "memory_breakdown": "Where the peak memory goes", "profile": "Operations of the profiled jobs",
    "pareto": "Time and energy per power setting",
}

# a few lines of plain JavaScript: a click on a column's header sorts the table by it (numbers by value, n/a last)
SORT_JS = """
function mtbenchKey(cell) {
  var v = cell.getAttribute("data-sort");
  if (v !== null && v !== "" && !isNaN(v)) { return parseFloat(v); }
  return cell.textContent.trim().toLowerCase();
}
document.querySelectorAll("table.sortable").forEach(function (table) {
  var heads = table.tHead.rows[0].cells;
  Array.prototype.forEach.call(heads, function (th, col) {
    th.addEventListener("click", function () {
      var asc = th.getAttribute("aria-sort") !== "ascending";
      Array.prototype.forEach.call(heads, function (h) { h.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", asc ? "ascending" : "descending");
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = mtbenchKey(a.cells[col]), y = mtbenchKey(b.cells[col]);
        if (typeof x !== typeof y) { return typeof x === "number" ? -1 : 1; }
        return (x < y ? -1 : (x > y ? 1 : 0)) * (asc ? 1 : -1);
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""

CSS = """
body { font-family: sans-serif; margin: 1.5em auto; max-width: 1400px; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; margin-bottom: 1em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; }
td.text, th.text { text-align: left; }
th { background: #eee; cursor: pointer; user-select: none; }
th[aria-sort=ascending]::after { content: " \\25B2"; }
th[aria-sort=descending]::after { content: " \\25BC"; }
tr.failed td { background: #fdecea; }
tr.noisy td { background: #fff8e1; }
figure { margin: 0 0 1.5em 0; }
figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption, .note { font-size: 0.8em; color: #555; }
"""

# no network: images only from data: URLs, styles and the script inline
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"

COLUMNS = [("job", "text"), ("model", "text"), ("batch", ""), ("device", "text"), ("data", "text"),
           ("result", "text"), ("step median s", ""), ("spread", "text"), ("samples/s", ""), ("CPU %", ""),
           ("GPU %", ""), ("energy/step J", ""), ("peak memory MiB", ""), ("peak of", "text"),
           ("memory plan", "text"), ("summary", "text")]


def figure_kinds(names: Sequence[str]) -> List[Tuple[str, List[str]]]:
    """[(kind, [file, ...])] in the order the report drew them: a file's kind is its name without extension, or
    the word before its first "_" where several files share that word and none is named by it alone (a figure per
    model or per job: pareto_resnet50.png, pareto_vgg16.png)."""
    stems = [Path(n).stem for n in names]
    firsts = Counter(s.split("_")[0] for s in stems)
    kinds: Dict[str, List[str]] = {}
    for name, stem in zip(names, stems):
        first = stem.split("_")[0]
        if stem in KIND_TITLES:
            kind = stem
        elif first in KIND_TITLES or (firsts[first] > 1 and first not in stems):
            kind = first
        else:
            kind = stem
        kinds.setdefault(kind, []).append(name)
    return list(kinds.items())


def kind_title(kind: str) -> str:
    return KIND_TITLES.get(kind) or kind.replace("_", " ").capitalize()


def _data_url(path: Path) -> Optional[str]:
    mime = MIME.get(path.suffix.lower())
    if mime is None:
        return None
    try:
        data = read_regular(str(path), FIGURE_LIMIT_BYTES)
    except OSError:
        return None
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _href(target: Path, out: Path, trailing: str = "") -> str:
    """A relative link from the report's folder to `target` (the page may be moved together with the results)."""
    rel = os.path.relpath(os.path.abspath(target), os.path.abspath(out)).replace(os.sep, "/")
    return escape(quote(rel + trailing, safe="/"))


def _num(v: Optional[float], spec: str) -> Tuple[str, str]:
    """(text, data-sort) of a number; n/a where the machine did not measure it."""
    return ("n/a", "") if v is None else (format(v, spec), repr(float(v)))


def _spread_text(p: Optional[Point], job: Dict[str, Any]) -> str:
    if p is None or p.lo is None or p.hi is None:
        return ""
    if p.source == "repeats":
        n = (job.get("repeats") or {}).get("n")
        return f"95 % CI {p.lo:.4f}-{p.hi:.4f} ({n} runs)"
    return f"p10-p90 {p.lo:.4f}-{p.hi:.4f}"


def _row(job: Dict[str, Any], out: Path) -> str:
    failure = job.get("failure") if isinstance(job.get("failure"), dict) else {}
    result = "ok" if job.get("success") else str(failure.get("kind") or "failed")
    if job.get("_unreadable"):
        result += f" (unreadable: {', '.join(job['_unreadable'])})"
    noisy = noise_line(job)
    result += f", NOISY: {noisy}" if noisy else ""
    step, rate = point(job, "step_time"), point(job, "throughput")
    mem = value_at(job, "mem_peak_bytes")
    folder = job_folder(job)
    cells: List[Tuple[str, str, str]] = [  # (html, data-sort, class)
        (f'<a href="{_href(folder, out, "/")}">{escape(str(job["_dir"]))}</a>', "", "text"),
        (escape(str(job.get("model"))), "", "text"), (*_num(value_at(job, "batch_size"), "d"), ""),
        (escape(str(job.get("device"))), "", "text"), (escape(str(job.get("data"))), "", "text"),
        (escape(result), "", "text"), (*_num(step and step.value, ".4f"), ""),
        (escape(_spread_text(step, job)), "", "text"), (*_num(rate and rate.value, ".2f"), ""),
        (*_num(value_at(job, "cpu_util_pct", "mean"), ".1f"), ""),
        (*_num(value_at(job, "gpu_util_pct", "mean"), ".1f"), ""),
        (*_num(value_at(job, "energy_j", "per_step_mean"), ".3f"), ""),
        (*_num(mem / 2**20 if mem is not None else None, ".1f"), ""),
        (escape(str(job.get("mem_peak_source") or "n/a")), "", "text"), (escape(plan_cell(job)), "", "text"),
        (f'<a href="{_href(folder / "summary.json", out)}">summary.json</a>', "", "text")]
    row_class = " class=failed" if not job.get("success") else " class=noisy" if noisy else ""
    return f'<tr{row_class}>{"".join(_cell("td", *c) for c in cells)}</tr>'


def _cell(tag: str, inner: str, sort: str = "", cls: str = "", title: str = "") -> str:
    """A table cell; `inner` is HTML already escaped, the attributes are escaped here."""
    attrs = "".join(f' {name}="{escape(value)}"' for name, value in (("class", cls), ("data-sort", sort),
                                                                      ("title", title)) if value)
    return f"<{tag}{attrs}>{inner}</{tag}>"


def _board_tables(jobs: List[Dict[str, Any]], out: Path) -> List[str]:
    parts = []
    head = "".join(_cell("th", escape(n), cls=c, title=f"sort by {n}") for n, c in COLUMNS)
    for k, board in enumerate(boards(jobs)):
        js = [j for j in jobs if (j.get("_board") or board_of(j)) == board]
        sources = ", ".join(dict.fromkeys(str(j.get("_board_from") or board_source(j)) for j in js))
        parts += [f'<h3 id="board-{k}">{escape(board)}</h3>',
                  f'<p class="note">{len(js)} job(s); board named from {escape(sources)}; L4T '
                  f'{escape(jetson_cell(js, "l4t"))}; power mode {escape(jetson_cell(js, "power_mode"))}</p>',
                  f'<table class="sortable"><thead><tr>{head}</tr></thead><tbody>',
                  *[_row(j, out) for j in js], "</tbody></table>"]
    return parts


def page(jobs: List[Dict[str, Any]], figures: Sequence[str], not_measured: Sequence[Tuple[str, str]],
         unreadable: Sequence[Dict[str, str]], out: Path) -> str:
    """The page's text; every string from a summary or a path is escaped."""
    kinds = figure_kinds([f for f in figures if f])
    body = ["<h1>mtbench report</h1>",
            f'<p class="note">{len(jobs)} job(s) on {len(boards(jobs))} board(s). n/a: {NOT_MEASURED} (or the job '
            f'failed). Click a column\'s header to sort. Job and summary links are relative to this page.</p>',
            '<p class="note">Beside this page: <a href="summary.csv">summary.csv</a> (every scalar of every job), '
            '<a href="README.md">README.md</a>.</p>',
            "<nav><ul>", '<li><a href="#jobs">Jobs per board</a></li>',
            *[f'<li><a href="#fig-{k}">{escape(kind_title(kind))}</a></li>' for k, (kind, _) in enumerate(kinds)],
            '<li><a href="#not-measured">Not measured</a></li>' if not_measured else "", "</ul></nav>",
            '<section id="jobs"><h2>Jobs per board</h2>', *_board_tables(jobs, out), "</section>"]
    failed = [j for j in jobs if not j.get("success")]
    if failed:
        body += ['<section id="failed"><h2>Failed jobs</h2><ul>']
        for j in failed:
            f = j.get("failure") if isinstance(j.get("failure"), dict) else {}
            body.append(f"<li>{escape(str(j['_dir']))}: {escape(str(f.get('kind')))}: "
                        f"{escape(str(f.get('message')))}</li>")
        body.append("</ul></section>")
    noisy = noisy_jobs(jobs)
    if noisy:
        body += ['<section id="noisy"><h2>Noisy jobs</h2><p class="note">Their figures were measured while '
                 'something disturbed them; compare them with care.</p><ul>',
                 *[f"<li>{escape(d)}: NOISY: {escape(why)}</li>" for d, why in noisy], "</ul></section>"]
    if unreadable:
        body += ['<section id="unreadable"><h2>Unreadable summaries</h2><ul>',
                 *[f"<li>{escape(u['_dir'])}: {escape(u['reason'])}</li>" for u in unreadable], "</ul></section>"]
    for k, (kind, names) in enumerate(kinds):
        body.append(f'<section id="fig-{k}" class="figures"><h2>{escape(kind_title(kind))}</h2>')
        for name in names:
            url = _data_url(out / name)
            body.append(f'<figure><img src="{escape(url)}" alt="{escape(name)}"><figcaption>{escape(name)}'
                        f'</figcaption></figure>' if url else
                        f'<p class="note">{escape(name)}: could not be read for this page</p>')
        body.append("</section>")
    if not_measured:
        body += ['<section id="not-measured"><h2>Not measured</h2>',
                 '<p class="note">Left out of the figures: nothing to draw.</p><ul>',
                 *[f"<li>{escape(what)}: not measured: {escape(why)}</li>" for what, why in not_measured],
                 "</ul></section>"]
    return "\n".join(["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                      f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
                      "<title>mtbench report</title>", f"<style>{CSS}</style></head><body>",
                      *[b for b in body if b], f"<script>{SORT_JS}</script>", "</body></html>", ""])


def write_page(jobs: List[Dict[str, Any]], figures: Sequence[Optional[str]], not_measured: Sequence[Tuple[str, str]],
               unreadable: Sequence[Dict[str, str]], out: Path) -> Path:
    """report.html in `out`, beside the figure files it embeds."""
    path = Path(out) / "report.html"
    atomic_write(path, page(jobs, [f for f in figures if f], not_measured, unreadable, Path(out)))
    return path
