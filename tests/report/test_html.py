"""report.html (one self-contained page: figures inline, a sortable table per board, every string escaped) and the
figures as a reader expects them (memory from 0 titled with its peak, one batch axis, legends outside the data,
nothing-measured figures left out and listed, error bars from repeats or from the steps), on summaries written
in the shape a run writes; the page is opened in headless Chromium where it is installed."""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
from html import unescape
from pathlib import Path
from typing import Any, Dict, List
from urllib.parse import unquote

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
import pytest

from mtbench.report import build, figures, make_report
from mtbench.report.html import figure_kinds
from tests.report.test_boards import fake_summary, write_jobs

EVIL = "<img src=x onerror=alert(1)>&\"'"  # a model name a page must show, never run
STEP_S = {2: [0.10, 0.12, 0.20, 0.11, 0.30], 4: [0.20, 0.22, 0.26, 0.21, 0.40]}  # measured steps per batch


def _steps_csv(folder: Path, durations: List[float]) -> None:
    """steps.csv as a job writes it (one warm-up step first, which no bar may count)."""
    rows = ["index,start_s,end_s,duration_s,warmup,cpu_util_pct,process_cpu_pct,gpu_util_pct,plan"]
    t = 0.0
    for i, d in enumerate([9.0] + durations):
        rows.append(f"{i},{t:.6f},{t + d:.6f},{d:.6f},{int(i == 0)},50.0,90.0,,none")
        t += d
    (folder / "steps.csv").write_text("\n".join(rows) + "\n")


def _repeated(model: str, batch: int, medians: List[float]) -> Dict[str, Any]:
    """A repeated job's group summary (summary["repeats"], the contract of repeat=N): its runs in r0, r1, ..."""
    s = fake_summary(model, batch, medians[0], [50.0, 50.0])
    mean = sum(medians) / len(medians)
    rates = [batch / m for m in medians]
    s["repeats"] = {"n": len(medians), "folders": [f"r{i}" for i in range(len(medians))],
                    "step_time_s": {"mean": mean, "std": 0.01, "ci95": [mean - 0.03, mean + 0.03], "values": medians},
                    "throughput": {"mean": sum(rates) / len(rates), "std": 0.5,
                                   "ci95": [min(rates), max(rates)], "values": rates},
                    "energy_per_sample_j": None}
    return s


@pytest.fixture
def results(tmp_path):
    return write_results(tmp_path)


def write_results(tmp_path: Path) -> Path:
    """A sweep: resnet50 at batch 2 and 4 (steps.csv each), vgg16 b2 run three times (repeat=3), an OOM, and a
    model whose name is HTML."""
    root = write_jobs(tmp_path / "multirun", [
        fake_summary("resnet50", 2, sorted(STEP_S[2])[2], [40.0, 60.0]),
        fake_summary("resnet50", 4, sorted(STEP_S[4])[2], [45.0, 65.0]),
        _repeated("vgg16", 2, [0.50, 0.52, 0.54]),
        {**fake_summary("vgg16", 64, 1.0, [None, None], success=False), "step_time_s": None,
         "throughput_samples_per_s": None},
        fake_summary(EVIL, 2, 0.3, [50.0, 50.0])])
    _steps_csv(root / "0-resnet50-b2", STEP_S[2])
    _steps_csv(root / "1-resnet50-b4", STEP_S[4])
    for i, median in enumerate([0.50, 0.52, 0.54]):  # the repeats' own folders, inside the group's
        (root / "2-vgg16-b2" / f"r{i}").mkdir()
        (root / "2-vgg16-b2" / f"r{i}" / "summary.json").write_text(json.dumps(fake_summary("vgg16", 2, median,
                                                                                           [50.0, 50.0])))
    return root


@pytest.fixture
def saved(monkeypatch):
    """{figure file: the matplotlib figure} of every figure the report saves through figures._save."""
    figs: Dict[str, Any] = {}
    real = figures._save

    def save(fig, path):
        name = real(fig, path)
        figs[name] = fig
        return name

    monkeypatch.setattr(figures, "_save", save)
    return figs


def _spans(ax, digits: int = 6) -> List[tuple]:
    """(x, lo, hi) of every error bar in a panel, sorted."""
    return sorted(tuple(round(float(v), digits) for v in (seg[0][0], seg[0][1], seg[1][1]))
                  for c in ax.containers if hasattr(c, "has_yerr") for seg in c.lines[2][0].get_segments())


