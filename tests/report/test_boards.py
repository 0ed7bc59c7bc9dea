"""`mtbench report` keyed by board (several sweep folders merged) and CPU utilization per core type (a TX2's
Denver2 and A57 cores), on summaries the tests write in the shape a real run writes (one real run checks that
shape end to end)."""
from __future__ import annotations

import copy
import csv
import json
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from mtbench.results import console
from mtbench.report import figures
from mtbench.errors import UsageError
from mtbench.report import make_report
from mtbench.job.run import run_job
from tests.conftest import compose_cfg, mtbench_cli
from tests.fake_sysfs import make_tx2
from tests.device.test_env import A57, DENVER2, TX2_NVPMODEL, TX2_RELEASE, make_jetson
from tests.sampling.test_telemetry import TX2_POWER

TX2_TYPES = ["cortex-a57", "denver2", "denver2", "cortex-a57", "cortex-a57", "cortex-a57"]
ORIN_NANO = "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super"

# the shape of a real summary.json (`python -m mtbench model=squeezenet batch=2 warmup=0 steps=1 device=cpu`),
# the config and the memory plan left out
REAL_SHAPE: Dict[str, Any] = {
    "schema": "mtbench.summary/1", "model": "squeezenet", "batch_size": 2, "device": "cpu", "data": "synthetic",
    "success": True, "failure": None, "warmup_steps": 0, "measured_steps": 1,
    "step_time_s": {"median": 0.1445, "mean": 0.1445, "min": 0.1445, "max": 0.1445, "p90": 0.1445},
    "throughput_samples_per_s": 13.84, "throughput_units_per_s": {},
    "cpu_util_pct": {"mean": 100.0, "per_core": [100.0, 100.0]}, "process_cpu_pct": 103.8,
    "gpu_util_pct": None, "power_w": None, "energy_j": None,
    "unavailable": {"gpu_util_pct": "no sensor in use gives it", "power_w": "no sensor in use gives it",
                    "energy_j": "no sensor in use gives it"},
    "mem_peak_bytes": 560836608, "mem_peak_source": "process_rss", "mem_system_peak_bytes": 2179002368,
    "mem_breakdown_bytes": None, "target": "none", "budget_bytes": None,
    "sampler": {"interval_ms": 5.0, "achieved_interval_ms": {"median": 5.0, "p99": 5.03}, "samples": 209,
                "dropped": 0, "mode": "process",
                "sensors": [{"name": "procfs", "available": True, "reason": None,
                             "fields": ["cpu0_busy_ticks", "cpu0_total_ticks", "cpu1_busy_ticks", "cpu1_total_ticks",
                                        "proc_cpu_ticks", "proc_rss_bytes", "sys_mem_used_bytes"]}]},
    "env": {"versions": {"mtbench": "0.1.0", "python": "3.11.7", "torch": "2.14.1+cu130"}, "host": "vm",
            "platform": "Linux-6.18.44-x86_64", "machine": "x86_64", "device_name": "AMD EPYC",
            "cpu_model": "AMD EPYC", "cpu_count": 2, "torch_threads": 2, "jetson": None},
    "profiled": False,
}


def fake_summary(model: str, batch: int, step_s: float, per_core: List[Optional[float]],
                 cores: Optional[List[int]] = None, jetson: Optional[Dict[str, Any]] = None, host: str = "vm",
                 device: str = "cpu", device_name: str = "AMD EPYC", success: bool = True) -> Dict[str, Any]:
    """REAL_SHAPE for one job; `cores`: the CPU number of each per_core entry (the procfs sensor's fields)."""
    s = copy.deepcopy(REAL_SHAPE)
    cores = list(range(len(per_core))) if cores is None else cores
    s.update({"model": model, "batch_size": batch, "device": device, "success": success,
              "failure": None if success else {"kind": "oom", "message": "CUDA out of memory"}})
    s["step_time_s"] = {k: step_s for k in ("median", "mean", "min", "max", "p90")}
    s["throughput_samples_per_s"] = batch / step_s
    known = [c for c in per_core if c is not None]
    s["cpu_util_pct"] = {"mean": sum(known) / len(known) if known else None, "per_core": per_core}
    s["sampler"]["sensors"][0]["fields"] = [f"cpu{c}_{k}_ticks" for c in cores for k in ("busy", "total")] + [
        "proc_cpu_ticks", "proc_rss_bytes", "sys_mem_used_bytes"]
    s["env"].update({"host": host, "device_name": device_name, "jetson": jetson, "cpu_count": len(per_core)})
    return s


