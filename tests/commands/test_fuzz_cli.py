"""Fuzz of the command line: 500 generated override lists over every key of the composed
config, with wrong types, extremes, unicode and very long values, each ending in exit 0, 1 (a recorded job failure
with a summary) or 2 (one line), never a traceback, never a hang.

The 500 run in this process through the real entry point (`mtbench.commands.cli.main`), with the job replaced by
the validation a job does before it trains (`Job(cfg, out_dir)`: settings, planner, budget, device), so that they
take well under two minutes on one core; a handful run the real job end to end in subprocesses.
"""
from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import List

import pytest

from tests.conftest import mtbench_cli

SEED = 20261201
CASES = 500
DEFAULTS = {"steps": "1", "warmup": "0", "batch": "1", "model": "squeezenet", "device": "cpu"}
VALUES = ["0", "-1", "1", "2", "1e400", "-1e400", "inf", "nan", "-inf", "9" * 5000, "0.5", "1.5", "abc", "true",
          "false", "null", "''", "[1,2]", "{a: 1}", "é中", "'é中文'", "x" * 5000, "'" + "y" * 20000 + "'", "1,2",
          "${batch}", "${nosuch.key}", "💥", "'\\n'", "auto", "cuda", "cpu", "procfs", "tx2", "/tmp", "/proc/self",
          "'a b'", "[]", "3.0", "1_000", "0x10"]


def config_keys() -> List[str]:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from mtbench.config import conf_dir

    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        tree = OmegaConf.to_container(compose(config_name="config"), resolve=False)
    keys = []

    def walk(node, prefix):
        for key, value in node.items():
            dotted = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, dict):
                walk(value, dotted)
            else:
                keys.append(dotted)

    walk(tree, "")
    return keys


def misspell(key: str, rng: random.Random) -> str:
    i = rng.randrange(len(key))
    return key[:i] + key[i + 1:] if rng.random() < 0.5 else key[:i] + rng.choice("aeiouxz") + key[i:]


def generate(rng: random.Random, keys: List[str], groups: dict) -> List[str]:
    overrides = []
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        if roll < 0.25:
            group = rng.choice(sorted(groups))
            value = rng.choice(groups[group] + VALUES[:8])
            overrides.append(f"{group}={value}")
            continue
        key = rng.choice(keys)
        if roll < 0.35:
            key = misspell(key, rng)
        elif roll < 0.40:
            key = rng.choice(["stpes", "foo.bar", "model.nosuch", "é", "x" * 300])
        value = rng.choice(VALUES) if rng.random() < 0.85 else str(rng.choice([0, -1, 2 ** 63, 10 ** 30]))
        prefix = rng.choice(["", "", "", "", "+", "++", "~"])
        overrides.append(f"~{key}" if prefix == "~" and rng.random() < 0.5 else f"{prefix}{key}={value}")
    return overrides


def with_defaults(overrides: List[str]) -> List[str]:
    set_keys = {o.lstrip("+~").split("=", 1)[0] for o in overrides}
    return [f"{k}={v}" for k, v in DEFAULTS.items() if k not in set_keys] + overrides


def validation_only(cfg, out_dir, timing=None):
    """The job's process, less training: what it validates before step 0, then a recorded failure."""
    from mtbench.job.run import Job
    from mtbench.results.files import write_summary

    from mtbench.errors import UsageError, describe_error

    try:
        job = Job(cfg, Path(out_dir))
    except UsageError:
        raise  # as the real job's process hands it to the parent: one line, exit 2
    except Exception as exc:  # noqa: BLE001 - the real job's process records it as the job's failure
        CRASHES.append(describe_error(exc))
        summary = {"schema": "mtbench.summary/1", "model": str(cfg.model.name), "success": False,
                   "failure": {"kind": "error", "message": describe_error(exc)}}
        write_summary(Path(out_dir), summary)
        return summary
    job.failure = {"kind": "error", "message": "fuzz: validated, not trained"}
    summary = job.summary(None)
    write_summary(Path(out_dir), summary)
    return summary


