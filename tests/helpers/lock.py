"""A device lock held by the test itself, as another mtbench job holds it (the lock file names its pid)."""
from __future__ import annotations

import fcntl
import os


def held_lock(folder, text: bytes) -> int:
    """The cpu lock in `folder` held by this process through a descriptor of its own (close it to release),
    its file holding `text`."""
    fd = os.open(os.path.join(str(folder), "mtbench-cpu.lock"), os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, text)
    return fd
