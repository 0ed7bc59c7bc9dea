"""Errors a user can cause. The CLI turns each into one line on stderr and a non-zero exit."""
from __future__ import annotations

import argparse
import typing


class UsageError(Exception):
    """A bad value the user gave: the message names the value and what is allowed."""


class DataError(UsageError):
    """A data file that is missing or not in the expected format: the message names the file."""


def describe_error(exc: BaseException) -> str:
    """`Type: first line of the message`: how a failure is recorded in one line of summary.json."""
    text = str(exc)
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def print_error(exc: typing.Union[BaseException, str], prog: str = "mtbench") -> int:
    """The one error printer: `<prog>: error: <message>` (an exception's, or a message) as one line on stderr, flushed
    at once; returns the exit status, 2."""
    import sys

    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__  # one line, however the message was written
    print(f"{prog}: error: {text}", file=sys.stderr, flush=True)
    return 2


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose own errors (an unknown option, a missing value) are UsageErrors, so that they end in the
    one error printer like every other bad input."""

    def error(self, message: str) -> "typing.NoReturn":
        words = self.prog.split()
        if message.startswith("unrecognized arguments: "):
            options = [o for action in self._actions for o in action.option_strings]
            first = message.split(": ", 1)[1].split(" ")[0]
            message = f"unknown option {first!r}; allowed: {', '.join(options)}"
        raise UsageError(f"{words[-1]}: {message}" if len(words) > 1 else message)  # `mtbench report` -> "report: ..."