def tx2_env(online: Optional[List[bool]] = None, mode: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """env.jetson of a TX2 as env.jetson() writes it (a core offline: type None, online False)."""
    online = online or [True] * 6
    return {"board": "quill", "l4t": "32.7.1", "power_mode": mode or {"id": 0, "name": "MAXN"},
            "gpu_freq_hz": {"cur": 1300500000, "max": 1300500000}, "emc_freq_hz": None,
            "cpu_cores": [{"cpu": i, "type": t if on else None, "online": on, "cur_freq_hz": 2035200000 if on else None,
                           "max_freq_hz": 2035200000 if on else None}
                          for i, (t, on) in enumerate(zip(TX2_TYPES, online))]}


def orin_env() -> Dict[str, Any]:
    return {"board": ORIN_NANO, "l4t": "36.4.3", "power_mode": {"id": 2, "name": "MAXN_SUPER"}, "gpu_freq_hz": None,
            "emc_freq_hz": None, "cpu_cores": [{"cpu": i, "type": "cortex-a78ae", "online": True, "cur_freq_hz": None,
                                                "max_freq_hz": None} for i in range(6)]}


def write_jobs(root: Path, jobs: List[Dict[str, Any]]) -> Path:
    for i, s in enumerate(jobs):
        d = root / f"{i}-{s['model']}-b{s['batch_size']}"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps(s))
    return root


# ---- CPU utilization per core type ------------------------------------------------------------------------


def test_tx2_core_types_grouped_as_the_paper_reports_them():
    s = fake_summary("resnet50", 4, 0.5, [20.0, 60.0, 66.0, 22.0, 21.0, 21.0], jetson=tx2_env())
    groups = console.cpu_by_core_type(s)
    assert [(g["name"], g["cores"]) for g in groups] == [("A57", [0, 3, 4, 5]), ("Denver2", [1, 2])]
    assert groups[0]["pct"] == pytest.approx(21.0) and groups[1]["pct"] == pytest.approx(63.0)
    assert console.core_types_line(groups) == "A57 (cores 0,3-5) 21 %, Denver2 (cores 1-2) 63 %"


def test_denver_cores_off_map_figures_by_core_number_not_by_index():
    # power mode 3: cpu1-2 offline, so /proc/stat (and per_core) has cpu0, cpu3, cpu4, cpu5 only
    s = fake_summary("resnet50", 4, 0.5, [10.0, 30.0, 30.0, 30.0], cores=[0, 3, 4, 5],
                     jetson=tx2_env(online=[True, False, False, True, True, True],
                                    mode={"id": 3, "name": "MAXP_CORE_ARM"}))
    groups = console.cpu_by_core_type(s)
    assert groups[0]["pct"] == pytest.approx(25.0)  # all four A57 figures, none taken for a Denver2 core
    assert console.core_types_line(groups) == "A57 (cores 0,3-5) 25 %, offline (cores 1-2)"


def test_no_core_types_no_grouping():
    assert console.cpu_by_core_type(fake_summary("resnet50", 4, 0.5, [50.0, 50.0])) is None
    # a Jetson env whose per_core cannot be placed (no sensor fields, counts differ): types with n/a, not guesses
    s = fake_summary("resnet50", 4, 0.5, [50.0, 50.0], jetson=tx2_env())
    s["sampler"]["sensors"] = []
    assert [g["pct"] for g in console.cpu_by_core_type(s)] == [None, None]


