"""Progress: the live line of a job (terminal and plain), what the job sends between steps, and where results go."""
from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import pytest
from rich.console import Console

from mtbench.results import live
from mtbench.results.live import LiveLine, Progress, ProcessStats, ProgressSender
from tests.conftest import REPO, compose_cfg, needs_predictor
from tests.helpers.compose import FAKE as FAKE_JOB
from tests.helpers.env import child_env

FAKE = [*FAKE_JOB, "model.workload._target_=tests.fake_workloads.BusyLoop"]


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_the_job_sends_each_phase_at_once_and_steps_a_few_times_a_second():
    sent, clock = [], Clock()
    sender = ProgressSender(sent.append, total_steps=3 + 100, clock=clock)
    sender.phase("warm-up", 3)
    for seconds in (0.9, 0.1, 0.1):  # the first warm-up step is the slow one
        clock.now += seconds
        sender.step(seconds)
    sender.phase("measure", 100)
    for _ in range(100):  # 100 steps of 10 ms: 1 s, so about 4 sends and the last step's
        clock.now += 0.01
        sender.step(0.01)
    phases = [p.phase for p in sent]
    assert phases[0] == "warm-up" and phases.count("measure") <= 1 + 1 / live.REFRESH_S + 1
    assert sent[-1].done == 100 and sent[-1].steps == 100 and sent[-1].eta_s == 0
    warm_done = [p for p in sent if p.phase == "warm-up" and p.done == 3][0]
    # ETA: the steps left (100) times the median of the recent steps (0.1 s), not the slow first one
    assert warm_done.eta_s == pytest.approx(100 * 0.1)
    assert warm_done.last_step_s == 0.1 and warm_done.sent_s == pytest.approx(101.1)


def test_a_parent_that_is_gone_does_not_fail_the_job():
    def broken(progress):
        raise BrokenPipeError(32, "Broken pipe")

    sender = ProgressSender(broken, total_steps=2)
    sender.phase("measure", 2)
    sender.step(0.1)
    sender.step(0.1)  # nothing raised: the line is lost, the measurement is not


def test_off_a_terminal_one_plain_line_per_phase():
    out, clock = io.StringIO(), Clock()
    line = LiveLine("alexnet batch 2", plain=out, clock=clock)
    line.update(Progress("build", sent_s=clock.now))
    clock.now += 2.0
    line.update(Progress("measure", 0, 20, sent_s=clock.now))
    for k in range(1, 21):
        clock.now += 0.1
        line.update(Progress("measure", k, 20, 0.1, (20 - k) * 0.1, clock.now))
        line.tick()
    line.close(live.outcome({"success": True}))
    assert out.getvalue().splitlines() == [
        "  alexnet batch 2: build (0.0 s elapsed)",
        "  alexnet batch 2: measure, 20 steps (2.0 s elapsed)",
        "  alexnet batch 2: done (4.0 s elapsed)",
    ]


def test_on_a_terminal_the_line_shows_step_elapsed_eta_and_last_step_and_is_redrawn_at_most_4_times_a_second():
    file, clock = io.StringIO(), Clock()
    console = Console(file=file, force_terminal=True, width=200, color_system=None)
    line = LiveLine("vgg19 batch 16", console=console, clock=clock)
    line.update(Progress("measure", 6, 20, 0.452, 14 * 0.452, clock.now))
    clock.now += 1.0
    assert line.line(clock.now) == ("  vgg19 batch 16 | measure: step 7 of 20 | 1.0 s elapsed, ETA 5.3 s | "
                                    "last step 452.0 ms")
    line.tick()  # a second since the last draw: redrawn
    assert "1.0 s elapsed, ETA 5.3 s" in file.getvalue()
    drawn = file.getvalue().count("measure: step")
    for _ in range(10):  # ten polls within 0.1 s: no redraw
        clock.now += 0.01
        line.tick()
    assert file.getvalue().count("measure: step") == drawn
    clock.now += live.REFRESH_S
    line.tick()
    assert file.getvalue().count("measure: step") == drawn + 1
    line.close("done")
    assert "done (" not in file.getvalue()  # the summary follows on a terminal; the line itself is erased


