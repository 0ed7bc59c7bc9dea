"""`mtbench-sample [options] -- CMD ARGS...`: sample the system and a command's process tree while it runs.

Framework-agnostic: imports no torch, so it measures a TensorFlow, JAX or any other program the same way.
It passes the command's exit code through and writes `summary.json` (schema mtbench.summary/1, `model`
null) and `samples.csv` into the output folder, plus `steps.csv` when the program marks its steps (see
mtbench/marker.py: the file named by MTBENCH_STEP_FILE).
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Tuple

from mtbench.campaign.folders import dated_dir
from mtbench.commands.registry import SAMPLE
from mtbench.device import env
from mtbench.errors import ArgumentParser, UsageError, print_error
from mtbench.regular_files import GIB, create_fresh, read_regular
from mtbench.results import files as results
from mtbench.results.summary import build_summary
from mtbench.marker import ENV as STEP_FILE_ENV
from mtbench.sampling import SENSORS, Sampler, SensorUnavailable, StepMark, open_sensors, windows
from mtbench.sampling.procfs import ProcfsSensor


PROG = "mtbench-sample"
MAX_STEP_FILE_BYTES = GIB  # ~25 million marks of ~40 bytes


def parse_args(argv: List[str]) -> argparse.Namespace:
    """The options and the command; a bad one raises UsageError."""
    from mtbench.config import interval_ms

    parser = ArgumentParser(
        prog=PROG,
        description=SAMPLE.summary + ": CPU per core, the RSS and CPU time of its process tree and every "
                    "available sensor until it exits.",
        epilog="Mark steps from the program: `from mtbench.marker import step; with step(): ...`, or append "
               f"'<start> <end>' monotonic seconds per line to the file ${STEP_FILE_ENV}.")
    parser.add_argument("--interval-ms", type=float, default=5.0, help="sampling period, 1 to 1000 ms (default 5)")
    parser.add_argument("--sensors", default="auto",
                        help=f"comma-separated sensors besides procfs ({', '.join(s for s in SENSORS if s != 'procfs')}), "
                             "'auto' (default: every available one) or 'none'")
    parser.add_argument("--sysfs-root", default="/", help="where sysfs is found (default /)")
    parser.add_argument("--warmup", type=int, default=0, help="marked steps to leave out of the figures (default 0)")
    parser.add_argument("--out", default=None, help="output folder (default mtbench-sample/<date>/<time>)")
    parser.add_argument("--kill-after-s", type=float, default=5.0,
                        help="after a second Ctrl-C, seconds between SIGTERM and SIGKILL to the command (default 5)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        raise UsageError("no command given; usage: mtbench-sample [options] -- CMD ARGS...")
    interval_ms("--interval-ms", args.interval_ms)
    if args.warmup < 0:
        raise UsageError(f"--warmup={args.warmup} is out of range; allowed: a whole number >= 0")
    if not args.kill_after_s >= 0:
        raise UsageError(f"--kill-after-s={args.kill_after_s} is out of range; allowed: a number >= 0")
    return args


def make_out(out: Path) -> None:
    """The output folder, created; a file there, or a folder that cannot be made, is a UsageError."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is an existing file; allowed: a folder, or a path where one can be created")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot create the folder ({exc.strerror}); allowed: a folder this user "
                         "can write in") from None


def read_marks(path: Path, warmup: int) -> Tuple[List[StepMark], List[str]]:
    """The good step marks of the step file, and the lines refused (not two numbers, NaN or infinite, or an end
    that is not after its start): a bad mark is left out, never turned into a figure."""
    marks: List[StepMark] = []
    refused: List[str] = []
    try:  # never through a link planted after the file was made (it would print another file's first line)
        text = read_regular(str(path), MAX_STEP_FILE_BYTES).decode(errors="replace")
    except FileNotFoundError:
        return marks, refused
    except OSError as exc:
        return marks, [f"the step file was refused: {exc}"]
    for line in text.splitlines():
        parts = line.split()
        try:
            start, end = float(parts[0]), float(parts[1])
        except (IndexError, ValueError):
            refused.append(line)
            continue
        if not (math.isfinite(start) and math.isfinite(end) and end > start):
            refused.append(line)
            continue
        marks.append(StepMark(len(marks), start, end, len(marks) < warmup))
    return marks, refused


def main(argv: Optional[List[str]] = None) -> None:
    try:
        args = parse_args(list(sys.argv[1:] if argv is None else argv))
        out = Path(args.out or dated_dir("mtbench-sample"))  # the scheme of docs/results.md
        make_out(out)
    except UsageError as exc:
        sys.exit(print_error(exc, PROG))
    sys.exit(run(args, out))