def test_console_shows_the_core_types(capsys):
    console.print_summary(fake_summary("resnet50", 4, 0.5, [20.0, 60.0, 66.0, 22.0, 21.0, 21.0], jetson=tx2_env()),
                          "out")
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("CPU util"))
    assert "A57 (cores 0,3-5) 21 %, Denver2 (cores 1-2) 63 %" in line and "per core [20 60 66 22 21 21]" in line
    console.print_summary(fake_summary("resnet50", 4, 0.5, [40.0, 60.0]), "out")
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("CPU util"))
    assert "cores" not in line and "per core [40 60]" in line  # not a Jetson: as before


@pytest.fixture
def drawn(monkeypatch):
    """{figure file: [(label, xs, ys), ...] of every line in it}, taken as each figure is saved."""
    lines: Dict[str, List[tuple]] = {}
    real = figures._save

    def save(fig, path):
        lines[path.name] = [(ln.get_label(), list(ln.get_xdata()), list(ln.get_ydata()))
                            for ax in fig.axes for ln in ax.get_lines()]
        lines[path.name + " bands"] = [len(ax.collections) for ax in fig.axes]
        return real(fig, path)

    monkeypatch.setattr(figures, "_save", save)
    return lines


def first_panel(drawn: Dict[str, List[tuple]], name: str) -> Dict[str, tuple]:
    """{label: (xs, ys)} of the lines in a figure, the first panel's where two panels have one label."""
    out: Dict[str, tuple] = {}
    for label, xs, ys in drawn[name]:
        out.setdefault(label, ([float(x) for x in xs], [float(y) for y in ys]))
    return out


def test_report_table_csv_and_figure_per_core_type(tmp_path, drawn):
    jobs = [fake_summary("resnet50", b, 0.1 * b, [20.0 + b, 60.0 + b, 66.0 + b, 22.0, 21.0, 21.0], jetson=tx2_env())
            for b in (2, 4)]
    out = make_report(write_jobs(tmp_path / "tx2", jobs))
    text = (out / "README.md").read_text()
    assert "| CPU % by core type |" in text and "A57 (cores 0,3-5) 22 %, Denver2 (cores 1-2) 67 %" in text
    with open(out / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["cpu_util_pct.by_type.denver2"]) for r in rows] == [65.0, 67.0]
    assert [float(r["cpu_util_pct.by_type.cortex-a57"]) for r in rows] == [21.5, 22.0]
    series = {label: ys for label, (xs, ys) in first_panel(drawn, "utilization.png").items()}
    assert series["resnet50: Denver2 (cores 1-2)"] == [65.0, 67.0]
    assert series["resnet50: A57 (cores 0,3-5)"] == [21.5, 22.0]
    # the per-type lines instead of the undifferentiated band; no GPU here: no GPU panel (listed as not measured)
    assert drawn["utilization.png bands"] == [0]


def test_report_without_core_types_stays_as_before(tmp_path, drawn):
    jobs = [fake_summary("resnet50", b, 0.1 * b, [40.0, 60.0]) for b in (2, 4)]
    out = make_report(write_jobs(tmp_path / "x86", jobs))
    assert "core type" not in (out / "README.md").read_text()
    # the CPU mean and the per-core band around it, as before (no GPU here: no panel, listed as not measured)
    assert [label for label, _, _ in drawn["utilization.png"]] == ["resnet50"]
    assert drawn["utilization.png bands"] == [1]
    with open(out / "summary.csv") as f:
        assert not any(k.startswith("cpu_util_pct.by_type") for k in next(csv.DictReader(f)))