def test_the_jobs_cpu_and_memory_come_from_its_proc_files(tmp_path):
    proc = tmp_path / "4242"
    proc.mkdir()
    fields = ["S"] + ["0"] * 10 + ["{utime}", "{stime}"] + ["0"] * 30
    stat = "4242 (python -m mtbench) " + " ".join(fields)  # a command name with spaces and a parenthesis
    clock = Clock()
    stats = ProcessStats(4242, proc_root=str(tmp_path), clock=clock)
    (proc / "stat").write_text(stat.format(utime=100, stime=50))
    (proc / "statm").write_text("1000 2048 10 1 0 500 0\n")
    assert stats.read() == (None, 2048 * live.PAGE_BYTES)  # CPU %: from the next read's tick delta on
    clock.now += 2.0
    (proc / "stat").write_text(stat.format(utime=100 + 2 * live.CLOCK_TICKS, stime=50 + live.CLOCK_TICKS))
    cpu_pct, _ = stats.read()
    assert cpu_pct == pytest.approx(150.0)  # 3 s of CPU in 2 s of wall time: 1.5 cores
    (proc / "stat").unlink()
    assert stats.read() == (None, None)  # the process ended: nothing, not a zero


def test_no_progress_is_sent_inside_a_timed_step(tmp_path, monkeypatch):
    """The live line costs the measured steps nothing: every send happens outside every step's window."""
    import time

    from mtbench import config
    from mtbench.job.messages import Message
    from mtbench.job.run import run_job

    monkeypatch.setattr(config, "ALLOWED_TARGET_PREFIXES", config.ALLOWED_TARGET_PREFIXES + ("tests.",))
    sent = []
    monkeypatch.setattr(live, "REFRESH_S", 0.0)  # a send after every step: the strictest case

    def notify(kind, payload):
        if kind == Message.PROGRESS:
            sent.append((time.monotonic(), payload))

    cfg = compose_cfg([*FAKE, "+model.workload.seconds=0.02", "warmup=1", "steps=3"])
    run_job(cfg, tmp_path / "job", notify=notify)
    with open(tmp_path / "job" / "steps.csv") as f:
        windows = [(float(r["start_s"]), float(r["end_s"])) for r in csv.DictReader(f)]
    assert len(windows) == 4
    assert [p.phase for _, p in sent if p.done == 0] == ["build", "warm-up", "measure", "breakdown", "write"]
    assert sum(1 for _, p in sent if p.done) == 4  # one per step (REFRESH_S 0 here)
    for t, p in sent:
        assert not any(start < t < end for start, end in windows), (t, p)
        assert not any(start < p.sent_s < end for start, end in windows)


@pytest.mark.slow
def test_an_isolated_job_prints_its_phases_off_a_terminal(tmp_path):
    env = child_env()
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "isolated_job.py"), str(tmp_path / "job"), *FAKE,
                           "+model.workload.seconds=0.01", "warmup=1", "steps=2"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.rstrip("\n").splitlines()
    assert json.loads(lines[-1])["success"]
    phases = [line.split(": ", 1)[1].rsplit(" (", 1)[0] for line in lines[:-1] if line.startswith("  squeezenet")]
    assert phases == ["build", "warm-up, 1 step", "measure, 2 steps", "breakdown", "write", "done"], proc.stdout


# -- `mtbench models`: rows cached per model and overrides ------------------------------------------------------

def test_models_rows_are_counted_once_then_read_from_the_cache(tmp_path, monkeypatch):
    from mtbench.report import catalog
    from mtbench.report.flop_cache import FlopCache

    cache = FlopCache(tmp_path / "cache" / "models")
    (first,) = catalog.model_rows(["batch=1"], names=["alexnet"], cache=cache)
    from importlib.util import find_spec

    counted = find_spec("torch.utils.flop_counter") is not None  # torch >= 2.1: else null with the reason, cached too
    assert cache.misses == 1 and (first.flops_per_sample is not None) == counted, first
    files = list((tmp_path / "cache" / "models").iterdir())
    assert len(files) == 1 and oct(files[0].parent.stat().st_mode & 0o777) == "0o700"

    def must_not_count(name, cfg):
        raise AssertionError(f"{name} counted again")

    monkeypatch.setattr(catalog, "_row", must_not_count)
    cache = FlopCache(tmp_path / "cache" / "models")
    assert catalog.model_rows(["batch=1"], names=["alexnet"], cache=cache) == [first]
    assert cache.hits == 1 and cache.misses == 0
    # other overrides are another key: counted (here: the stand-in raises)
    with pytest.raises(AssertionError, match="alexnet counted again"):
        catalog.model_rows(["batch=2"], names=["alexnet"], cache=cache)


