"""benchmarks/predict_accuracy.py refuses a model name conf/model does not have before it runs or reads a sweep
(a misspelt --held-out model would otherwise be calibrated on and its accuracy reported as held out)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.parametrize("flags, named", [
    (["--models", "alexnet,inceptionv3"], "--models: unknown model 'inceptionv3'"),
    (["--models", "alexnet,resnet101", "--held-out", "resnet10"], "--held-out: unknown model 'resnet10'"),
])
def test_unknown_model_is_one_line_and_no_sweep(tmp_path, flags, named):
    sweep = tmp_path / "sweep"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "predict_accuracy.py"), "--sweep", str(sweep),
                           "--no-speed", *flags], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(named), done.stderr
    assert "resnet101" in lines[0]  # the allowed names are listed
    assert "Traceback" not in done.stderr + done.stdout
    assert not sweep.exists()  # nothing was run


def test_each_jobs_machine_reference_is_told_against_the_sweeps_median():
    from benchmarks.predict_accuracy import machine_drift

    def run(model, batch, before, after):
        return {"model": model, "batch_size": batch, "bench_machine_reference": {
            "before": {"compute_s": before, "stream_s": 0.030}, "after": {"compute_s": after, "stream_s": 0.030}}}

    runs = [run("a", 2, 0.040, 0.040), run("a", 8, 0.050, 0.050), run("b", 2, 0.060, 0.040), {"model": "old",
                                                                                              "batch_size": 2}]
    drift, line = machine_drift(runs)
    assert drift == {("a", 2): (pytest.approx(-20.0), 0.0), ("a", 8): (0.0, 0.0), ("b", 2): (0.0, 0.0)}
    assert "40.00-50.00 ms over the sweep's 3 jobs (spread 20 % of the median)" in line, line
    assert "after against before a job: median 0 %" in line, line  # a's are steady; b's moved 33 %
    assert machine_drift(runs[3:])[0] == {} and "not in this sweep's summaries" in machine_drift(runs[3:])[1]
