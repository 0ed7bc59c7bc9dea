"""Reading small numeric sysfs / procfs attribute files cheaply and safely from the sampler thread.

Nothing under a configurable root is opened unless it is a regular file (sysfs attributes are): a FIFO or a
device planted at a rail file or at etc/nv_tegra_release would block the open, or the read, before step 0.
So every open is O_NONBLOCK|O_NOFOLLOW, fstat must say S_ISREG, and reads stop at a size limit.
"""
from __future__ import annotations

import os
from typing import Optional

from mtbench.regular_files import open_regular_fd as open_regular, read_head

MAX_TEXT_BYTES = 1 << 16  # an attribute or a release file is a few bytes; nvpmodel.conf a few kB


def read_small(path: str, limit: int = MAX_TEXT_BYTES) -> Optional[bytes]:
    """The first `limit` bytes of a regular file; None when it is missing, unreadable or not a regular file."""
    try:
        return read_head(path, limit)
    except OSError:  # RefusedFile too
        return None


class AttrFile:
    """One numeric attribute file, kept open and re-read with pread from offset 0.

    A read that fails (the device went away: ENODEV, EIO) or a file unlinked since it was opened gives
    None, and the next read tries to open the path again, so a rail that comes back is picked up.
    """

    CHECK_EVERY = 16  # reads between checks that the open file is still linked (fstat is a syscall)

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: Optional[int] = open_regular(path)
        self._reads = 0

    def _reopen(self) -> bool:
        self.close()
        try:
            self.fd = open_regular(self.path)
            return True
        except OSError:
            return False

    def read_bytes(self) -> Optional[bytes]:
        """The file's bytes now; None when it could not be read (parse later with `parse_int`)."""
        if self.fd is None and not self._reopen():
            return None
        self._reads += 1
        try:
            if self._reads % self.CHECK_EVERY == 0 and os.fstat(self.fd).st_nlink == 0 and not self._reopen():
                return None
            return os.pread(self.fd, 64, 0)
        except OSError:
            self.close()
            return None

    def read_int(self) -> Optional[int]:
        return parse_int(self.read_bytes())

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None


def read_text(path: str) -> Optional[str]:
    raw = read_small(path)
    return None if raw is None else raw.decode("utf-8", "replace").replace("\x00", "").strip()


def parse_int(raw: Optional[bytes]) -> Optional[int]:
    """The first number in an attribute file's bytes; None for nothing or garbage (never 0)."""
    try:
        return int(raw.split()[0]) if raw is not None else None
    except (ValueError, IndexError):
        return None
