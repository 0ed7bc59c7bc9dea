"""Reading a file a user names, as root may: a regular file only (never a link, FIFO, device or folder), within a
size limit, so a planted name neither redirects the read nor blocks a job before its first step."""
from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

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
