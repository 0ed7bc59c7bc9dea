"""Errors a user can cause. The CLI turns each into one line on stderr and a non-zero exit."""
from __future__ import annotations


class UsageError(Exception):
    """A bad value the user gave: the message names the value and what is allowed."""


class DataError(UsageError):
    """A data file that is missing or not in the expected format: the message names the file."""


def describe_error(exc: BaseException) -> str:
    """`Type: first line of the message`: how a failure is recorded in one line of summary.json."""
    text = str(exc)
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
