"""`mtbench report` on jobs that vary power.*: the time-energy Pareto front per model, or time against the setting
where energy is not measured (this machine)."""
from __future__ import annotations

import os

import pytest

from mtbench.report.build import make_report
from mtbench.report.pareto import fig_pareto, front
from tests.helpers.compose import FAKE as FAKE_JOB

FAKE = [*FAKE_JOB, "batch=1", "steps=2", "model.workload._target_=tests.fake_workloads.BusyLoop",
        "+model.workload.seconds=0.01"]


def test_the_front_keeps_only_points_no_other_beats_in_time_and_energy():
    points = [(1.0, 5.0, "a"), (2.0, 3.0, "b"), (2.5, 4.0, "c"), (3.0, 1.0, "d"), (1.0, 6.0, "e")]
    assert [p[2] for p in front(points)] == ["a", "b", "d"]


def _job(cores, time_s, energy_j):
    return {"model": "resnet50", "batch_size": 8, "success": True, "step_time_s": {"median": time_s},
            "energy_j": None if energy_j is None else {"per_step_mean": energy_j},
            "config": {"power": {"cpu_cores": cores, "nvpmodel": None, "sysfs_root": None}}}


def test_with_energy_the_front_is_drawn_and_tabled(tmp_path):
    jobs = [_job(1, 2.0, 8.0), _job(2, 1.2, 9.6), _job(4, 1.1, 12.0), _job(3, 1.5, 10.0)]
    assert fig_pareto(jobs, tmp_path) == ["pareto_resnet50.png"]
    table = (tmp_path / "pareto.md").read_text()
    assert "| resnet50 | 8 | cpu_cores=3 | 1.5000 | 1.2500 | no |" in table  # 2 cores beat it in both
    assert "| resnet50 | 8 | cpu_cores=2 | 1.2000 | 1.2000 | yes |" in table


def test_jobs_that_do_not_vary_power_get_no_pareto_figure(tmp_path):
    assert fig_pareto([_job(None, 1.0, 1.0), _job(None, 1.1, 1.0)], tmp_path) == []
    assert not (tmp_path / "pareto.md").exists()


@pytest.mark.slow
def test_a_real_cores_sweep_here_draws_time_against_the_setting(tmp_path, run):
    for n, cores in enumerate((1, 2)):
        run(FAKE + [f"power.cpu_cores={min(cores, len(os.sched_getaffinity(0)))}"], name=f"sweep/{n}")
    out = make_report(tmp_path / "sweep")
    assert (out / "pareto_squeezenet.png").stat().st_size > 0
    assert "pareto_squeezenet.png" in (out / "README.md").read_text()
    table = (out / "pareto.md").read_text()
    assert "cpu_cores=1" in table and "| n/a | n/a |" in table
