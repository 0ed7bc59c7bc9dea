"""Another user of a shared board: a folder every user may write (sticky, as /tmp), and steps run as `nobody`."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import Callable

import pytest

NOBODY = 65534  # Debian's and Ubuntu's `nobody` and `nogroup`


def need_root() -> None:
    """Skip (saying why) where this test cannot act as another user: it must run as root to switch to `nobody`."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("runs as root to plant files as user nobody (the attack needs two users)")


def shared_folder() -> str:
    """A fresh folder under the system's temporary folder that every user may write, sticky as /tmp is; removed with
    what was planted in it when the test process ends (shutil.rmtree follows no link it finds there)."""
    folder = tempfile.mkdtemp(prefix="mtbench-shared-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.chmod(folder, 0o1777)
    return folder


def as_nobody(step: Callable[[], None]) -> None:
    """Run `step` in a forked child that has dropped to uid and gid `nobody` (what another user of the board can
    do); an exception in it fails the test."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            step()
            code = 0
        except BaseException:  # noqa: BLE001 - said on stderr, then the exit status carries it
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the step as nobody failed (status {status})"