def test_error_bars_from_repeats_and_from_the_steps(results, saved):
    make_report(results)
    fig = saved["step_time_throughput.png"]
    time_ax = next(ax for ax in fig.axes if ax.get_title() == "step time (median)")
    lines = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in time_ax.get_lines()}
    assert lines["vgg16"][1][0] == pytest.approx(0.52)  # a repeated job: the mean across repeats, the CI's centre
    # resnet50: p10-p90 of the measured steps in steps.csv (the 9 s warm-up step is not one of them); vgg16:
    # the ci95 of its repeats
    expect = sorted([(2.0, round(0.52 - 0.03, 6), round(0.52 + 0.03, 6))] +
                    [(float(b), round(float(np.percentile(d, 10)), 6), round(float(np.percentile(d, 90)), 6))
                     for b, d in STEP_S.items()])
    assert _spans(time_ax) == expect
    # throughput: the steps' throughput p10-p90 is batch / (p90, p10) of their times; repeats: their ci95
    rate_ax = next(ax for ax in fig.axes if ax.get_title() == "throughput")
    rate_spans = _spans(rate_ax, 4)
    assert (4.0, round(4 / np.percentile(STEP_S[4], 90), 4), round(4 / np.percentile(STEP_S[4], 10), 4)) in rate_spans
    assert (2.0, round(2 / 0.54, 4), round(2 / 0.50, 4)) in rate_spans
    assert "95 % confidence interval across repeats" in " ".join(t.get_text() for t in fig.texts)


def test_repeats_are_one_job_not_four(results):
    out = make_report(results)
    text = (out / "README.md").read_text()
    assert "2-vgg16-b2 |" in text and "2-vgg16-b2/r0" not in text
    page = (out / "report.html").read_text()
    assert "95 % CI 0.4900-0.5500 (3 runs)" in page and "r1/summary.json" not in page


def test_memory_from_zero_titled_with_its_peak_one_panel_per_kind(tmp_path, saved):
    jobs = [fake_summary("resnet50", b, 0.1 * b, [50.0, 50.0]) for b in (1, 2, 8)]
    jobs += [fake_summary("resnet50", b, 0.01 * b, [10.0], device="cuda:0", device_name="NVIDIA H200",
                          host="gpu") for b in (2, 8)]
    for j in jobs:  # far from 0: an autoscaled axis would start near 500 MiB
        j["mem_peak_bytes"] = (500 + j["batch_size"]) << 20
    for j in jobs[3:]:
        j["mem_peak_source"] = "cuda_allocator"
    make_report(write_jobs(tmp_path / "r", jobs))
    fig = saved["memory.png"]
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["peak GPU memory: CUDA allocator (max_memory_allocated)",
                      "peak process memory: resident high-water mark (VmHWM)",
                      "peak system memory in use (MemTotal - MemAvailable)"]
    assert all(ax.get_ylim()[0] == 0 for ax in fig.axes)
    gpu = {ln.get_label(): list(ln.get_xdata()) for ln in fig.axes[0].get_lines()}
    assert gpu == {"resnet50 @ NVIDIA H200": [2, 8]}  # an allocator's count is never on the RSS axis


def test_one_batch_axis_everywhere(results, saved):
    make_report(results)
    seen = 0
    for name, fig in saved.items():
        for ax in fig.axes:
            if ax.get_xlabel() != "batch size":
                continue
            seen += 1
            assert ax.get_xscale() == "log", name
            assert ax.xaxis.get_transform().base == 2, name
            labels = [t.get_text() for t in ax.get_xticklabels()]
            assert labels and all(re.fullmatch(r"\d+", x) for x in labels), (name, labels)  # 2, 4, 64: no 2^1
            assert not ax.xaxis.get_minorticklocs().size, name
    assert seen >= 4


@pytest.mark.parametrize("names", [("resnet50", "vgg16"), ("resnet50", EVIL)])
def test_legends_never_over_the_data(tmp_path, saved, names):
    """Short labels (a legend inside a panel could fit) and long ones alike: the legend is beside the panels."""
    make_report(write_jobs(tmp_path / "r", [fake_summary(m, b, 0.1 * b, [50.0, 70.0]) for m in names for b in (1, 4)]))
    for name, fig in saved.items():
        renderer = FigureCanvasAgg(fig).get_renderer()  # the report closed the figure: a canvas to measure on
        legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
        for legend in legends:
            box = legend.get_window_extent(renderer)
            for ax in fig.axes:
                if ax.axison:
                    assert not box.overlaps(ax.get_window_extent(renderer)), name


