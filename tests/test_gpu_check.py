"""benchmarks/gpu_check.py, fit for the first lent GPU (issue 49 item 3): it starts without mtbench's own
dependencies and says what it skipped, writes every row to one JSON file, and its energy and predictor checks can
fail."""
from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import sys
import time
import zipfile

import pytest

from tests.conftest import REPO


@pytest.fixture
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _job(folder, step_joules, watts=200.0, update_s=0.1, boot_mj=987_654_321):
    """steps.csv and samples.csv of a job at `watts` steady: 20 steps of 0.1 s from t=1.0, a 100 ms energy counter
    sampled every 5 ms (as NVML's moves), each step's energy as given."""
    folder.mkdir()
    with open(folder / "steps.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "start_s", "end_s", "warmup", "energy_j_total", "energy_j_null_reason"])
        for i in range(20):
            w.writerow([i, f"{1.0 + 0.1 * i:.6f}", f"{1.1 + 0.1 * i:.6f}", "False", step_joules, ""])
    with open(folder / "samples.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["time_s", "gpu0_power_mw", "gpu0_energy_mj"])
        for k in range(700):
            t = 0.5 + 0.005 * k + 0.0003
            last_update = int(t / update_s) * update_s
            w.writerow([f"{t:.6f}", int(watts * 1000), boot_mj + int(watts * last_update * 1000)])


def test_the_energy_check_passes_on_true_steps_and_fails_on_wrong_ones(gpu_check, tmp_path):
    _job(tmp_path / "true", 20.0)  # 200 W x 0.1 s
    status, text = gpu_check.energy_check(tmp_path / "true")
    assert status == "PASS" and "ratio 1.000" in text, text
    _job(tmp_path / "high", 23.0)  # 15 % too much each step: the counter, read over its own window, disagrees
    status, text = gpu_check.energy_check(tmp_path / "high")
    assert status == "FAIL" and "ratio 1.150" in text, text


def test_the_energy_check_says_when_steps_have_no_energy(gpu_check, tmp_path):
    _job(tmp_path / "null", "")
    status, text = gpu_check.energy_check(tmp_path / "null")
    assert status == "INFO" and "20 of 20 steps without energy" in text


def test_the_predictor_check_compares_like_with_like_and_can_fail(gpu_check):
    assert gpu_check.predict_check(105 * 2**20, 100 * 2**20, "allocated")[0] == "PASS"
    status, text = gpu_check.predict_check(80 * 2**20, 100 * 2**20, "allocated")
    assert status == "FAIL" and "vs max_memory_allocated 100 MiB (-20.0%" in text


def test_missing_dependencies_are_named_with_the_pip_command(gpu_check, tmp_path, monkeypatch):
    monkeypatch.setitem(gpu_check.NEEDED, "mtbench_no_such_module", "no-such-package")
    check = gpu_check.Check(60)
    assert gpu_check.part_deps(check, tmp_path / "no-wheels") is False
    part, status, result = check.rows[-1]
    assert (part, status) == ("deps", "SKIP") and "pip install no-such-package" in result


def _wheel(folder, name, requires=(), body=""):
    """A pure-Python wheel laid out as pip builds one: the module, METADATA with its requirements, WHEEL, RECORD."""
    dist = f"{name}-1.0.dist-info"
    files = {f"{name}/__init__.py": body,
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
                                 + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{path},,\n" for path in files) + f"{dist}/RECORD,,\n"
    folder.mkdir(exist_ok=True)
    with zipfile.ZipFile(folder / f"{name}-1.0-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)


@pytest.fixture
def installs(gpu_check, monkeypatch):
    """part_deps puts what it installs on sys.path and PYTHONPATH: both are given back after the test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    return gpu_check


def test_a_wheel_whose_requirement_is_installed_here_but_not_carried_is_installed(installs, tmp_path, monkeypatch):
    """As hydra-core's wheel needs packaging, which a machine with torch has but the carried folder does not:
    pip --target resolves against an empty folder and refused the whole install."""
    _wheel(tmp_path / "wheels", "mtbench_carried", requires=["packaging"], body="import packaging\n")
    monkeypatch.setitem(installs.NEEDED, "mtbench_carried", "mtbench-carried")
    check = installs.Check(60)
    assert installs.part_deps(check, tmp_path / "wheels") is True, check.rows
    assert check.rows[0][:2] == ["deps", "INFO"] and "mtbench_carried" in check.rows[0][2]
    assert check.rows[-1][:2] == ["deps", "PASS"]


def test_a_module_found_that_does_not_import_skips_the_parts_that_need_it(installs, tmp_path, monkeypatch):
    """As omegaconf carried without antlr4: the module is found, and every job would die importing it."""
    _wheel(tmp_path / "wheels", "mtbench_half", body="import mtbench_never_carried\n")
    monkeypatch.setitem(installs.NEEDED, "mtbench_half", "mtbench-half")
    check = installs.Check(60)
    assert installs.part_deps(check, tmp_path / "wheels") is False
    part, status, result = check.rows[-1]
    assert (part, status) == ("deps", "SKIP") and "No module named 'mtbench_never_carried'" in result, result


def test_missing_hydra_is_named_with_what_it_needs(gpu_check):
    assert gpu_check.wanted(["hydra", "rich"]) == ["'hydra-core>=1.3,<1.4'", "rich", "antlr4-python3-runtime==4.9.3",
                                                   "'omegaconf>=2.2,<2.4'"]


def test_without_a_gpu_it_says_what_it_skipped_and_writes_every_row(gpu_check, tmp_path, monkeypatch, capsys):
    """The whole command on this CPU-only machine, its slow parts (a CPU matrix, the overhead run) stubbed: every
    CUDA part says SKIP, the JSON holds every row, exit 0."""
    monkeypatch.setattr(gpu_check, "part_matrix", lambda check, cuda, sampler, out: [])
    monkeypatch.setattr(gpu_check, "part_overhead", lambda check, cuda: check.add("overhead", "INFO", "stubbed"))
    assert gpu_check.main(["--out", str(tmp_path), "--budget-s", "60"]) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    parts = {r["part"]: r["status"] for r in report["rows"]}
    assert parts["deps"] == "PASS"
    assert {parts[p] for p in ("probe", "tests", "predict", "tx2", "energy")} == {"SKIP"}
    assert set(report["skipped"]) == {"probe", "tests", "predict", "tx2", "energy"} and report["failed"] == []
    assert "skipped: probe, tests, predict, tx2, energy" in capsys.readouterr().out


def test_the_probe_learns_each_nvml_fields_period_from_the_sensor_itself(gpu_check, monkeypatch):
    """The probe's path as on a GPU, NVML faked as an H100's driver answers (instant power and the energy counter
    refreshed every 100 ms, the 1 s average too, utilization once a second), sampled in real time at 5 ms: the
    learned periods are the fake's 100 ms, not the 5 ms of the samples, and the declared ones stand beside them."""
    from tests.fake_nvml import FakeGpu, fake_pynvml

    wave = FakeGpu(power_w=lambda t: 300.0 if int(t / 0.5) % 2 == 0 else 100.0)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([wave]))
    check = gpu_check.Check(60)
    gpu_check.part_probe(check, True, None, seconds=2.0, busy=lambda seconds: time.sleep(seconds))
    rows = {part: result for part, status, result in check.rows if status == "INFO"}
    assert {"probe gpu0_power_mw", "probe gpu0_energy_mj"} <= set(rows), check.rows
    for name in ("probe gpu0_power_mw", "probe gpu0_energy_mj"):
        learned = re.match(r"changes every (\d+) ms", rows[name])
        assert learned and 40 <= int(learned.group(1)) <= 400, rows[name]  # 100 ms, sampled late on a busy machine
        assert rows[name].endswith("declared 100 ms (documented)"), rows[name]


def test_a_part_that_raises_is_its_failure_and_the_others_still_run(gpu_check, tmp_path, monkeypatch):
    def broken(*args):
        raise RuntimeError("the probe broke")

    monkeypatch.setattr(gpu_check, "part_probe", broken)
    monkeypatch.setattr(gpu_check, "part_matrix", lambda check, cuda, sampler, out: [])
    monkeypatch.setattr(gpu_check, "part_overhead", lambda check, cuda: check.add("overhead", "INFO", "stubbed"))
    assert gpu_check.main(["--out", str(tmp_path), "--budget-s", "60"]) == 1
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    failed = [r for r in report["rows"] if r["status"] == "FAIL"]
    assert report["failed"] == ["probe"] and "RuntimeError: the probe broke" in failed[0]["result"], failed
    assert {r["part"] for r in report["rows"]} >= {"deps", "tests", "predict", "tx2", "energy", "overhead"}


@pytest.mark.slow
def test_the_predictor_part_traces_on_fake_cuda_tensors_and_compares_like_with_like(gpu_check):
    """part_predict's path as on a GPU, the predictor real (fake CUDA tensors need no GPU): a CUDA job's
    allocator peaks against the predicted ones of the same kind; a job measured by another source is left out."""
    from mtbench.predict.predictor import Predictor

    p = Predictor(target_name="none", device="cuda").predict("squeezenet", 2)
    allocated = p.tensors_bytes + p.non_tensor_bytes
    job = {"success": True, "model": "squeezenet", "batch_size": 2, "mem_peak_source": "cuda_allocator",
           "mem_peak_bytes": allocated, "mem_peak_reserved_bytes": int(p.peak_bytes * 1.5)}
    cpu_job = dict(job, mem_peak_source="process_rss", batch_size=4)
    check = gpu_check.Check(60)
    gpu_check.part_predict(check, True, [job, cpu_job])
    assert [(part, status) for part, status, _ in check.rows] == [("predict squeezenet b2", "PASS"),
                                                                  ("predict squeezenet b2", "FAIL")], check.rows
    assert "(+0.0%" in check.rows[0][2] and "vs max_memory_allocated" in check.rows[0][2]
    assert "vs max_memory_reserved" in check.rows[1][2] and "(-33.3%" in check.rows[1][2]


@pytest.mark.slow
def test_the_tests_part_gives_pytests_summary_line(gpu_check):
    """Run as on a GPU (here on a small test file): the row gives pytest's own summary, not its last line."""
    check = gpu_check.Check(600)
    gpu_check.part_tests(check, True, ["tests/test_py38.py"])
    part, status, result = check.rows[-1]
    assert (part, status) == ("tests", "PASS") and re.search(r"tests/test_py38.py: \d+ passed in ", result), result