CRASHES: List[str] = []  # what the job's own validation let through as an error instead of a one-line refusal



def run_in_process(argv: List[str], capsys) -> tuple:
    from mtbench.commands.cli import main

    code = 0
    try:
        main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # noqa: BLE001 - anything that escapes the entry point is a finding
        import traceback

        return "raised", "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def check(code, output: str, run_dir: Path) -> str:
    """'' when the outcome is allowed, else what is wrong."""
    if "Traceback" in output or code == "raised":
        return "traceback"
    if code == 2:
        errors = [line for line in output.splitlines() if line.startswith("mtbench: error: ")]
        if len(errors) != 1:
            return f"exit 2 without exactly one error line: {output[-300:]!r}"
        return ""
    if code == 1:
        return "" if list(run_dir.rglob("summary.json")) else f"exit 1 without a summary: {output[-300:]!r}"
    return "" if code == 0 else f"exit {code}"


CHUNKS = 5  # the 500 cases in five tests of 100, so that pytest-xdist's workers share them


def all_cases() -> List[List[str]]:
    """The 500 override lists, drawn in one sequence from SEED (the same lists whichever chunk runs first)."""
    if not _CASES:
        from mtbench.config import GROUPS, group_options

        keys = config_keys()
        groups = {g: group_options(g) for g in GROUPS}
        rng = random.Random(SEED)
        _CASES.extend(with_defaults(generate(rng, keys, groups)) for _ in range(CASES))
    return _CASES


_CASES: List[List[str]] = []


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_500_generated_override_lists_end_in_0_1_or_2(chunk, tmp_path, monkeypatch, capsys):
    from mtbench.job import isolation
    from mtbench.results import console

    monkeypatch.setattr(isolation, "run_isolated", validation_only)
    # the console's table wants a trained job's figures; the fake's summary says only why it failed
    monkeypatch.setattr(console, "print_summary", lambda summary, out_dir, compact=False: print(summary["failure"]))
    monkeypatch.setattr(sys, "argv", ["mtbench"])
    monkeypatch.chdir(tmp_path)
    size = CASES // CHUNKS
    cases = all_cases()[chunk * size:(chunk + 1) * size]
    began = time.process_time()  # CPU time: a loaded machine slows the wall clock, not the work done
    findings, outcomes = [], {}
    for i, overrides in enumerate(cases):
        run_dir = tmp_path / str(i)
        code, output = run_in_process(overrides + [f"hydra.run.dir={run_dir}"], capsys)
        outcomes[code] = outcomes.get(code, 0) + 1
        problem = check(code, output, run_dir)
        if problem:
            findings.append(f"{[o[:80] for o in overrides]}: {problem}: {output[-800:]}")
    elapsed = time.process_time() - began
    assert not findings, f"{len(findings)} of {len(cases)} cases: " + "\n\n".join(findings[:5])
    assert outcomes.get(2, 0) > len(cases) // 4 and outcomes.get(1, 0) >= 2, outcomes  # both paths were exercised
    # its cost is printed, not asserted (a timed test fails on a slow machine, not on slow code)
    print(f"{len(cases)} cases in {elapsed:.0f} s of CPU; outcomes {outcomes}; {len(CRASHES)} recorded as job errors "
          "by the job's own checks: "
          f"{sorted(set(c[:90] for c in CRASHES))}")


@pytest.mark.slow
@pytest.mark.parametrize("index", range(6))
def test_generated_cases_end_to_end(index, tmp_path):
    """A few generated lists through the real job, in a process of its own, under a time limit."""
    from mtbench.config import GROUPS, group_options

    rng = random.Random(SEED + index)
    keys = config_keys()
    groups = {g: group_options(g) for g in GROUPS if g != "model"}  # a light model keeps it fast
    overrides = with_defaults([o for o in generate(rng, keys, groups) if not o.lstrip("+~").startswith("model")])
    proc = mtbench_cli(*overrides, f"hydra.run.dir={tmp_path / 'run'}", timeout=300)
    output = proc.stdout + proc.stderr
    problem = check(proc.returncode, output, tmp_path)
    assert not problem, f"{overrides}: {problem}: {output[-2000:]}"
    if proc.returncode in (0, 1):
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["success"] is (proc.returncode == 0)


