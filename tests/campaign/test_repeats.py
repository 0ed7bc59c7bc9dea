"""repeat=N (issue 24): N runs of a job, each in its own process and folder, and the group's summary with mean, std
and a Student's t 95 % interval across them; and `noise`: a job whose steps vary or whose machine was busy says so."""
from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from mtbench.campaign import repeats
from mtbench.commands.cli import main
from mtbench.results import console, files, noise
from mtbench.workload.base import StepLoss
from tests.conftest import mtbench_cli
from tests.fake_workloads import _Base
from tests.report.test_boards import REAL_SHAPE


class Uneven(_Base):
    """Steps that sleep by turns for each of `seconds`: a job whose step times vary by design."""

    def __init__(self, seconds: List[float] = (0.01, 0.04)) -> None:
        self.seconds = list(seconds)
        self.count = 0

    def step(self) -> StepLoss:
        time.sleep(self.seconds[self.count % len(self.seconds)])
        self.count += 1
        return None


# ---------------------------------------------------------------------------------------------------------
# the statistics

def test_t_quantiles_match_scipys():
    stats = pytest.importorskip("scipy.stats", reason="scipy gives the exact quantiles to compare with")
    for df in list(range(1, 61)) + [100, 1000, 10_000]:
        assert repeats.t975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=2e-6), df


def test_spread_of_three_runs():
    got = repeats.spread([1.0, 2.0, 3.0])
    half = 4.302653 / math.sqrt(3)  # t(0.975, 2) * std / sqrt(n), std = 1
    assert got["mean"] == 2.0 and got["std"] == 1.0 and got["values"] == [1.0, 2.0, 3.0] and got["reason"] is None
    assert got["ci95"] == pytest.approx([2.0 - half, 2.0 + half])


@pytest.mark.parametrize("values, reason", [([0.5], "one repeat: a spread needs at least 2"),
                                            ([0.5, None], "a repeat has no value of this figure"),
                                            ([], "no repeat finished")])
def test_no_spread_is_null_with_the_reason(values, reason):
    got = repeats.spread(values)
    assert got["std"] is None and got["ci95"] is None and got["reason"] == reason
    assert got["mean"] == (0.5 if values == [0.5] else None)


def _summary(median: float, success: bool = True, energy: float = None) -> Dict[str, Any]:
    s = copy.deepcopy(REAL_SHAPE)
    s["step_time_s"] = {k: median for k in ("median", "mean", "min", "max", "p90")}
    s["throughput_samples_per_s"] = s["batch_size"] / median
    s["energy_j"] = None if energy is None else {"per_step_mean": energy, "total": energy, "by_rail": {}}
    s["success"], s["failure"] = success, None if success else {"kind": "oom", "message": "out of memory"}
    return s


def test_the_groups_summary_is_the_median_repeats_plus_the_spreads():
    runs = [_summary(0.3, energy=3.0), _summary(0.1, energy=1.0), _summary(0.2, energy=2.0)]
    group = repeats.group_summary(runs, ["repeat-1", "repeat-2", "repeat-3"])
    assert group["step_time_s"]["median"] == 0.2 and group["repeats"]["summary_of"] == "repeat-3"
    r = group["repeats"]
    assert (r["n"], r["succeeded"], r["folders"]) == (3, 3, ["repeat-1", "repeat-2", "repeat-3"])
    assert r["step_time_s"]["values"] == [0.3, 0.1, 0.2] and r["step_time_s"]["mean"] == pytest.approx(0.2)
    assert r["throughput"]["values"] == [2 / 0.3, 2 / 0.1, 2 / 0.2]
    assert r["energy_per_sample_j"]["values"] == [1.5, 0.5, 1.0]  # per step / batch 2
    lo, hi = r["step_time_s"]["ci95"]
    assert lo < 0.2 < hi


def test_a_group_with_a_failed_repeat_is_that_failure_and_energy_without_a_sensor_is_null():
    runs = [_summary(0.1), _summary(0.2, success=False), _summary(0.3)]
    group = repeats.group_summary(runs, ["repeat-1", "repeat-2", "repeat-3"])
    assert group["success"] is False and group["repeats"]["summary_of"] == "repeat-2"
    assert group["repeats"]["succeeded"] == 2 and group["repeats"]["step_time_s"]["values"] == [0.1, 0.3]
    assert group["repeats"]["energy_per_sample_j"]["reason"] == "a repeat has no value of this figure"


def test_ctrl_c_in_a_repeat_leaves_the_groups_summary_of_the_repeats_so_far(tmp_path):
    from tests.conftest import compose_cfg

    cfg = compose_cfg(["model=squeezenet", "batch=1", "repeat=3"])

    def fake_run(cfg, folder: Path):  # as run_isolated: the interrupted job writes its summary, then it raises
        if folder.name == "repeat-2":
            files.write_summary(folder, {**_summary(0.2, success=False),
                                         "failure": {"kind": "interrupted", "message": "Ctrl-C"}})
            raise KeyboardInterrupt
        files.write_summary(folder, _summary(0.1))
        return _summary(0.1)

    lines: List[str] = []
    with pytest.raises(KeyboardInterrupt):
        repeats.run_repeats(cfg, tmp_path, run=fake_run, say=lines.append)
    group = json.loads((tmp_path / "summary.json").read_text())
    assert group["failure"]["kind"] == "interrupted" and group["repeats"]["folders"] == ["repeat-1", "repeat-2"]
    assert lines == [f"    repeat 1 of 3: {tmp_path / 'repeat-1'}", f"    repeat 2 of 3: {tmp_path / 'repeat-2'}"]
    assert not (tmp_path / "repeat-3").exists()


