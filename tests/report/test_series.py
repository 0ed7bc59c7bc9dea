"""The figures' series (report/series.py): a line per model and combination of the settings that vary between its
jobs, never two points at one batch size (issue 24, "Figures as a reader expects")."""
from __future__ import annotations

import copy
import math
from typing import Any, Dict, List, Optional

from mtbench.report import make_report
from mtbench.report.series import by_series, variant_label
from mtbench.report.spread import point
from tests.report.test_boards import drawn, fake_summary, write_jobs  # noqa: F401 (drawn: a fixture)

# the part of a real summary's `config` these tests vary (`python -m mtbench model=squeezenet ...`)
CONFIG: Dict[str, Any] = {
    "data": {"_target_": "mtbench.data.synthetic.Synthetic", "image_size": 16, "root": None},
    "device": {"name": "cpu"}, "logger": {"name": "none"},
    "model": {"name": "squeezenet", "workload": {"optimizer": {"_target_": "torch.optim.SGD", "lr": 0.01}}},
    "batch": 1, "steps": 2, "warmup": 1, "seed": 0, "resume": False, "lock_dir": "/tmp",
    "power": {"nvpmodel": None, "cpu_cores": None, "sysfs_root": None},
}


def job(batch: int, step_s: float, model: str = "squeezenet", cores: Optional[int] = None,
        resume: bool = False) -> Dict[str, Any]:
    s = fake_summary(model, batch, step_s, [50.0, 50.0])
    s["config"] = copy.deepcopy(CONFIG)
    s["config"].update({"batch": batch, "resume": resume})
    s["config"]["model"]["name"] = model
    s["config"]["power"]["cpu_cores"] = cores
    return s


def series(drawn_lines: List[tuple]) -> Dict[str, List[tuple]]:
    """{legend label: [(xs, ys) of each panel]} of a figure's data lines."""
    out: Dict[str, List[tuple]] = {}
    for label, xs, ys in drawn_lines:
        if not label.startswith("_"):  # error bars' caps are unlabelled
            out.setdefault(label, []).append(([float(x) for x in xs], [float(y) for y in ys]))
    return out


def test_power_settings_are_two_series_never_a_vertical_line(tmp_path, drawn):  # noqa: F811
    """power.cpu_cores=1,2 over batch=1,2 (the resumed half of the sweep: resume=true, not a setting): one line per
    core count, each with one point per batch size. Before: one "squeezenet" line through 1, 1, 2, 2."""
    root = write_jobs(tmp_path / "sweep", [job(1, 0.10, cores=1), job(1, 0.30, cores=2, resume=True),
                                           job(2, 0.15, cores=1, resume=True), job(2, 0.40, cores=2)])
    make_report(root)
    for figure in ("step_time_throughput.png", "memory.png"):
        lines = series(drawn[figure])
        assert sorted(lines) == ["squeezenet cpu_cores=1", "squeezenet cpu_cores=2"], figure
        for label, panels in lines.items():
            for xs, _ in panels:
                assert xs == [1.0, 2.0], (figure, label, xs)  # never two points at one batch size
    step_time = {label: panels[0][1] for label, panels in series(drawn["step_time_throughput.png"]).items()}
    assert step_time == {"squeezenet cpu_cores=1": [0.10, 0.15], "squeezenet cpu_cores=2": [0.30, 0.40]}
    styles = {label: (ln.get_linestyle(), ln.get_marker()) for label, ln in _legend()}
    assert len(set(styles.values())) == 2  # the two lines look apart, not only by their labels


def _legend() -> List[tuple]:
    import matplotlib.pyplot as plt

    from mtbench.report.panels import Panel, lines_figure, metric

    jobs = [job(1, 0.10, cores=1), job(1, 0.30, cores=2)]
    for j in jobs:
        j["_dir"] = f"b1-{j['config']['power']['cpu_cores']}"
    fig, _ = lines_figure(by_series(jobs), [Panel("t", "s", metric("step_time"), "step_time_s")], [])
    lines = [(ln.get_label(), ln) for ln in fig.axes[0].get_lines()]
    plt.close(fig)
    return lines


def test_runs_of_one_config_at_one_batch_are_one_point_with_their_interval(tmp_path, drawn):  # noqa: F811
    """One config run twice (two sweeps into one folder): one point, their mean with the 95 % interval across them
    (as repeat=2's), not two points on a vertical line."""
    root = write_jobs(tmp_path / "twice", [job(2, 0.20), job(2, 0.40), job(4, 0.50)])
    make_report(root)
    lines = series(drawn["step_time_throughput.png"])
    assert list(lines) == ["squeezenet"]
    xs, ys = lines["squeezenet"][0]
    assert xs == [2.0, 4.0] and math.isclose(ys[0], 0.3) and ys[1] == 0.5
    jobs = []
    for k, s in enumerate([job(2, 0.20), job(2, 0.40)]):
        s["_dir"] = f"run-{k}"
        jobs.append(s)
    (only,) = by_series(jobs)["squeezenet"]
    p = point(only, "step_time")
    half = 12.706205 * math.sqrt(0.02) / math.sqrt(2)  # t(0.975, 1) * std / sqrt(n)
    assert p.source == "repeats" and math.isclose(p.value, 0.3)
    assert math.isclose(p.lo, 0.3 - half) and math.isclose(p.hi, 0.3 + half)
    assert only["repeats"]["n"] == 2 and only["repeats"]["folders"] == ["run-0", "run-1"]


def test_a_failed_run_of_one_config_fails_its_point():
    """As a repeat group: where one of the runs failed, the point is the failure (a red band in the memory figure)."""
    ok, failed = job(2, 0.2), job(2, 0.3)
    failed.update(success=False, failure={"kind": "oom", "message": "out of memory"})
    for k, s in enumerate((ok, failed)):
        s["_dir"] = f"run-{k}"
    (only,) = by_series([ok, failed])["squeezenet"]
    assert only["success"] is False and only["failure"]["kind"] == "oom"


def test_each_model_splits_only_on_what_varies_in_its_own_jobs():
    jobs = [job(1, 0.1, cores=1), job(1, 0.2, cores=2), job(1, 0.3, model="alexnet", cores=1),
            job(2, 0.4, model="alexnet", cores=1)]
    for k, s in enumerate(jobs):
        s["_dir"] = str(k)
    groups = by_series(jobs)
    assert sorted(groups) == ["alexnet", "squeezenet cpu_cores=1", "squeezenet cpu_cores=2"]
    assert [j["batch_size"] for j in groups["alexnet"]] == [1, 2]


def test_labels_say_what_differs():
    values = {"data._target_": "mtbench.data.cifar10.Cifar10", "data.root": "/d", "power.cpu_cores": [0, 2],
              "seed": 1, "model.lr": 0.1, "opt.lr": None, "until.accuracy": None}
    assert variant_label(sorted(values), values) == \
        "data=Cifar10 model.lr=0.1 opt.lr=null cpu_cores=[0, 2] seed=1 accuracy=null"
    old = fake_summary("squeezenet", 1, 0.1, [50.0, 50.0])  # a summary from before `config` was recorded
    new = job(1, 0.2)
    old["_dir"], new["_dir"] = "old", "new"
    assert sorted(by_series([old, new])) == ["squeezenet", "squeezenet config not recorded"]