def test_a_changed_conf_or_model_code_is_a_new_key(tmp_path, monkeypatch):
    from mtbench.report import flop_cache

    key = flop_cache.FlopCache(tmp_path).key("alexnet", ["batch=1"])
    monkeypatch.setattr(flop_cache, "conf_digest", lambda conf: "another conf/")
    assert flop_cache.FlopCache(tmp_path).key("alexnet", ["batch=1"]) != key
    monkeypatch.undo()
    monkeypatch.setattr(flop_cache, "code_digest", lambda: "other model code")
    assert flop_cache.FlopCache(tmp_path).key("alexnet", ["batch=1"]) != key


def test_a_planted_link_or_fifo_in_the_cache_is_a_miss_never_read(tmp_path):
    from mtbench.report.flop_cache import FlopCache

    cache = FlopCache(tmp_path / "models")
    row = {"name": "alexnet", "parameters": 1, "paper_params": None, "flops_per_sample": 2.0, "flops_note": "",
           "description": "d"}
    cache.store("k1", row)
    assert cache.load("k1") == row
    (tmp_path / "elsewhere.json").write_text(json.dumps(row))
    (tmp_path / "models" / "k2.json").symlink_to(tmp_path / "elsewhere.json")
    os.mkfifo(tmp_path / "models" / "k3.json")  # opening it for reading would block without O_NONBLOCK
    (tmp_path / "models" / "k4.json").write_text('{"parameters": "many"}')
    assert cache.load("k2") is None and cache.load("k3") is None and cache.load("k4") is None
    cache.store("k2", row)  # the link itself is replaced, the file it named is untouched
    assert not (tmp_path / "models" / "k2.json").is_symlink() and cache.load("k2") == row
    # a cache folder that is a link is refused: nothing written through it, and no error
    (tmp_path / "linked").symlink_to(tmp_path / "target", target_is_directory=True)
    (tmp_path / "target").mkdir()
    FlopCache(tmp_path / "linked").store("k5", row)
    assert list((tmp_path / "target").iterdir()) == []