def run(args: argparse.Namespace, out: Path) -> int:
    names = [n for n in args.sensors.split(",") if n and n not in ("none", "procfs")]
    options = {"jetson": {"sysfs_root": args.sysfs_root}, "rapl": {"sysfs_root": args.sysfs_root}}
    try:
        # every other sensor is probed before the command starts, so that a bad one stops nothing running
        extra, status = open_sensors([n for n in names if n != "auto"] or (["auto"] if "auto" in names else []),
                                     options) if names else ([], [])
    except SensorUnavailable as exc:
        return print_error(exc, PROG)
    extra = [s for s in extra if s.name != "procfs"]
    status = [s for s in status if s["name"] != "procfs"]
    step_file = out / "steps.txt"
    try:  # made here, empty (a rerun starts without old marks): a link planted there is removed, never followed
        create_fresh(str(step_file)).close()
    except OSError as exc:
        return print_error(UsageError(f"cannot create the step file {step_file} ({exc.strerror or exc})"), PROG)
    child_env = dict(os.environ, **{STEP_FILE_ENV: str(step_file.resolve())})
    t_start = time.monotonic()
    try:
        child = subprocess.Popen(args.command, env=child_env)
    except OSError as exc:
        return print_error(UsageError(f"cannot run {args.command[0]!r}: {exc.strerror}"), PROG)
    procfs = ProcfsSensor(pid=child.pid, tree=True)
    status.insert(0, {"name": "procfs", "available": True, "reason": None, "fields": [f.name for f in procfs.fields()]})
    sampler = Sampler([procfs] + extra, args.interval_ms).start()
    code, interrupted = wait_for(child, args.kill_after_s)
    t_end = time.monotonic()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what was sampled is written, whatever the keyboard does now
    samples = sampler.stop()
    for sensor in sampler.sensors:
        sensor.close()
    marks, refused = read_marks(step_file, args.warmup)
    for m in marks:
        sampler.mark_step(m.index, m.start_s, m.end_s, m.warmup)
    write(out, args, code, interrupted, samples, sampler, marks, status, t_start, t_end)
    if refused:
        print(f"{PROG}: warning: {len(refused)} step mark(s) of {step_file} refused (allowed: '<start> <end>', "
              f"finite monotonic seconds, end after start); first: {refused[0][:60]!r}", file=sys.stderr)
    if interrupted:
        return 130  # as a shell reports Ctrl-C
    return code if code >= 0 else 128 - code  # a signal -N exits as 128 + N, as a shell reports it


def wait_for(child: subprocess.Popen, kill_after_s: float) -> Tuple[int, bool]:
    """The command's exit code, and whether the user interrupted it. A first Ctrl-C reached the command too
    (same process group): it is left to finish. A second one ends it: SIGTERM, then SIGKILL after
    `kill_after_s`, so that no command outlives mtbench-sample."""
    interrupts = 0
    while True:
        try:
            if interrupts < 2:
                return child.wait(), interrupts > 0
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a third Ctrl-C must not cut this short
            child.terminate()
            try:
                return child.wait(timeout=kill_after_s), True
            except subprocess.TimeoutExpired:
                child.kill()
                return child.wait(), True
        except KeyboardInterrupt:
            interrupts += 1
            if interrupts == 2:
                print(f"mtbench-sample: second Ctrl-C: stopping the command (SIGTERM, SIGKILL after "
                      f"{kill_after_s:g} s)", file=sys.stderr)


def write(out, args, code, interrupted, samples, sampler, marks, status, t_start, t_end) -> None:
    measured = [m for m in marks if not m.warmup]
    # without marked steps the figures cover the whole run (from the first sample on), as one window
    first = float(samples.time_s[0]) if len(samples) else t_start
    windows_for = measured or [StepMark(0, max(t_start, first), t_end, False)]
    telemetry = windows.summarize(samples, windows_for, args.interval_ms)
    rss = samples.columns.get("proc_rss_bytes")
    durations = [m.end_s - m.start_s for m in measured]
    failure = None
    if interrupted:
        failure = {"kind": "interrupted", "message": "interrupted by the user (Ctrl-C)"}
    elif code < 0:
        failure = {"kind": "error", "message": f"command was killed by signal {-code} ({signal.Signals(-code).name})"}
    elif code != 0:
        failure = {"kind": "error", "message": f"command exited with code {code}"}
    rss_peak = int(max(v for v in rss if v == v)) if rss is not None and (rss == rss).any() else None
    summary = build_summary(
        model=None, batch_size=None, device="host", data=None, failure=failure,
        warmup_steps=len(marks) - len(measured), durations_s=durations,
        # mem_peak_bytes: the process tree's RSS, sampled every interval (a spike shorter than one can be missed);
        # mem_system_peak_bytes: system RAM in use (MemTotal - MemAvailable): on a Jetson, what CPU and GPU share
        figures={**telemetry, "mem_peak_bytes": rss_peak},
        reasons=dict(telemetry["unavailable"], throughput_samples_per_s="the command's batch size is unknown",
                     mem_breakdown_bytes="a command's memory is not broken down (mtbench jobs only)"),
        null_reason="not measured for this command",
        job={"command": args.command, "exit_code": code, "duration_s": t_end - t_start,
             "window": "marked steps" if measured else "whole run",
             "mem_peak_source": "process_tree_rss_sampled",
             "sampler": {**sampler.stats(), "sensors": status, "resolution": telemetry.get("resolution")},
             # the board, L4T release, power mode and core types on a Jetson (null elsewhere), as a job records them
             "env": dict(env.host(), jetson=env.jetson(args.sysfs_root))})
    if marks:
        header, rows = windows.step_rows(marks, samples, args.interval_ms)
        results.write_steps(out, header, rows)
    results.write_samples(out, samples)
    results.write_summary(out, summary)
    print(f"mtbench-sample: {failure['message'] if failure else 'exit code 0'}; {len(samples)} samples; {len(measured)} steps; results in {out}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