def test_a_figure_with_nothing_measured_is_left_out_and_listed(results):
    out = make_report(results)  # no power sensor, no GPU, no energy, no breakdown in these summaries
    for name in ("power.png", "energy.png", "memory_breakdown.png"):
        assert not (out / name).exists()
    readme = (out / "README.md").read_text()
    page = (out / "report.html").read_text()
    for line in ("mean power per rail: not measured: no sensor in use gives it",
                 "energy per step: not measured: no sensor in use gives it",
                 "GPU utilization: not measured: no sensor in use gives it"):
        assert f"- {line}" in readme and line in page
    assert "power.png" not in readme and 'alt="power.png"' not in page
    # no model has a breakdown: one line, not one per model
    assert readme.count("memory breakdown") == 1
    assert "- memory breakdown: not measured: not in these summaries" in readme


def test_page_is_self_contained_escaped_and_links_each_job(results):
    out = make_report(results)
    page = (out / "report.html").read_text()
    assert EVIL not in page and "&lt;img src=x onerror=alert(1)&gt;&amp;&quot;&#x27;" in page
    assert "<img" in page and all(src.startswith("data:image/png;base64,")
                                  for src in re.findall(r'<img src="([^"]*)"', page))
    assert not re.search(r'(src|href)="(https?:|//)', page)
    hrefs = [unquote(unescape(h)) for h in re.findall(r'href="([^"#][^"]*)"', page)]
    assert hrefs and all(not os.path.isabs(h) for h in hrefs)
    for h in hrefs:
        assert (out / h).exists(), h
    assert sum(h.endswith("summary.json") for h in hrefs) == 5
    assert '<table class="sortable">' in page


def test_every_figure_the_build_produces_gets_a_section(results, monkeypatch):
    """Figures another module adds (by name unknown here) appear: a kind per file, files of one family together."""
    real = build.fig_pareto

    def more(jobs, out):
        for name in ("data_wait.png", "tta_resnet50.png", "tta_vgg16.png"):
            shutil.copy(out / "step_time_throughput.png", out / name)
        return real(jobs, out) + ["data_wait.png", "tta_resnet50.png", "tta_vgg16.png"]

    monkeypatch.setattr(build, "fig_pareto", more)
    page = (make_report(results) / "report.html").read_text()
    assert "<h2>Data wait</h2>" in page and "<h2>Tta</h2>" in page
    assert page.index('alt="tta_resnet50.png"') < page.index('alt="tta_vgg16.png"')


def test_figure_kinds():
    assert figure_kinds(["memory.png", "memory_breakdown.png", "pareto_a.png", "pareto_b.png", "profile_x.png",
                         "x_y.png", "time_to_accuracy.png"]) == [
        ("memory", ["memory.png"]), ("memory_breakdown", ["memory_breakdown.png"]),
        ("pareto", ["pareto_a.png", "pareto_b.png"]), ("profile", ["profile_x.png"]), ("x_y", ["x_y.png"]),
        ("time_to_accuracy", ["time_to_accuracy.png"])]


# ---- in a browser ---------------------------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

CHECK_JS = """<script>
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var broken = imgs.filter(function (i) { return !i.complete || i.naturalWidth === 0; }).map(function (i) {
    return i.alt; });
  var table = document.querySelector("table.sortable");
  var heads = Array.prototype.slice.call(table.tHead.rows[0].cells);
  var col = heads.map(function (h) { return h.textContent; }).indexOf("step median s");
  function column() { return Array.prototype.map.call(table.tBodies[0].rows, function (r) {
    return r.cells[col].textContent; }); }
  heads[col].click(); var asc = column();
  heads[col].click(); var desc = column();
  var m = document.createElement("pre"); m.id = "mtbench-check";
  m.textContent = JSON.stringify({images: imgs.length, broken: broken, asc: asc, desc: desc,
                                  alerts: window.mtbenchAlerts || 0});
  document.body.appendChild(m);
});
</script>"""


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr", "--v=0",
                           f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=5000", *args],
                          capture_output=True, text=True, timeout=180)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium; .ci/run "
                                             "installs it)")
