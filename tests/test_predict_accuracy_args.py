"""benchmarks/predict_accuracy.py refuses a model name conf/model does not have before it runs or reads a sweep
(a misspelt --held-out model would otherwise be calibrated on and its accuracy reported as held out)."""
from __future__ import annotations

import os
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


@pytest.mark.skipif(not os.path.isfile("/usr/bin/time"), reason="GNU time (/usr/bin/time) is not installed")
def test_the_command_as_typed_is_told_with_the_machines_reference_beside_it(monkeypatch, capsys):
    import benchmarks.predict_accuracy as pa

    real_popen = subprocess.Popen
    ran = []

    def quick(args, **kwargs):  # GNU time as the benchmark starts it, around a command that ends at once
        ran.append(args)
        return real_popen([*args[:3], sys.executable, "-c", "pass"], **kwargs)

    monkeypatch.setattr(pa.subprocess, "Popen", quick)
    monkeypatch.setattr(pa, "machine_reference", lambda: {"compute_s": 0.045, "stream_s": 0.020})
    pa.command_as_typed(runs=1, sweep_compute_s=0.030)
    pa.command_as_typed(runs=1)
    first, second = capsys.readouterr().out.strip().splitlines()
    assert [a[:3] for a in ran] == [["/usr/bin/time", "-f", "%e %M"]] * 2
    assert ran[0][3:] == [sys.executable, "-m", "mtbench", "predict", "model=bert", "batch=64", "target=tx2"]
    assert first.endswith("the machine's reference just before: a small convolution's step 45.00 ms, +50 % against "
                          "the sweep's median"), first
    assert second.endswith("a small convolution's step 45.00 ms"), second


def test_a_jobs_step_time_is_its_fastest_passes_and_the_rest_the_first_passes():
    from benchmarks.predict_accuracy import fastest_pass
    from mtbench.predict.profiled import step_seconds

    def plain(batch, median, ref=None):
        return {"model": "a", "batch_size": batch, "mem_training_bytes": 100 + batch,
                "step_time_s": {"median": median, "min": median / 2, "max": median * 2},
                "bench_machine_reference": ref}

    def profiled(median, unprofiled):
        return {"model": "p", "batch_size": 2, "profiled": True, "step_time_s": {"median": median},
                "profile": {"unprofiled_step_time_s": {"median": unprofiled}}}

    first = [plain(2, 1.0, "one"), plain(8, 3.0, "one"), profiled(5.0, 2.0)]
    second = [plain(2, 1.5, "two"), plain(8, 2.0, "two"), profiled(4.0, 1.0)]
    merged = fastest_pass([first, second], "median")
    assert [s["bench_pass"] for s in merged] == [1, 2, 2]
    assert merged[0] == {**first[0], "bench_pass": 1}
    # a plain job's step statistics and machine reference come whole from the faster pass, its memory from the first
    assert merged[1]["step_time_s"] == second[1]["step_time_s"] and merged[1]["bench_machine_reference"] == "two"
    assert merged[1]["mem_training_bytes"] == 108
    # a profiled job keeps its profiled step time (its per-class times are scaled by it) and takes the faster plain one
    assert merged[2]["step_time_s"] == {"median": 5.0} and step_seconds(merged[2], "median") == 1.0
    assert first[2]["profile"]["unprofiled_step_time_s"]["median"] == 2.0  # the passes' summaries are not changed
    # one pass's alone, slower or not; pass 1's is the first pass as it was
    assert [step_seconds(s, "median") for s in fastest_pass([first, second], "median", only=2)] == [1.5, 2.0, 1.0]
    assert [step_seconds(s, "median") for s in fastest_pass([first, second], "median", only=1)] == [1.0, 3.0, 2.0]
    # by the statistic asked for: "min" of pass 2's first job (0.75) is above pass 1's (0.5)
    assert fastest_pass([first, second], "min")[0]["bench_pass"] == 1


def test_sigterm_stops_the_sweep_and_the_job_it_runs(tmp_path):
    """`timeout` or `kill` sends the benchmark SIGTERM: the job running in its child ends with it (it was left
    running on its own, beside whatever was measured next)."""
    import signal
    import time

    import psutil

    sweep = tmp_path / "sweep"
    bench = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "predict_accuracy.py"), "--sweep", str(sweep),
                              "--models", "squeezenet", "--held-out", "", "--batches", "2", "--steps", "2000",
                              "--no-speed"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             cwd=tmp_path)
    try:
        deadline, jobs = time.monotonic() + 120, []
        while not jobs and time.monotonic() < deadline and bench.poll() is None:
            jobs = [p for p in psutil.Process(bench.pid).children() if str(sweep) in " ".join(p.cmdline())]
            time.sleep(0.1)
        assert jobs, f"no job started: {bench.poll()} {bench.stderr.read() if bench.poll() is not None else ''}"
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) != 0
        gone, alive = psutil.wait_procs(jobs, timeout=20)
        assert not alive, [p.cmdline() for p in alive]  # 2,000 steps would have run on for a minute or more
    finally:
        for p in psutil.Process().children(recursive=True):
            p.kill()