@pytest.mark.slow
def test_real_run_with_a_fake_tx2_tree_groups_its_cores(tmp_path):
    """A real job with env read from a fake TX2 tree: its summary's per_core (this machine's cores, cpu0 and
    cpu1 by the procfs sensor's fields) lands in the TX2's A57 (cpu0) and Denver2 (cpu1) groups."""
    root = tmp_path / "tx2"
    make_tx2(root, TX2_POWER)
    make_jetson(root, "quill", TX2_RELEASE, [A57, DENVER2, DENVER2, A57, A57, A57], "17000000.gp10b", 2035200,
                nvpmodel=("pmode:0000\n", TX2_NVPMODEL))
    summary = run_job(compose_cfg(["model=squeezenet", "batch=2", "sampler=jetson", f"sampler.sysfs_root={root}"]),
                      tmp_path / "sweep" / "0-squeezenet-b2")
    per_core = summary["cpu_util_pct"]["per_core"]
    groups = {g["name"]: g for g in console.cpu_by_core_type(summary)}
    assert groups["A57"]["cores"] == [0, 3, 4, 5] and groups["Denver2"]["cores"] == [1, 2]
    assert groups["A57"]["pct"] == pytest.approx(per_core[0])
    if len(per_core) > 1:
        assert groups["Denver2"]["pct"] == pytest.approx(sum(per_core[1:3]) / len(per_core[1:3]))
    out = make_report(tmp_path / "sweep")
    assert "| quill |" in (out / "README.md").read_text()


# ---- several boards ---------------------------------------------------------------------------------------


def killed_before_env(model: str, batch: int, host: str) -> Dict[str, Any]:
    """The summary the sweep's parent writes for a job killed before it read its env: env.host() only."""
    s = fake_summary(model, batch, 1.0, [], host=host, success=False)
    s.update({"step_time_s": None, "throughput_samples_per_s": None, "cpu_util_pct": None, "mem_peak_bytes": None,
              "failure": {"kind": "killed", "message": "the job's process was killed by signal 9 (SIGKILL)"}})
    s["env"] = {"versions": {"mtbench": "0.1.0", "python": "3.8.10"}, "host": host, "platform": "Linux-aarch64",
                "machine": "aarch64", "device_name": "ARMv8 Processor rev 3 (v8l)",
                "cpu_model": "ARMv8 Processor rev 3 (v8l)", "cpu_count": 6}
    return s


@pytest.fixture
def fleet(tmp_path):
    """Two sweeps, one per board, with resnet50 at batch 2 and 4 on both, and on the TX2 only an OOM and a job
    killed before it read its env."""
    tx2 = write_jobs(tmp_path / "sweeps" / "tx2", [
        fake_summary("resnet50", 2, 0.40, [20.0, 60.0, 66.0, 22.0, 21.0, 21.0], jetson=tx2_env(), host="tx2-a"),
        fake_summary("resnet50", 4, 0.70, [20.0, 60.0, 66.0, 22.0, 21.0, 21.0], jetson=tx2_env(), host="tx2-a"),
        fake_summary("resnet50", 64, 1.0, [None] * 6, jetson=tx2_env(), host="tx2-a", success=False),
        killed_before_env("resnet50", 128, host="tx2-a")])
    orin = write_jobs(tmp_path / "sweeps" / "orin", [
        fake_summary("resnet50", 2, 0.10, [30.0] * 6, jetson=orin_env(), host="orin-1"),
        fake_summary("resnet50", 4, 0.15, [35.0] * 6, jetson=orin_env(), host="orin-1")])
    return tx2, orin


