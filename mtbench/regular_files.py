"""Files as root may read and write them: a regular file only (never a link, FIFO, device or folder), within a size
limit, and every result written under a fresh name then renamed, so a planted name redirects neither."""
from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO, Optional

KIB, MIB, GIB = 2**10, 2**20, 2**30


class RefusedFile(OSError):
    """A path that is not a readable regular file of acceptable size; the message names it and why."""


def open_regular_fd(path: str) -> int:
    """A read-only descriptor of `path`, or RefusedFile (FileNotFoundError where it does not exist).

    O_NOFOLLOW: a link in the last component is refused, not followed (a folder above may be a link: that is
    the owner's layout, not a plant). O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RefusedFile(f"{path} is a symbolic link, refused (give the file it points to: "
                              f"{os.path.realpath(path)})") from None
        raise RefusedFile(f"{path}: cannot open ({exc.strerror})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise RefusedFile(f"{path} is {_kind(info.st_mode)}, not a regular file, refused")
    return fd


def open_folder(path: str) -> int:
    """A descriptor of folder `path` to open names in (`dir_fd=`), or RefusedFile (FileNotFoundError where it does
    not exist): the folder itself may not be a link (one planted in a shared folder would send root's files into
    another folder), and one owned by another user must not let others write it unless sticky (/tmp's mode)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path):
            raise RefusedFile(f"{path} is a symbolic link, refused (another user may have planted it; give the "
                              f"folder it points to: {os.path.realpath(path)})") from None
        raise RefusedFile(f"{path}: cannot open it as a folder ({exc.strerror})") from None
    info = os.fstat(fd)
    others_write = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX
    if info.st_uid not in (0, os.geteuid()) and others_write:
        os.close(fd)
        raise RefusedFile(f"{path} belongs to uid {info.st_uid} and other users may write it (no sticky bit), "
                          "refused")
    return fd


def folder_problem(path: str) -> Optional[str]:
    """Why another user could change what lies in folder `path` (None where nobody else can): it is a link, or it
    belongs to a user other than this one and root, or others may write it without the sticky bit (they could then
    swap a file, or a folder, that this process made there for one of their own)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None  # made by this process when it is needed
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if info.st_uid not in (0, os.geteuid()):
        return f"belongs to uid {info.st_uid}, another user"
    if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        return "may be written by every user (mode o+w without the sticky bit)"
    return None


def open_regular(path: str) -> BinaryIO:
    """`path` opened for reading in binary mode (see `open_regular_fd`)."""
    return os.fdopen(open_regular_fd(path), "rb")


def read_head(path: str, limit_bytes: int) -> bytes:
    """At most the first `limit_bytes` of regular file `path` (a sysfs attribute, a release file)."""
    with open_regular(path) as f:
        return f.read(limit_bytes)


def read_regular(path: str, limit_bytes: int) -> bytes:
    """The whole of regular file `path`, or RefusedFile where it is not one or is larger than `limit_bytes`."""
    with open_regular(path) as f:
        data = f.read(limit_bytes + 1)
    if len(data) > limit_bytes:
        raise RefusedFile(f"{path} is larger than {_size(limit_bytes)}, refused")
    return data


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _size(n: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} bytes"


_UMASK = os.umask(0)
os.umask(_UMASK)
FILE_MODE = 0o666 & ~_UMASK  # what open() would have made


def write_whole(path: str, data: bytes, mode: Optional[int] = None, sync: bool = True) -> None:
    """`data` as the whole of file `path`, the one way mtbench writes a file: under a fresh name in the same folder
    (O_CREAT|O_EXCL|O_NOFOLLOW: never an existing file or a planted link), then renamed over `path` (a link planted
    there is replaced, never followed). A reader sees the old file or the new one, never half of one."""
    folder, name = os.path.split(os.fspath(path))
    for n in range(100):
        tmp = os.path.join(folder, f".{name}.{os.getpid()}.{n}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(errno.EEXIST, f"100 temporary names taken beside {path}", tmp)
    try:
        os.fchmod(fd, FILE_MODE if mode is None else mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def create_fresh(path: str, mode: Optional[int] = None) -> BinaryIO:
    """A new, empty file at `path` open for writing (a log written as it goes): what was at `path` (an old file, a
    planted link) is removed, never followed, and the create is O_EXCL|O_NOFOLLOW, so that a link planted between
    the two fails it (FileExistsError) instead of being written through."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 FILE_MODE if mode is None else mode)
    return os.fdopen(fd, "wb")
