"""data.cache=warm|cold and where a set's files live: dropping them from the page cache, the storage device they are
on (from /proc/self/mountinfo and /sys/block) and the bytes the job's processes read from storage.

Cold drops each file with posix_fadvise(POSIX_FADV_DONTNEED) after flushing it (dirty pages cannot be dropped),
then asks mincore(2) how many of its pages are still in memory: a filesystem that lives in memory (tmpfs) keeps
them all, and the cold run is then recorded as not cold, with the reason. data.cache=drop_caches writes 1 to
/proc/sys/vm/drop_caches (every file's clean pages, the whole machine's; root only) instead.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

from mtbench.errors import UsageError
from mtbench.regular_files import KIB, RefusedFile, open_regular_fd, read_head

PAGE_BYTES = mmap.PAGESIZE
MEMORY_FILESYSTEMS = ("tmpfs", "ramfs", "devtmpfs", "hugetlbfs")


def resident_pages(fd: int) -> Optional[int]:
    """Pages of the open file `fd` in the page cache (mincore(2) over a private mapping that touches none), or None
    where it cannot be asked."""
    size = os.fstat(fd).st_size
    if size == 0:
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mapped = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)  # copy-on-write: writable for ctypes, file untouched
    except (OSError, ValueError):
        return None
    try:
        anchor = ctypes.c_char.from_buffer(mapped)
        pages = (size + PAGE_BYTES - 1) // PAGE_BYTES
        vec = (ctypes.c_ubyte * pages)()
        failed = libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec)
        del anchor
        return None if failed else sum(v & 1 for v in vec)
    finally:
        mapped.close()


def make_cold(files: Sequence[str], how: str, proc_root: str = "/proc") -> Dict[str, Any]:
    """Drop `files` from the page cache (`how`: cold or drop_caches); what was done, the pages still resident, and
    `not_cold_reason` (null where every page left memory)."""
    if how == "drop_caches":
        # the whole machine's, not the job's: say so before doing it
        print("mtbench: data.cache=drop_caches: syncing every file system and dropping the whole machine's page "
              "cache (every process's cached files, not only this job's; data.cache=cold drops the job's files "
              "alone)", file=sys.stderr, flush=True)
        try:
            os.sync()  # dirty pages are not dropped: write them first
            with open(os.path.join(proc_root, "sys/vm/drop_caches"), "w") as f:
                f.write("1")
        except OSError as exc:
            raise UsageError(f"data.cache=drop_caches: cannot write {proc_root}/sys/vm/drop_caches ({exc.strerror}; "
                             "it needs root); allowed: data.cache=cold (posix_fadvise per file) or warm") from None
    total = resident = 0
    unknown = False
    for path in files:
        try:
            fd = open_regular_fd(path)
        except (RefusedFile, FileNotFoundError):
            continue  # the loader names it in its own error when it reads it
        try:
            if how == "cold":
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += (os.fstat(fd).st_size + PAGE_BYTES - 1) // PAGE_BYTES
            left = resident_pages(fd)
            unknown = unknown or left is None
            resident += left or 0
        finally:
            os.close(fd)
    reason = None
    if unknown:
        reason = "mincore(2) could not say which pages stayed in memory"
    elif resident:
        fstype = (mount_of(files[0], proc_root) or {}).get("fstype") if files else None
        where = f"the filesystem ({fstype}) keeps" if fstype else "the kernel kept"
        reason = (f"{where} {resident} of the set's {total} pages in memory after "
                  + ("posix_fadvise(DONTNEED)" if how == "cold" else "drop_caches")
                  + (": it lives in memory, no storage is read" if fstype in MEMORY_FILESYSTEMS else ""))
    return {"how": "posix_fadvise_dontneed" if how == "cold" else "drop_caches", "pages": total,
            "pages_resident_after": None if unknown else resident, "not_cold_reason": reason}


def _unescape(field: str) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes are written as octal escapes (\\040)."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field


def mount_of(path: str, proc_root: str = "/proc") -> Optional[Dict[str, str]]:
    """The mount `path` lies on: {mount_point, fstype, source, dev ("major:minor")}, from <proc_root>/self/mountinfo
    (the entry with the file's device whose mount point is the longest prefix of its real path)."""
    try:
        info = os.stat(path)
        text = read_head(os.path.join(proc_root, "self", "mountinfo"), 4096 * KIB).decode(errors="replace")
    except OSError:
        return None
    real = os.path.realpath(path)
    dev = f"{os.major(info.st_dev)}:{os.minor(info.st_dev)}"
    best: Optional[Dict[str, str]] = None
    for line in text.splitlines():
        fields = line.split(" ")
        if "-" not in fields[6:] or len(fields) < 7:
            continue
        tail = fields[fields.index("-", 6) + 1:]
        point = _unescape(fields[4])
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if fields[2] == dev and inside and len(tail) >= 2 and (best is None or len(point) > len(best["mount_point"])):
            best = {"mount_point": point, "fstype": tail[0], "source": _unescape(tail[1]), "dev": dev}
    return best


def _sysfs(path: str) -> Optional[str]:
    try:
        return read_head(path, 4 * KIB).decode(errors="replace").strip()
    except OSError:
        return None


def block_device(dev: str, sys_root: str = "/sys") -> Optional[Dict[str, Any]]:
    """The disk behind device number `dev` ("major:minor"): {name, kind, rotational}, from
    <sys_root>/dev/block/<dev> (a partition's disk is its parent) and <sys_root>/block/<disk>; None for none."""
    link = os.path.join(sys_root, "dev", "block", dev)
    try:
        target = os.readlink(link)
    except OSError:
        return None
    name = os.path.basename(target.rstrip("/"))
    if os.path.exists(os.path.join(link, "partition")):
        name = os.path.basename(os.path.dirname(target.rstrip("/")))
    disk = os.path.join(sys_root, "block", name)
    rotational = _sysfs(os.path.join(disk, "queue", "rotational"))
    if name.startswith("mmcblk"):
        card = _sysfs(os.path.join(disk, "device", "type"))  # "SD" for a card, "MMC" for soldered eMMC
        kind = {"SD": "sd", "MMC": "emmc"}.get(card or "", "mmc")
    elif name.startswith("nvme"):
        kind = "nvme"
    elif name.startswith(("vd", "xvd")):
        kind = "virtual_disk"
    elif name.startswith(("loop", "dm-", "md", "zram", "nbd")):
        kind = name.rstrip("0123456789").rstrip("-")
    else:  # sd*: SATA, SAS or USB
        kind = "rotational" if rotational == "1" else "ssd"
    return {"name": name, "kind": kind, "rotational": None if rotational is None else rotational == "1"}


def storage_of(path: str, proc_root: str = "/proc", sys_root: str = "/sys") -> Dict[str, Any]:
    """Where `path` is stored: its mount and its disk (null with the reason where it has none: tmpfs, overlay)."""
    mount = mount_of(path, proc_root)
    if mount is None:
        return {"mount_point": None, "device": None, "reason": f"{path} is in no mount of {proc_root}/self/mountinfo"}
    device = block_device(mount["dev"], sys_root)
    out: Dict[str, Any] = {**mount, "device": device}
    if device is None:
        out["reason"] = (f"{mount['fstype']} at {mount['mount_point']} has no block device (device {mount['dev']} "
                         f"is not in {sys_root}/dev/block)")
    return out


def device_sectors_read(name: str, sys_root: str = "/sys") -> Optional[int]:
    """Sectors (512 bytes) read from disk `name` since boot, by every process (<sys_root>/block/<name>/stat)."""
    text = _sysfs(os.path.join(sys_root, "block", name, "stat"))
    try:
        return int(text.split()[2]) if text else None
    except (IndexError, ValueError):
        return None


def read_bytes(pids: Sequence[Optional[int]], proc_root: str = "/proc") -> Dict[Optional[int], Optional[int]]:
    """Bytes each process made storage fetch (read_bytes of /proc/<pid>/io; a process's count holds its reaped
    children's too); None where it is gone or the kernel keeps no I/O accounting."""
    out: Dict[Optional[int], Optional[int]] = {}
    for pid in pids:
        text = _sysfs(os.path.join(proc_root, "self" if pid is None else str(pid), "io"))
        value = None
        for line in (text or "").splitlines():
            if line.startswith("read_bytes:"):
                value = int(line.split()[1])
        out[pid] = value
    return out


def files_bytes(files: List[str]) -> int:
    """The set's size on disk: the bytes of its files."""
    return sum(os.stat(f).st_size for f in files if os.path.isfile(f))