def test_page_in_headless_chromium(results, tmp_path):
    out = make_report(results)
    page = (out / "report.html").read_text()
    # the page itself plus a script that reads what the browser made of it (beside it: same relative links)
    (out / "check.html").write_text(page.replace("</body>", CHECK_JS + "</body>"))
    proc = _chromium(tmp_path, "--dump-dom", (out / "check.html").as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []  # no script error, no blocked load (the page's CSP would report one here)
    found = re.search(r'<pre id="mtbench-check">(.*?)</pre>', proc.stdout, re.S)
    assert found, proc.stdout[-2000:]
    check = json.loads(unescape(found.group(1)))
    assert check["images"] >= 3 and check["broken"] == []
    numbers = [float(x) for x in check["asc"] if x != "n/a"]
    assert numbers == sorted(numbers) and check["asc"][-1] == "n/a"  # the OOM job: n/a, last
    assert [float(x) for x in check["desc"] if x != "n/a"] == sorted(numbers, reverse=True)

    shot = tmp_path / "shot.png"
    proc = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,1600", (out / "report.html").as_uri())
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    assert [line for line in proc.stderr.splitlines() if ":CONSOLE" in line] == []
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))[..., :3].reshape(-1, 3)
    colours, counts = np.unique((pixels * 255).astype(np.uint8), axis=0, return_counts=True)
    assert len(colours) > 1 and counts.max() / counts.sum() < 0.98  # not blank: text, a table, figures


BUSY = ["model=squeezenet", "~model.workload.net", "~model.workload.optimizer", "~model.workload.input_shape",
        "~model.workload.num_classes", "model.workload._target_=tests.fake_workloads.BusyLoop",
        "+model.workload.seconds=0.01"]


