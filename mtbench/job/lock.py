"""The device lock: one measurement per device at a time, across processes and users."""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import sys
import time
from pathlib import Path
from typing import Optional, Tuple

import torch

from mtbench.config import check_value
from mtbench.device.select import lock_key
from mtbench.errors import UsageError
from mtbench.regular_files import RefusedFile, open_folder


POLL_S = 0.2  # how often a job with lock_timeout_s asks for the lock again


class DeviceLock:
    """One measurement per device at a time, across processes: an flock on `<lock_dir>/mtbench-<device>.lock`
    (the kernel releases it when the holder exits, however it ends). The file holds the holder's pid.

    The folder may be shared by every user (/tmp): the file is opened without following a link, only a regular
    file with one name is used, its mode is changed only when this call created it, and it is written (the pid)
    only when it is the caller's own. Another user's lock file is locked read-only (flock needs no write).
    """

    def __init__(self, device: torch.device, mode: str, lock_dir: str, timeout_s: Optional[float] = None) -> None:
        mode = check_value("device_lock", mode)
        if mode != "off" and not os.path.isabs(lock_dir):
            # an empty MTBENCH_LOCK_DIR= meant the current folder: jobs started in two folders never met
            raise UsageError(f"lock_dir={lock_dir!r} (or MTBENCH_LOCK_DIR) is not an absolute folder; allowed: an "
                             "absolute path every mtbench user can write (default /tmp), or device_lock=off")
        self.mode = mode
        self.timeout_s: Optional[float] = check_value("lock_timeout_s", timeout_s)
        self.name = str(device)
        key = lock_key(device)
        self.path = Path(lock_dir) / f"mtbench-{key}.lock"
        self.fd: Optional[int] = None
        self.writable = False

    def acquire(self) -> None:
        if self.mode == "off":
            return
        self.fd, self.writable = self._open()
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder()
            if self.mode == "fail":
                self.release()
                raise UsageError(f"{self.name} is being measured by another mtbench job ({holder}); "
                                 "device_lock=wait waits for it, device_lock=off measures anyway") from None
            limit = f", at most {self.timeout_s:g} s (lock_timeout_s)" if self.timeout_s is not None else ""
            print(f"mtbench: waiting for {self.name}: another mtbench job ({holder}) is measuring it{limit}",
                  file=sys.stderr, flush=True)
            waited = self._wait()
            print(f"mtbench: {self.name} is free after {waited:.1f} s of waiting", file=sys.stderr, flush=True)
        if self.writable:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, str(os.getpid()).encode(), 0)

    def _holder(self) -> str:
        """"pid N: its command" where the lock file names a process that is alive, else "pid unknown": the file may
        be another user's, and its text (terminal escapes, say) is never printed; the command is the kernel's
        (/proc/N/cmdline), printable characters only, cut at 100."""
        assert self.fd is not None
        raw = os.pread(self.fd, 32, 0).strip()
        if raw.isdigit() and 0 < int(raw) < 2**22:  # the kernel's largest pid
            try:
                os.kill(int(raw), 0)
            except PermissionError:  # another user's process: alive
                pass
            except OSError:
                return "pid unknown"
            command = _command(int(raw))
            return f"pid {int(raw)}: {command}" if command else f"pid {int(raw)}"
        return "pid unknown"

    def _wait(self) -> float:
        """Block until the lock is this job's (seconds waited); past lock_timeout_s, a UsageError."""
        assert self.fd is not None
        began = time.monotonic()
        if self.timeout_s is None:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            return time.monotonic() - began
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return time.monotonic() - began
            except BlockingIOError:
                pass
            if time.monotonic() - began >= self.timeout_s:
                holder = self._holder()
                self.release()
                raise UsageError(f"{self.name} is still being measured by another mtbench job ({holder}) after "
                                 f"{self.timeout_s:g} s (lock_timeout_s); allowed: a longer lock_timeout_s, null "
                                 "(wait as long as it takes), or device_lock=off (measure anyway)")
            time.sleep(POLL_S)

    def _open(self) -> Tuple[int, bool]:
        """(descriptor, whether this process may write its pid there); a UsageError where the file is refused."""
        folder, name = str(self.path.parent), self.path.name
        where = f"lock_dir={folder!r}: {name}"
        # the folder opened once, not followed if a link; every name below is opened in it (dir_fd)
        try:
            folder_fd = open_folder(folder)
        except FileNotFoundError:
            raise UsageError(f"lock_dir={folder!r} does not exist; allowed: an existing folder every mtbench user can "
                             "write (default /tmp), or device_lock=off") from None
        except RefusedFile as exc:
            raise UsageError(f"lock_dir={exc}; allowed: a folder (not a link) of this user or root, or a sticky "
                             "one (as /tmp), or device_lock=off") from None
        try:
            return self._open_in(folder_fd, name, where)
        finally:
            os.close(folder_fd)

    @staticmethod
    def _open_in(folder_fd: int, name: str, where: str) -> Tuple[int, bool]:
        # O_NOFOLLOW: a link planted in a shared folder would point the open (and a chmod) at another file;
        # O_NONBLOCK: a planted FIFO must not block the open; O_EXCL: a file this call creates is its own
        flags = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(name, flags | os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666, dir_fd=folder_fd)
            os.fchmod(fd, 0o666)  # the umask took the others' write bit: every user shares this lock
            return fd, True
        except FileExistsError:
            pass  # another job's (or a planted) file: judged below
        except OSError as exc:
            raise UsageError(f"{where} cannot be created ({exc.strerror}); allowed: a writable folder, "
                             "or device_lock=off") from None
        try:
            try:
                fd, writable = os.open(name, flags | os.O_RDWR, dir_fd=folder_fd), True
            except PermissionError:  # another user's file (or fs.protected_regular in /tmp): flock needs no write
                fd, writable = os.open(name, flags | os.O_RDONLY, dir_fd=folder_fd), False
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UsageError(f"{where} is a symbolic link, refused (another user may have planted it); "
                                 "allowed: a regular file, or remove the link, or device_lock=off") from None
            raise UsageError(f"{where} cannot be opened ({exc.strerror}); allowed: a folder every mtbench user "
                             "can write, or device_lock=off") from None
        info = os.fstat(fd)
        problem = None
        if not stat.S_ISREG(info.st_mode):
            problem = "is not a regular file"
        elif info.st_nlink != 1:
            problem = f"has {info.st_nlink} hard links (it may be another file's name)"
        if problem is not None:
            os.close(fd)
            raise UsageError(f"{where} {problem}, refused; allowed: a regular lock file of one name, or remove it, "
                             "or device_lock=off")
        return fd, writable and info.st_uid == os.geteuid()  # never write into another user's file

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None


def _command(pid: int, limit: int = 100) -> str:
    """Process `pid`'s command line as the kernel has it, printable characters only, cut at `limit`; "" where it
    cannot be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(4096)
    except OSError:
        return ""
    text = " ".join(part.decode("utf-8", "replace") for part in raw.split(b"\0") if part)
    text = "".join(c for c in text if c.isprintable())
    return text if len(text) <= limit else text[:limit] + "..."