def test_a_cached_models_listing_imports_no_torch(tmp_path):
    """`mtbench models` from a full cache composes nothing and builds nothing: no torch, about a second."""
    code = ("import sys, json\n"
            "from mtbench.config import group_options\n"
            "from mtbench.report.flop_cache import FlopCache\n"
            "cache = FlopCache()\n"
            "for name in group_options('model'):\n"
            "    cache.store(cache.key(name, []), {'name': name, 'parameters': 1234567, 'paper_params': None,\n"
            "                'flops_per_sample': 4.2e9, 'flops_note': 'cached', 'description': 'from the cache'})\n"
            "from mtbench.commands import cli\n"
            "try:\n"
            "    cli.main(['models'])\n"
            "except SystemExit as exc:\n"
            "    assert exc.code == 0, exc.code\n"
            "print('torch imported:', 'torch' in sys.modules)\n")
    env = child_env(XDG_CACHE_HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "torch imported: False" in proc.stdout and "from the cache" in proc.stdout and "4.2" in proc.stdout
    assert "counting FLOPs" not in proc.stdout


# -- profile=true: steps marked in the trace, Kineto's lines off the console, the slowdown beside the figures ------

def test_a_profiled_trace_marks_each_measured_step_and_kinetos_lines_stay_off_the_console(tmp_path, monkeypatch,
                                                                                            capfd):
    import gzip

    from mtbench import config
    from mtbench.job.run import run_job
    from mtbench.results.console import print_summary

    monkeypatch.setattr(config, "ALLOWED_TARGET_PREFIXES", config.ALLOWED_TARGET_PREFIXES + ("tests.",))
    cfg = compose_cfg([*FAKE, "+model.workload.seconds=0.02", "warmup=1", "steps=2", "profile=true"])
    summary = run_job(cfg, tmp_path / "job")
    out, err = capfd.readouterr()
    # kineto's own lines: USDT probes (torch 2.x) or "Completed Stage" (torch 1.13), in profiler.log only
    assert "USDT:" not in err + out and "profiler_start" not in err + out and "Completed Stage" not in err + out
    log = (tmp_path / "job" / "profiler.log").read_text()
    assert "profiler_start" in log or "Completed Stage" in log
    with open(tmp_path / "job" / "steps.csv") as f:
        measured = [r for r in csv.DictReader(f) if r["warmup"] == "0"]
    with gzip.open(tmp_path / "job" / "trace.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    marks = sorted((e for e in events if str(e.get("name")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    # one span per measured step, numbered as steps.csv (1 warm-up + 2 reference steps come first)
    assert [e["name"] for e in marks] == [f"ProfilerStep#{r['index']}" for r in measured] == \
        ["ProfilerStep#3", "ProfilerStep#4"]
    offset = summary["profile"]["clock_offset_s"]
    for e, r in zip(marks, measured):  # each span holds its step's timed window (on the sampler's clock)
        assert e["ts"] / 1e6 + offset <= float(r["start_s"]) + 1e-3
        assert float(r["end_s"]) <= (e["ts"] + e["dur"]) / 1e6 + offset + 1e-3
    assert summary["profile"]["steps_marked"] == 2
    print_summary(summary, str(tmp_path / "job"))
    out = capfd.readouterr().out
    ratio = summary["profile"]["overhead_ratio"]
    assert f"these steps ran under the profiler, {ratio:.2f}x the unprofiled median" in out


# -- where results go: one scheme, COMMAND-FOLDER/<date>/<time>, printed at the end --------------------------------

DATED = r"/\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d(-\d+)?"


def test_dated_dirs_are_made_at_once_and_never_shared(tmp_path, monkeypatch):
    import re

    from mtbench.campaign.folders import dated_dir

    monkeypatch.chdir(tmp_path)
    first, second = dated_dir("predict"), dated_dir("predict")  # the same second: the second gives way
    assert re.fullmatch("predict" + DATED, first) and os.path.isdir(first)
    assert second != first and os.path.isdir(second)


@needs_predictor
def test_maxbatch_and_predict_default_to_the_scheme_and_say_where(tmp_path, monkeypatch, capsys):
    import re

    from mtbench.commands import maxbatch
    from mtbench.commands.predict import main_predict
    from tests.campaign.test_maxbatch import fake_board

    monkeypatch.chdir(tmp_path)
    assert maxbatch.main(["model=alexnet", "target=nano", "device=cpu"],
                         prober=lambda overrides, batch, out_dir: fake_board(40)(batch)) == 0
    (found,) = (tmp_path / "maxbatch").glob("*/*/maxbatch.json")
    assert re.fullmatch("maxbatch" + DATED, found.parent.relative_to(tmp_path).as_posix())
    assert f"results in {found.parent.relative_to(tmp_path)} (maxbatch.json" in capsys.readouterr().out
    assert main_predict(["model=alexnet", "batch=2", "device=cpu", "max_batch=false"]) == 0
    (found,) = (tmp_path / "predict").glob("*/*/predict.json")
    out = capsys.readouterr().out
    assert f"results in {found.parent.relative_to(tmp_path)} (predict.json, predict.csv)" in out
    assert "  predicting: 1 item ..." in out  # off a terminal: one line where the work starts
    assert not (tmp_path / "outputs").exists()


def test_mtbench_sample_defaults_to_the_scheme(tmp_path):
    import re

    env = child_env()
    proc = subprocess.run([sys.executable, "-m", "mtbench.commands.sample", "--sensors", "none", "--", "true"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (found,) = (tmp_path / "mtbench-sample").glob("*/*/summary.json")
    folder = found.parent.relative_to(tmp_path).as_posix()
    # on stderr: stdout is the measured program's
    assert re.fullmatch("mtbench-sample" + DATED, folder) and f"results in {folder}" in proc.stderr


def test_a_sweep_ends_saying_where_its_results_are(tmp_path, capsys):
    from omegaconf import OmegaConf

    from mtbench.campaign.sweep import SweepProgress

    SweepProgress().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    assert capsys.readouterr().out.rstrip().endswith(f"results in {tmp_path}")


def test_work_progress_is_a_transient_bar_on_a_terminal_and_one_line_otherwise():
    from mtbench.results.live import WorkProgress

    plain = io.StringIO()
    with WorkProgress("counting FLOPs", 3, plain=plain) as progress:
        for name in ("alexnet", "vgg16", "vgg19"):
            progress.item(name)
    assert plain.getvalue() == "  counting FLOPs: 3 items ...\n"
    file = io.StringIO()
    console = Console(file=file, force_terminal=True, width=120, color_system=None)
    with WorkProgress("counting FLOPs", 2, console=console) as progress:
        progress.item("alexnet")
        progress.item("vgg16")
        assert progress._bar is not None and progress._bar.tasks[0].completed == 1
        assert progress._bar.tasks[0].description == "counting FLOPs: vgg16"
    assert progress._bar is None and "\x1b[?25h" in file.getvalue()  # stopped: the cursor is shown again
    with WorkProgress("counting FLOPs", 0, plain=plain) as progress:  # nothing to do: nothing said
        pass
    assert plain.getvalue().count("\n") == 1
