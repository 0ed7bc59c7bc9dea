"""The subcommands of `mtbench` (and `mtbench-sample`), each named once: name, one-line summary, the module that runs it.

Each module has `add_arguments(parser)` (an `mtbench.errors.ArgumentParser`: its own errors are UsageErrors) and
`run(args) -> int` (the exit status); a UsageError it raises ends in the one error printer. Modules are imported only
when their subcommand runs, so that this registry imports no torch (`mtbench-sample` reads it).
"""
from __future__ import annotations

import atexit
import importlib
import os
import sys
import threading
from dataclasses import dataclass
from typing import List, NoReturn, Optional

from mtbench.errors import ArgumentParser, UsageError, print_error


@dataclass(frozen=True)
class Subcommand:
    name: str  # as typed after `mtbench`
    summary: str  # one line, for `mtbench --help` and docs/commands.md
    module: str  # dotted module with add_arguments(parser) and run(args) -> int
    quick_exit: bool = False  # as the program, it ends without the interpreter's teardown (exit_now)


SUBCOMMANDS = (
    Subcommand("models", "list the benchmark models: parameters, GFLOP per sample, input", "mtbench.commands.models"),
    Subcommand("report", "tables and figures of finished runs and sweeps, keyed by board", "mtbench.commands.report"),
    Subcommand("maxbatch", "the largest batch that trains within a target's memory budget", "mtbench.commands.maxbatch"),
    Subcommand("predict", "predict peak memory and step time of a job without running it", "mtbench.commands.predict",
               quick_exit=True),
    Subcommand("calibrate", "fit the predictor's time and runtime-memory model to a finished sweep",
               "mtbench.commands.calibrate", quick_exit=True),
    Subcommand("power", "the board's nvpmodel power modes, for power.nvpmodel=ID or NAME (Jetson)",
               "mtbench.commands.power"),
)
# its own entry point (`mtbench-sample`), listed here so that the help and the manual name it once
SAMPLE = Subcommand("mtbench-sample", "sample the system and any program's process tree while it runs (no torch)",
                    "mtbench.commands.sample")


def find(name: str) -> Optional[Subcommand]:
    return next((s for s in SUBCOMMANDS if s.name == name), None)


def parser_for(sub: Subcommand, prog: Optional[str] = None) -> ArgumentParser:
    parser = ArgumentParser(prog=prog or f"mtbench {sub.name}", description=sub.summary)
    importlib.import_module(sub.module).add_arguments(parser)
    return parser


def call(name: str, argv: Optional[List[str]] = None, **run_kwargs) -> int:
    """Parse `argv` for subcommand `name` and run it; returns the exit status (2 after a one-line error)."""
    sub = find(name)
    assert sub is not None, name
    args = list(sys.argv[2:] if argv is None else argv)
    try:
        parsed = parser_for(sub).parse_intermixed_args(args)
        return importlib.import_module(sub.module).run(parsed, **run_kwargs)
    except UsageError as exc:
        return print_error(exc)


def exit_now(status: Optional[int]) -> NoReturn:
    """End the process with `status` after atexit's handlers and a flush of stdout and stderr, skipping the
    interpreter's teardown: torch's libraries' teardown faults in their file pages, resident after the command's
    work is done (measured in docs/benchmarks.md). Where a thread other than the main one
    is still running and not a daemon, the usual exit (which waits for it) instead. `status` as sys.exit takes a
    number or None (0)."""
    main = threading.main_thread()
    if any(t is not main and t.is_alive() and not t.daemon for t in threading.enumerate()):
        sys.exit(status)
    atexit._run_exitfuncs()  # what the teardown runs first: logging's flush, weakref.finalize's (temporary folders)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more to say on it
            pass
    os._exit(0 if status is None else int(status))


def listing() -> str:
    """The subcommands, one per line, for `mtbench --help`."""
    width = max(len(s.name) for s in SUBCOMMANDS + (SAMPLE,))
    lines = [f"  mtbench {s.name:<{width}}  {s.summary}" for s in SUBCOMMANDS]
    lines.append(f"  {SAMPLE.name:<{width + 8}}  {SAMPLE.summary}")
    return "\n".join(lines)