@pytest.mark.parametrize("value, message", [
    ("0", "repeat=0 is out of range; allowed: a whole number >= 1"),
    ("101", "repeat=101 is out of range; allowed: a whole number from 1 to 100"),
    ("two", "repeat='two' is not a whole number; allowed: a whole number >= 1")])
def test_a_bad_repeat_is_one_line_and_exit_2(capsys, value, message):
    with pytest.raises(SystemExit) as info:
        main([f"repeat={value}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and err == [f"mtbench: error: {message}"]


@pytest.mark.slow
def test_repeat_runs_each_in_its_own_process_and_folder(tmp_path):
    out = tmp_path / "job"
    proc = mtbench_cli("model=squeezenet", "batch=1", "device=cpu", "warmup=0", "steps=2", "repeat=2",
                       f"hydra.run.dir={out}", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = [json.loads((out / f"repeat-{k}" / "summary.json").read_text()) for k in (1, 2)]
    group = json.loads((out / "summary.json").read_text())
    medians = [r["step_time_s"]["median"] for r in runs]
    assert group["repeats"]["folders"] == ["repeat-1", "repeat-2"] and group["repeats"]["n"] == 2
    assert group["repeats"]["step_time_s"]["values"] == medians
    assert group["step_time_s"]["median"] == min(medians)  # the lower middle of two
    assert group["repeats"]["step_time_s"]["ci95"] is not None
    assert runs[0]["finished_at"] <= runs[1]["started_at"]  # one after the other
    assert group["started_at"] == runs[0]["started_at"] and group["finished_at"] == runs[1]["finished_at"]
    assert "repeat 1 of 2" in proc.stdout and "repeat 2 of 2" in proc.stdout and "2 runs, 2 succeeded" in proc.stdout


# ---------------------------------------------------------------------------------------------------------
# noise

def test_step_cv_is_the_sample_coefficient_of_variation():
    assert noise.step_cv([1.0, 1.0, 1.0, 1.5]) == pytest.approx(0.25 / 1.125)  # std 0.25 (n-1), mean 1.125
    assert noise.step_cv([0.2]) is None and noise.step_cv([]) is None


def _figures(cpu_mean, per_core, job_pct, mode="process", sampler_pct=4.0):
    return {"cpu_util_pct": {"mean": cpu_mean, "per_core": per_core}, "process_cpu_pct": job_pct,
            "sampler": {"mode": mode, "cpu_pct_of_one_core": sampler_pct}}


def test_other_busy_processes_are_the_machines_busy_cpu_less_the_jobs_and_the_samplers():
    # 4 cores 60 % busy = 240 % of one core; the job 100 %, the sampling process 4 %: others 136 % = 34 % of 4 cores
    verdict, missing = noise.assess(_figures(60.0, [60.0] * 4, 100.0), [1.0, 1.0, 1.0])
    assert verdict["busy_other_pct"] == pytest.approx(34.0) and verdict["noisy"] and verdict["step_cv"] == 0.0
    assert verdict["reasons"] == ["other processes kept 34 % of the machine's CPU busy during the measured steps "
                                  "(> 10 %)"] and missing == {}
    # sampler.mode=thread: the sampler is a thread of the job's process, inside its 100 %
    thread, _ = noise.assess(_figures(27.0, [27.0] * 4, 100.0, mode="thread"), [1.0, 1.0])
    assert thread["busy_other_pct"] == pytest.approx(2.0) and not thread["noisy"] and thread["reasons"] == []


def test_noise_without_cpu_figures_is_null_with_the_reason():
    verdict, missing = noise.assess({"cpu_util_pct": None, "process_cpu_pct": None}, [0.1])
    assert verdict == {"noisy": False, "step_cv": None, "reasons": [], "busy_other_pct": None}
    assert missing == {"noise.step_cv": "fewer than 2 measured steps", "noise.busy_other_pct":
                       "no per-core CPU figures over the measured steps (the procfs sensor gives them)"}


def test_a_job_whose_steps_vary_says_so_in_its_summary(run):
    summary = run(["model=squeezenet", "~model.workload.net", "~model.workload.optimizer",
                   "~model.workload.input_shape", "~model.workload.num_classes", "steps=4",
                   "model.workload._target_=tests.campaign.test_repeats.Uneven"])
    verdict = summary["noise"]
    assert verdict["step_cv"] > 0.5 and verdict["noisy"]  # 10 ms and 40 ms by turns: cv ~0.6
    assert verdict["reasons"][0].startswith("the measured steps' times vary: coefficient of variation")
    assert isinstance(verdict["busy_other_pct"], float)  # the procfs sensor's figures give it


def test_the_console_says_a_noisy_job_in_one_line(capsys):
    summary = copy.deepcopy(REAL_SHAPE)
    summary["noise"] = {"noisy": True, "step_cv": 0.23, "busy_other_pct": 3.0,
                        "reasons": ["the measured steps' times vary: coefficient of variation 23 % > 10 %"]}
    console.print_summary(summary, "out")
    lines = [line for line in capsys.readouterr().out.splitlines() if "NOISY" in line]
    assert len(lines) == 1 and "coefficient of variation 23 % > 10 %" in lines[0]
    summary["noise"]["noisy"] = False
    console.print_summary(summary, "out")
    assert "NOISY" not in capsys.readouterr().out