# Hydra's own keys, as another user could slip them into a shared config folder or a copied command: each names a
# writer (with the victim's path as its argument) where Hydra builds or calls something; none may reach it
WRITERS = ["mtbench.results.files.atomic_write", "mtbench.commands.sample.main", "mtbench.results.files.write_summary",
           "os.system", "builtins.open", "subprocess.Popen"]
HYDRA_NODES = ["hydra.callbacks.{n}", "hydra.launcher.{n}", "hydra.sweeper.{n}", "hydra.job.{n}",
               "hydra.job_logging.handlers.{n}", "hydra.hydra_logging.handlers.{n}", "hydra.run.{n}"]


def hydra_case(rng: random.Random, victim: Path, shared: Path, i: int) -> List[str]:
    """One override list that names a writer through a Hydra node: on the command line, or in a YAML of a folder
    that hydra.searchpath adds."""
    writer, node = rng.choice(WRITERS), rng.choice(HYDRA_NODES).format(n=f"x{i}")
    key = "class" if "logging" in node and rng.random() < 0.5 else rng.choice(["_target_", "()"])
    args = {"path": str(victim), "text": "PWNED", "out_dir": str(victim.parent), "command": f"touch {victim}",
            "argv": ["--", "touch", str(victim)], "file": str(victim), "args": ["touch", str(victim)]}
    extras = [f"hydra/launcher={rng.choice(['basic', 'submitit_local'])}"] if rng.random() < 0.3 else []
    if rng.random() < 0.5:  # on the command line
        arg_overrides = [f"+{node}.{name}={json.dumps(value)}" for name, value in rng.sample(sorted(args.items()), 2)]
        return extras + [f"+{node}.{key}={writer}"] + arg_overrides
    folder = shared / f"conf{i}"
    (folder / "lab").mkdir(parents=True)
    body: dict = {}
    cursor = body
    for part in node.split("."):
        cursor = cursor.setdefault(part, {})
    cursor.update({key: writer, **dict(rng.sample(sorted(args.items()), 3))})
    (folder / "lab" / "evil.yaml").write_text("# @package _global_\n" + json.dumps(body))  # JSON is YAML
    return extras + [f"hydra.searchpath=[file://{folder}]", "+lab=evil"]


@pytest.mark.slow
def test_generated_hydra_keys_reach_no_writer(tmp_path, monkeypatch, capsys):
    """60 lists naming a writer through Hydra's callbacks, plugins, job and logging nodes, from the command line and
    from a searchpath YAML: each ends in exit 0, 1 or 2 as above, and the victim is never written."""
    from mtbench.job import isolation
    from mtbench.results import console

    monkeypatch.setattr(isolation, "run_isolated", validation_only)
    monkeypatch.setattr(console, "print_summary", lambda summary, out_dir, compact=False: print(summary["failure"]))
    monkeypatch.setattr(sys, "argv", ["mtbench"])
    monkeypatch.chdir(tmp_path)
    rng = random.Random(SEED + 1)
    victim, findings, outcomes = tmp_path / "victim", [], {}
    for i in range(60):
        overrides = with_defaults(hydra_case(rng, victim, tmp_path / "shared", i))
        run_dir = tmp_path / str(i)
        code, output = run_in_process(overrides + [f"hydra.run.dir={run_dir}"], capsys)
        outcomes[code] = outcomes.get(code, 0) + 1
        problem = check(code, output, run_dir) or ("the victim was written" if victim.exists() else "")
        if problem:
            findings.append(f"{overrides}: {problem}: {output[-600:]}")
        if victim.exists():
            victim.unlink()
    assert not findings, f"{len(findings)} of 60 cases: " + "\n\n".join(findings[:5])
    assert outcomes.get(2, 0) >= 50, outcomes  # refused before any job, each in one line
