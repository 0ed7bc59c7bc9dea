"""The command line's shape: one registry of subcommands, --help on each, one error printer, and the inputs of
issue 19 item 9 that ended in a traceback, each now one line and exit 2."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mtbench.commands import registry
from tests.conftest import REPO, as_nobody, mtbench_cli, needs_predictor
from tests.helpers.env import child_env


def one_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtbench: error: "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    return lines[0]


@pytest.mark.parametrize("name", [s.name for s in registry.SUBCOMMANDS])
def test_every_subcommand_has_help(name):
    proc = mtbench_cli(name, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: mtbench {name}") and "Traceback" not in proc.stderr


def test_top_level_help_lists_the_registry():
    proc = mtbench_cli("--help")
    assert proc.returncode == 0, proc.stderr
    listed = proc.stdout.split("== Subcommands ==")[1].split("== Configuration groups ==")[0]
    for sub in registry.SUBCOMMANDS + (registry.SAMPLE,):
        assert sub.name in listed and sub.summary in listed


def test_subcommand_names_are_written_once():
    # the registry is the only place that spells them: cli.py dispatches through registry.find
    cli = (REPO / "mtbench" / "commands" / "cli.py").read_text()
    for sub in registry.SUBCOMMANDS:
        assert f'"{sub.name}"' not in cli


def test_the_manual_lists_the_registry():
    page = (REPO / "docs" / "commands.md").read_text()
    for sub in registry.SUBCOMMANDS + (registry.SAMPLE,):
        assert sub.name in page and sub.summary in page, sub.name


def test_argparse_errors_end_in_the_one_printer(capsys):
    assert registry.call("maxbatch", ["--limit"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mtbench: error: maxbatch: argument --limit: expected one argument") and err.count("\n") == 1


def test_registry_imports_no_torch():
    proc = subprocess.run([sys.executable, "-c", "import sys, mtbench.commands.registry, mtbench.commands.sample; "
                           "print('torch' in sys.modules)"], cwd=REPO, capture_output=True, text=True,
                          env=child_env())
    assert proc.stdout.strip() == "False", proc.stderr


@pytest.mark.parametrize("args, says", [
    (["stpes=3"], "unknown key stpes; did you mean steps?"),
    (["sampler.intervl_ms=5"], "unknown key sampler.intervl_ms; did you mean sampler.interval_ms?"),
    (["model=char_rnn", "model.workload.sq_len=8"], "did you mean model.workload.seq_len?"),
    (["batch=" + "9" * 5000], "at most 4300 digits"),
    (["sampler.interval_ms=0.001"], "sampler.interval_ms=0.001 is out of range; allowed: 1 to 1000 ms"),
    (["sampler.interval_ms=inf"], "sampler.interval_ms=inf is out of range"),
    (["sampler.interval_ms=100000"], "sampler.interval_ms=100000 is out of range"),
    (["hydra.run.dir=/proc/mtbench-x"], "is under /proc; allowed: a folder outside /proc"),
    (["hydra.run.dir=" + "x" * 300], "a name in it is 300 bytes; allowed: at most 255 bytes per name"),
])
def test_bad_overrides_are_one_line(args, says, tmp_path):
    line = one_line(mtbench_cli("model=squeezenet", "device=cpu", *args, f"hydra.sweep.dir={tmp_path}"))
    assert says in line
    assert not list(tmp_path.rglob("summary.json"))


def test_an_existing_file_as_run_dir_is_one_line(tmp_path):
    planted = tmp_path / "a-file"
    planted.write_text("keep me")
    line = one_line(mtbench_cli("model=squeezenet", f"hydra.run.dir={planted}"))
    assert "is an existing file, not a folder" in line and str(planted) in line
    assert planted.read_text() == "keep me"


def test_an_interval_from_an_experiment_yaml_is_checked_before_the_job(tmp_path):
    # past the command line: the composed value (here a config folder's experiment) is asked too
    shutil.copytree(REPO / "conf", tmp_path / "conf")
    (tmp_path / "conf" / "experiment" / "fast_sampler.yaml").write_text(
        "# @package _global_\nsampler:\n  interval_ms: 0.001\n")
    env = child_env()
    proc = subprocess.run([sys.executable, "-m", "mtbench", "experiment=fast_sampler", "model=squeezenet",
                           "device=cpu", "steps=1", "warmup=0", "batch=1", f"hydra.run.dir={tmp_path / 'run'}",
                           f"hydra.searchpath=[file://{tmp_path / 'conf'}]"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    if "is not known" in proc.stderr:  # the search path does not add experiment options to this Hydra: ask directly
        from omegaconf import OmegaConf

        from mtbench.config_overrides import check_composed
        from mtbench.errors import UsageError

        with pytest.raises(UsageError, match="out of range; allowed: 1 to 1000 ms"):
            check_composed(OmegaConf.create({"objective": "step_time_s", "sampler": {"interval_ms": 0.001}}))
        return
    assert "sampler.interval_ms=0.001 is out of range" in one_line(proc)
    assert not (tmp_path / "run" / "summary.json").exists()


def test_a_read_only_sweep_folder_is_one_line():
    # root writes anywhere: the folder is read-only for the user who runs mtbench (nobody)
    nobody = as_nobody()
    base = Path(tempfile.mkdtemp(prefix="mtbench-ro-"))
    try:
        os.chmod(base, 0o755)
        env = child_env(HOME=str(base))
        proc = subprocess.run([*nobody, sys.executable, "-m", "mtbench", "-m", "model=squeezenet", "batch=1,2", f"hydra.sweep.dir={base}/sweep"],
                              cwd=str(base), env=env, capture_output=True, text=True, timeout=300)
        assert "is not writable by this user" in one_line(proc) and str(base) in proc.stderr
    finally:
        shutil.rmtree(base)


@pytest.mark.slow
@pytest.mark.parametrize("sweep", [False, True])
def test_a_default_run_from_a_folder_this_user_cannot_write_is_one_line(sweep):
    """Issue 51 item 10: the default results folder (outputs/ or multirun/ under the current folder) failed inside
    Hydra's resolver with a traceback; now one line naming the folder and the way out."""
    nobody = as_nobody()
    base = Path(tempfile.mkdtemp(prefix="mtbench-ro-"))
    try:
        os.chmod(base, 0o755)  # root's: user nobody cannot write it
        env = child_env(HOME=str(base))
        args = ["-m", "batch=1,2"] if sweep else ["batch=1"]
        proc = subprocess.run([*nobody, sys.executable, "-m", "mtbench", "model=squeezenet", *args], cwd=str(base),
                              env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stderr
        key, folder = ("hydra.sweep.dir", "multirun") if sweep else ("hydra.run.dir", "outputs")
        assert one_line(proc) == (f"mtbench: error: the results go to {folder}/ in the current folder ({base}), which "
                                  f"this user cannot write; allowed: run from a folder this user can write, or "
                                  f"{key}=DIR")
        assert os.listdir(base) == []
    finally:
        shutil.rmtree(base)


def test_maxbatch_without_a_model_is_refused(tmp_path):
    line = one_line(mtbench_cli("maxbatch", "target=nano", "--out", str(tmp_path)))
    assert "maxbatch needs model=NAME" in line
    assert not list(tmp_path.iterdir())  # nothing probed


@pytest.mark.slow
@needs_predictor
def test_a_corrupt_calibration_file_is_one_line(tmp_path):
    bad = tmp_path / "cal.json"
    bad.write_text('{"schema": "mtbench.calibration/1", "key": ')
    line = one_line(mtbench_cli("predict", "model=squeezenet", "batch=2", "device=cpu", f"calibration={bad}",
                                f"out={tmp_path / 'p'}"))
    assert f"calibration={bad} is not a calibration file (not JSON" in line


@pytest.mark.parametrize("content", ['{"schema": "mtbench.calibration/1", "key": ', "[]", "\xff\xfe",
                                     '{"schema": "mtbench.calibration/1", "key": "none-cpu", "target": "none", '
                                     '"device_type": "cpu", "device_name": "x", "source": "s", "runs": 1, '
                                     '"created": "2026", "time_coef": "fast"}'])
def test_a_corrupt_stored_calibration_is_left_out_with_a_warning(content, tmp_path, monkeypatch, capsys):
    from mtbench.predict import calibration

    monkeypatch.setenv(calibration.ENV_DIR, str(tmp_path))
    (tmp_path / "none-cpu.json").write_bytes(content.encode("latin-1"))
    assert calibration.load("none-cpu") is None
    err = capsys.readouterr().err.strip()
    assert err.startswith("mtbench: warning: the stored calibration") and str(tmp_path / "none-cpu.json") in err
    assert "\n" not in err


def test_a_stored_calibration_still_loads(tmp_path, monkeypatch):
    from mtbench.predict import calibration

    monkeypatch.setenv(calibration.ENV_DIR, str(tmp_path))
    cal = calibration.Calibration(key="none-cpu", target="none", device_type="cpu", device_name="x", source="s",
                                  runs=3, created="2026-12-01", time_coef=[0.001, 1e-9, 0.0, 1e-5], non_tensor_bytes=5)
    calibration.save(cal)
    assert calibration.load("none-cpu") == cal
    assert json.loads((tmp_path / "none-cpu.json").read_text())["schema"] == calibration.SCHEMA


def test_a_calibration_written_under_the_old_names_still_loads(tmp_path, monkeypatch):
    """`runtime_bytes` meant two things (summary.json: memory before the model was built; the calibration: memory that
    is not tensors); the calibration's keys were renamed, and a file written before still reads."""
    from mtbench.predict import calibration

    monkeypatch.setenv(calibration.ENV_DIR, str(tmp_path))
    cal = calibration.Calibration(key="none-cpu", target="none", device_type="cpu", device_name="x", source="s",
                                  runs=3, created="2026-12-01", non_tensor_bytes=7, non_tensor_per_op_bytes=2.0)
    path = calibration.save(cal)
    data = json.loads(path.read_text())
    data["runtime_bytes"], data["runtime_per_op_bytes"] = data.pop("non_tensor_bytes"), data.pop("non_tensor_per_op_bytes")
    path.write_text(json.dumps(data))
    assert calibration.load("none-cpu") == cal


@needs_predictor
def test_a_fifo_or_a_link_named_as_calibration_is_one_line_without_blocking(tmp_path):
    import os

    fifo = tmp_path / "cal.json"
    os.mkfifo(fifo)
    line = one_line(mtbench_cli("predict", "model=squeezenet", "batch=2", "device=cpu", f"calibration={fifo}",
                                timeout=120))
    assert "is a FIFO" in line or "is not a file" in line, line


EXIT_NOW_CHILD = """
import atexit, sys, threading, time
from mtbench.commands import registry

class Teardown:
    def __del__(self):  # runs in the interpreter's teardown, not before
        print("teardown ran", flush=True)

kept = Teardown()
atexit.register(print, "atexit ran")
sys.stdout.write("buffered, no newline")  # stdout is a pipe: block-buffered until a flush
if sys.argv[1] == "thread":
    threading.Thread(target=lambda: (time.sleep(0.2), print("thread finished"))).start()
registry.exit_now(None if sys.argv[1] == "none" else 3)
"""


@pytest.mark.parametrize("case", ["alone", "thread", "none"])
def test_exit_now_runs_atexit_and_flushes_but_skips_the_teardown_unless_a_thread_runs(case):
    proc = subprocess.run([sys.executable, "-c", EXIT_NOW_CHILD, case], capture_output=True, text=True,
                          env=child_env(), timeout=60)
    assert proc.returncode == (0 if case == "none" else 3), proc.stderr
    assert proc.stdout.startswith("buffered, no newline") and "atexit ran" in proc.stdout, proc.stdout
    if case != "thread":
        assert "teardown ran" not in proc.stdout, proc.stdout
    else:  # the usual exit: it waits for the thread, then tears down
        assert "thread finished" in proc.stdout and "teardown ran" in proc.stdout, proc.stdout


def test_predict_as_the_program_ends_through_exit_now():
    """`mtbench predict` as the program (main() reads sys.argv) ends in exit_now; a caller's main(argv) does not."""
    probe = ("import sys; from mtbench.commands import cli, registry\n"
             "registry.exit_now = lambda status: (print('exit_now', status), sys.stdout.flush(), registry.os._exit(status))\n"
             "sys.argv = ['mtbench', 'predict', 'model=nosuchmodel', 'batch=1']\n")
    for call, says in (("cli.main()", "exit_now 2"), ("cli.main(sys.argv[1:])", "")):
        proc = subprocess.run([sys.executable, "-c", probe + call], capture_output=True, text=True, env=child_env(),
                              timeout=120)
        assert proc.returncode == 2 and "model='nosuchmodel' is not known" in proc.stderr, proc.stderr[-2000:]
        assert proc.stdout.strip() == says, proc.stdout