def test_two_boards_merged_one_row_and_one_series_each(fleet, drawn):
    tx2, orin = fleet
    out = make_report([tx2, orin])
    assert out == tx2.parent / "report"  # several folders: their common parent
    with open(out / "summary.csv") as f:
        rows = {r["job"]: r for r in csv.DictReader(f)}
    assert len(rows) == 6
    assert rows["tx2/3-resnet50-b128"]["board"] == "quill"  # its host's board, not its CPU's model
    assert rows["tx2/1-resnet50-b4"]["board"] == "quill" and rows["orin/1-resnet50-b4"]["board"] == ORIN_NANO
    assert float(rows["tx2/1-resnet50-b4"]["step_time_s.median"]) == 0.70  # never a mean of the two boards
    assert float(rows["orin/1-resnet50-b4"]["step_time_s.median"]) == 0.15
    text = (out / "README.md").read_text()
    assert "| tx2/1-resnet50-b4 | resnet50 | 4 | cpu | quill |" in text
    assert f"| orin/1-resnet50-b4 | resnet50 | 4 | cpu | {ORIN_NANO} |" in text
    assert "| quill | 4 | env.jetson.board, env.jetson.board of the host's other jobs | 32.7.1 | MAXN (0) |" in text
    series = first_panel(drawn, "step_time_throughput.png")
    assert series["resnet50 @ quill"] == ([2, 4], [0.40, 0.70])
    assert series[f"resnet50 @ {ORIN_NANO}"] == ([2, 4], [0.10, 0.15])
    assert len(series) == 2
    cpu = first_panel(drawn, "utilization.png")
    assert "resnet50 @ quill: Denver2 (cores 1-2)" in cpu
    assert not any("A78AE" in label for label in cpu)  # the Orin's one core type: its mean, not a second line
    memory = [label for label, _, _ in drawn["memory.png"]]
    assert "resnet50 @ quill" in memory and f"resnet50 @ {ORIN_NANO}" in memory


def test_one_board_keeps_one_series_per_model(fleet, drawn):
    tx2, _ = fleet
    make_report(tx2)
    assert sorted(label for label, _, _ in drawn["step_time_throughput.png"]) == ["resnet50", "resnet50"]


def test_one_sweep_across_boards_and_kinds_of_board(tmp_path, drawn):
    """One sweep whose jobs ran on several machines (Ray/SLURM): a CUDA GPU by its name, a CPU by its model, and
    two Orin Nanos that both ran batch 4 apart by host; the Orin Nano that alone ran a batch keeps the board name."""
    root = write_jobs(tmp_path / "multirun", [
        fake_summary("vgg16", 4, 0.05, [10.0], device="cuda:0", device_name="NVIDIA H200", host="gpu-node"),
        fake_summary("vgg16", 4, 2.00, [90.0, 90.0], host="cpu-node", device_name="Intel Xeon"),
        fake_summary("vgg16", 4, 0.30, [30.0] * 6, jetson=orin_env(), host="orin-1"),
        fake_summary("vgg16", 4, 0.31, [30.0] * 6, jetson=orin_env(), host="orin-2")])
    # the CPU node's model
    s = json.loads((root / "1-vgg16-b4" / "summary.json").read_text())
    s["env"]["cpu_model"] = "Intel Xeon"
    (root / "1-vgg16-b4" / "summary.json").write_text(json.dumps(s))
    out = make_report(root)
    with open(out / "summary.csv") as f:
        boards = [r["board"] for r in csv.DictReader(f)]
    assert boards == ["NVIDIA H200", "Intel Xeon", f"{ORIN_NANO} @ orin-1", f"{ORIN_NANO} @ orin-2"]
    series = {label: ys for label, (xs, ys) in first_panel(drawn, "step_time_throughput.png").items()}
    assert series[f"vgg16 @ {ORIN_NANO} @ orin-1"][0] == 0.30 and series[f"vgg16 @ {ORIN_NANO} @ orin-2"][0] == 0.31
    assert series["vgg16 @ NVIDIA H200"][0] == 0.05
    text = (out / "README.md").read_text()
    assert "| NVIDIA H200 | 1 | GPU name (env.device_name) |" in text
    assert "| Intel Xeon | 1 | CPU model (env.cpu_model) |" in text


def test_two_hosts_apart_even_where_one_host_swept_another_knob(tmp_path, drawn):
    """orin-1 ran vgg16 b4 twice (e.g. two memory plans), orin-2 once: the hosts are two series, the knob's
    two jobs stay in orin-1's."""
    root = write_jobs(tmp_path / "multirun", [
        fake_summary("vgg16", 4, 0.30, [30.0] * 6, jetson=orin_env(), host="orin-1"),
        fake_summary("vgg16", 4, 0.40, [30.0] * 6, jetson=orin_env(), host="orin-1"),
        fake_summary("vgg16", 4, 0.31, [30.0] * 6, jetson=orin_env(), host="orin-2")])
    out = make_report(root)
    with open(out / "summary.csv") as f:
        assert [r["board"] for r in csv.DictReader(f)] == [f"{ORIN_NANO} @ orin-{k}" for k in (1, 1, 2)]