def test_a_real_runs_steps_give_its_error_bar(tmp_path, run):
    """The steps.csv a job writes (not one written here) is what the p10-p90 bar is read from."""
    from mtbench.report.jobs import find_summaries
    from mtbench.report.spread import point

    run(BUSY + ["batch=2", "warmup=1", "steps=4"], name="sweep/0")
    out = make_report(tmp_path / "sweep")
    (job,), _ = find_summaries(tmp_path / "sweep")
    with open(tmp_path / "sweep" / "0" / "steps.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["warmup"] == "0"]
    durations = [float(r["duration_s"]) for r in rows]
    assert len(durations) == 4
    p = point(job, "step_time")
    assert p.source == "steps"
    assert (p.lo, p.hi) == pytest.approx((np.percentile(durations, 10), np.percentile(durations, 90)), abs=2e-6)
    assert "p10-p90" in (out / "report.html").read_text()


def test_energy_bars_from_the_steps_energy_and_from_repeats(tmp_path, saved):
    """A single run: p10-p90 of its steps' energy_j_total (per sample: / batch); a repeated job: the ci95 of its
    energy per sample (per step: x batch)."""
    single = fake_summary("resnet50", 4, 0.2, [50.0, 50.0])
    single["energy_j"] = {"per_step_mean": 2.0, "total": 10.0, "by_rail": {"VDD_IN": 10.0}, "total_rails": ["VDD_IN"]}
    group = _repeated("resnet50", 8, [0.4, 0.41, 0.42])
    group["energy_j"] = {"per_step_mean": 4.0, "total": 20.0, "by_rail": {"VDD_IN": 20.0}, "total_rails": ["VDD_IN"]}
    group["repeats"]["energy_per_sample_j"] = {"mean": 0.5, "std": 0.02, "ci95": [0.45, 0.55], "values": [0.5] * 3}
    root = write_jobs(tmp_path / "r", [single, group])
    energies = [1.0, 1.5, 2.0, 2.5, 3.0]
    rows = ["index,start_s,end_s,duration_s,warmup,energy_j_VDD_IN,energy_j_total,energy_j_null_reason"]
    rows += [f"{i},{i * 0.2:.6f},{(i + 1) * 0.2:.6f},0.200000,0,{e},{e}," for i, e in enumerate(energies)]
    (root / "0-resnet50-b4" / "steps.csv").write_text("\n".join(rows) + "\n")
    make_report(root)
    fig = saved["energy.png"]
    per_step, per_sample = (next(ax for ax in fig.axes if ax.get_title() == t)
                            for t in ("energy per step", "energy per sample"))
    lo, hi = np.percentile(energies, 10), np.percentile(energies, 90)
    assert _spans(per_step, 4) == [(4.0, round(lo, 4), round(hi, 4)), (8.0, round(0.45 * 8, 4), round(0.55 * 8, 4))]
    assert _spans(per_sample, 4) == [(4.0, round(lo / 4, 4), round(hi / 4, 4)), (8.0, 0.45, 0.55)]
    assert all(ax.get_ylim()[0] == 0 for ax in fig.axes)


def test_failed_jobs_alone_are_one_memory_panel(tmp_path, saved):
    jobs = [{**fake_summary("vgg16", b, 1.0, [None], success=False), "mem_peak_bytes": None,
             "mem_peak_source": None, "mem_system_peak_bytes": None} for b in (64, 128)]
    out = make_report(write_jobs(tmp_path / "r", jobs))
    assert [ax.get_title() for ax in saved["memory.png"].axes] == ["peak memory"]  # where the OOMs are, once
    assert "peak system memory in use (MemTotal - MemAvailable): not measured: no job succeeded" in \
        (out / "README.md").read_text()


def test_power_bars_of_several_boards_keep_their_labels_apart(tmp_path, saved):
    """Two Orin Nanos (a ~70-character board name) and a TX2: each bar's label is readable, none runs into the
    next, and the hosts that tell the two Orins apart stay in them."""
    from tests.report.test_boards import orin_env, tx2_env

    jobs = [fake_summary("resnet50", b, 0.1, [30.0] * 6, jetson=env, host=host)
            for env, host in ((orin_env(), "orin-1"), (orin_env(), "orin-2"), (tx2_env(), "tx2")) for b in (2, 4, 8)]
    for j in jobs:
        j["power_w"] = {"VDD_IN": 9.0, "VDD_CPU_GPU_CV": 4.0}
    make_report(write_jobs(tmp_path / "r", jobs))
    fig = saved["power.png"]
    renderer = FigureCanvasAgg(fig).get_renderer()
    labels = fig.axes[0].get_xticklabels()
    texts = [t.get_text() for t in labels]
    assert len(set(texts)) == len(texts) == 9 and sum("@ orin-1" in t for t in texts) == 3
    boxes = [t.get_window_extent(renderer) for t in labels]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def test_a_noisy_job_is_flagged_beside_its_figures_in_every_table(tmp_path):
    """Issue 52 item 5: a loaded cores sweep showed 3.08 s against 0.07 s as results, its NOISY flag (summary.json)
    nowhere in the report. The job's row says NOISY with the reason, and a section lists each noisy job."""
    why = "other processes kept 60 % of the machine's CPU busy during the measured steps (> 10 %)"
    noisy = {**fake_summary("resnet50", 2, 3.08, [40.0, 60.0]),
             "noise": {"noisy": True, "step_cv": 0.01, "reasons": [why], "busy_other_pct": 60.0}}
    quiet = {**fake_summary("resnet50", 4, 0.07, [45.0, 65.0]),
             "noise": {"noisy": False, "step_cv": 0.01, "reasons": [], "busy_other_pct": 1.0}}
    root = write_jobs(tmp_path / "sweep", [noisy, quiet])
    out = make_report(root)
    page = (out / "report.html").read_text()
    rows = re.findall(r"<tr[^>]*>.*?</tr>", page)
    flagged = [r for r in rows if "NOISY" in r]
    assert len(flagged) == 1 and "3.0800" in flagged[0] and flagged[0].startswith("<tr class=noisy>")
    assert unescape(f"NOISY: {why}") in unescape(page) and '<section id="noisy">' in page
    readme = (out / "README.md").read_text()
    table = [line for line in readme.splitlines() if line.startswith("| ") and "resnet50" in line]
    assert [("**NOISY**" in line, "3.0800" in line) for line in table] in ([(True, True), (False, False)],
                                                                          [(False, False), (True, True)])
    assert "## Noisy jobs" in readme and why in readme


@pytest.mark.parametrize("evals", [
    "check,train_time_s,train_energy_j,loss,met\n1,0.5,,abc,0\n2,1.0,,0.4,1\n",  # a value that is no number
    "check,train_time_s,loss\n1,nan,0.5\n",  # no finite time: no point
])
def test_a_malformed_evals_csv_is_no_traceback(tmp_path, evals):
    """Issue 51 item 10: `mtbench report` over an evals.csv with `loss=abc` ended in a ValueError's traceback; a
    cell that is no finite number is now no point of the curve."""
    job = {**fake_summary("squeezenet", 8, 0.1, [50.0]), "until": {"metric": "loss", "value": 0.5}}
    root = write_jobs(tmp_path / "sweep", [job])
    (root / "0-squeezenet-b8" / "evals.csv").write_text(evals)
    out = make_report(root)
    assert (out / "README.md").exists()
    drawn = (out / "loss_squeezenet.png").exists()
    assert drawn == ("0.4" in evals)  # the one good check is drawn; a curve with none is left out
