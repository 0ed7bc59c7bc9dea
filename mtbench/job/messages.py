"""What a job's process tells the parent that forked it: one kind per message, each with the payload it carries."""
from __future__ import annotations

import enum


class Message(str, enum.Enum):
    """A message's kind (a str: a dict keyed by these also answers to the plain name)."""

    STARTED = "started"  # {"device", "env"}: what the parent needs to write a dead job's summary
    DATA = "data"  # the data source's label, for the same
    SUMMARY = "summary"  # the finished (or interrupted) job's summary, as written to summary.json
    USAGE = "usage"  # a bad value the user gave: its one-line message; nothing was written
    INTERRUPTED = "interrupted"  # True: Ctrl-C stopped the job (its summary follows when it had one)
    TERMINATED = "terminated"  # the signal number: SIGTERM or SIGHUP stopped the job
    CRASHED = "crashed"  # an error outside the job's own handling (CUDA failed to start): one line
    CHILD_SECONDS = "child_seconds"  # the job process's own run time, fork to last message
    PROGRESS = "progress"  # a results.live.Progress between steps, for the parent's live line
