"""Reading small numeric sysfs / procfs attribute files cheaply and safely from the sampler thread."""
from __future__ import annotations

import os
from typing import Optional


class AttrFile:
    """One numeric attribute file, kept open and re-read with pread from offset 0.

    A read that fails (the device went away: ENODEV, EIO) or a file unlinked since it was opened gives
    None, and the next read tries to open the path again, so a rail that comes back is picked up.
    """

    CHECK_EVERY = 16  # reads between checks that the open file is still linked (fstat is a syscall)

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: Optional[int] = os.open(path, os.O_RDONLY)
        self._reads = 0

    def _reopen(self) -> bool:
        self.close()
        try:
            self.fd = os.open(self.path, os.O_RDONLY)
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
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def parse_int(raw: Optional[bytes]) -> Optional[int]:
    """The first number in an attribute file's bytes; None for nothing or garbage (never 0)."""
    try:
        return int(raw.split()[0]) if raw is not None else None
    except (ValueError, IndexError):
        return None