def test_same_board_and_host_in_two_folders_stay_two_series(tmp_path, drawn):
    a = write_jobs(tmp_path / "monday", [fake_summary("alexnet", 2, 0.2, [50.0, 50.0])])
    b = write_jobs(tmp_path / "tuesday", [fake_summary("alexnet", 2, 0.3, [50.0, 50.0])])
    make_report([a, b], out=tmp_path / "both")
    series = {label: ys for label, (xs, ys) in first_panel(drawn, "step_time_throughput.png").items()}
    assert series["alexnet @ AMD EPYC @ vm [monday]"] == [0.2] and series["alexnet @ AMD EPYC @ vm [tuesday]"] == [0.3]


def test_folder_labels_tell_same_named_folders_apart(tmp_path):
    a = write_jobs(tmp_path / "tx2" / "12-00-00", [fake_summary("alexnet", 2, 0.2, [50.0, 50.0], host="a")])
    b = write_jobs(tmp_path / "orin" / "12-00-00", [fake_summary("alexnet", 2, 0.3, [50.0, 50.0], host="b")])
    out = make_report([a, b])
    with open(out / "summary.csv") as f:
        assert [r["job"] for r in csv.DictReader(f)] == ["tx2/12-00-00/0-alexnet-b2", "orin/12-00-00/0-alexnet-b2"]
    with pytest.raises(UsageError, match="given twice"):
        make_report([a, a])


@pytest.mark.slow
def test_report_cli_several_folders(fleet, tmp_path):
    tx2, orin = fleet
    proc = mtbench_cli("report", str(tx2), str(orin), "--out", str(tmp_path / "merged"))
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "merged" / "summary.csv") as f:
        assert len(list(csv.DictReader(f))) == 6
    for args, says in ([str(tx2), "--bogus"], "unknown option '--bogus'"), ([str(tx2), "--out"], "--out needs"), \
            ([str(tx2), str(tmp_path / "nowhere")], "is not a directory"):
        bad = mtbench_cli("report", *args)
        assert bad.returncode == 2 and bad.stderr.startswith("mtbench: error: report:") and says in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1
    assert "DIR [DIR ...]" in mtbench_cli("report", "--help").stdout


def test_report_side_files_carry_hostile_text_as_text(tmp_path):
    """Issue 51 item 13: summary.csv passed =1+1 and =HYPERLINK(...) through to a spreadsheet; README.md carried raw
    <img onerror=...> from a folder name, newlines that broke its table and ESC bytes. Now a formula is a quoted
    text, HTML is escaped, control bytes are shown as \\xNN."""
    import csv

    from mtbench.report.build import make_report

    hyperlink = '=HYPERLINK("x.example"&A1,"click")'
    failed = fake_summary("=1+1", 2, 0.5, [50.0, 50.0], success=False)
    failed["failure"] = {"kind": "error", "message": "boom\x1b[2J\nsecond line | cell"}
    root = write_jobs(tmp_path / "runs", [fake_summary(hyperlink, 2, 0.5, [50.0, 50.0]), failed])
    evil = root / "<img src=x onerror=alert(1)>\x1b[31m"
    (root / sorted(p.name for p in root.iterdir())[0]).rename(evil)
    out = make_report(root)
    with open(out / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    cells = [v for r in rows for v in r.values() if v]
    assert "'=1+1" in cells and "'" + hyperlink in cells
    assert not any(c.startswith(("=", "+", "@")) for c in cells)
    assert not any("\x1b" in c for c in cells)
    text = (out / "README.md").read_text()
    assert "<img" not in text and "&lt;img src=x onerror=alert(1)>\\x1b[31m" in text
    assert "\x1b" not in text and "boom\\x1b[2J\\x0asecond line \\| cell" in text
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(table) == 3 + 2  # jobs: the header and a row each, none broken across lines; boards: header, one
