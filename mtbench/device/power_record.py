"""The machine's power restore file: what a run changed on the device, so that the next run restores it should the
run itself die (`<power root>/run/mtbench/mtbench-power-restore.json`), and the sweep's hold of one record for all
its jobs.

One file per device, whatever lock_dir a run uses: it lies under the device's own root (power.sysfs_root, / on the
machine itself: /run/mtbench, a root-owned tmpfs cleared at boot as the settings are). Root acts on the file's
content (it writes sysfs files): it is written under a fresh name (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600) in a
folder of mode 0700 and renamed into place, and read only when it is a regular file of one name, owned by this user
and writable by no other; anything else is refused in one line.
"""
from __future__ import annotations

import json
import os
import stat
from typing import Any, Dict, Optional

from mtbench.errors import UsageError
from mtbench.regular_files import RefusedFile, open_folder, open_regular_fd, write_whole

NAME = "mtbench-power-restore.json"
HOLD_ENV = "MTBENCH_POWER_HOLD"  # set by a sweep (campaign/power_hold.py): its jobs keep their settings
MAX_BYTES = 1 << 20


FOLDER = os.path.join("run", "mtbench")


def path_for(root: str) -> str:
    """Where the restore file of the device whose files lie under `root` (power.sysfs_root) is kept: one place per
    device, so that two runs with different lock_dirs (a container's own /tmp) see each other's record."""
    if not os.path.isabs(root):
        raise UsageError(f"power.sysfs_root={root!r} is not an absolute folder; allowed: an absolute folder (default /)")
    folder = os.path.join(root, FOLDER)
    try:
        os.close(open_folder(folder))  # not a link, nor another user's folder that others may write
    except FileNotFoundError:
        pass  # made, mode 0700, by the first write
    except RefusedFile as exc:
        raise UsageError(f"the power restore folder {exc}; allowed: a folder (not a link) of this user or root") \
            from None
    return os.path.join(folder, NAME)


def start_ticks(pid: int) -> Optional[int]:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat field 22): with the pid it names one
    process, whatever later reuses the number. None where there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
        return int(text[text.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def owner(pid: Optional[int] = None) -> Dict[str, Any]:
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "start": start_ticks(pid)}


def alive(record: Dict[str, Any]) -> bool:
    """Whether the run that wrote `record` still runs (then its settings are its own, not a leftover)."""
    pid = record.get("pid")
    return isinstance(pid, int) and record.get("start") is not None and start_ticks(pid) == record.get("start")


def read(path: str) -> Optional[Dict[str, Any]]:
    """The record at `path`, None where there is none; UsageError (one line) for a file this user must not trust."""
    try:
        fd = open_regular_fd(path)
    except FileNotFoundError:
        return None
    except RefusedFile as exc:
        raise UsageError(f"the power restore file {exc}; remove it (lock_dir decides where it lives)") from None
    try:
        info = os.fstat(fd)
        problem = None
        if info.st_uid != os.geteuid():
            problem = f"belongs to uid {info.st_uid}, not to this user ({os.geteuid()})"
        elif info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            problem = "is writable by other users"
        elif info.st_nlink != 1:
            problem = f"has {info.st_nlink} hard links"
        if problem is not None:
            raise UsageError(f"the power restore file {path} {problem}, refused (root would act on what it says); "
                             "remove it if no mtbench run of this user wrote it")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_BYTES + 1)
    finally:
        os.close(fd)
    try:
        record = json.loads(data) if len(data) <= MAX_BYTES else None
    except ValueError:
        record = None
    if not isinstance(record, dict):
        raise UsageError(f"the power restore file {path} is not a restore record (larger than 1 MiB, or not JSON); "
                         "remove it")
    problem = shape_problem(record)
    if problem is not None:
        raise UsageError(f"the power restore file {path} is not a restore record ({problem}); remove it")
    return record


def shape_problem(record: Dict[str, Any]) -> Optional[str]:
    """Why `record` is not what this module writes (None where it is): root acts on each field."""
    if not isinstance(record.get("root"), (str, type(None))):
        return "root must be a folder"
    mode = record.get("nvpmodel")
    if mode is not None and (isinstance(mode, bool) or not isinstance(mode, int) or mode < 0):
        return "nvpmodel must be a mode id"
    files = record.get("files")
    if files is not None and (not isinstance(files, list) or not all(
            isinstance(f, list) and len(f) == 2 and all(isinstance(part, str) for part in f) for f in files)):
        return "files must be [path, value] pairs of texts"
    if not isinstance(record.get("nvml"), (dict, type(None))):
        return "nvml must be a table of settings"
    for key in ("pid", "start"):
        if record.get(key) is not None and (isinstance(record[key], bool) or not isinstance(record[key], int)):
            return f"{key} must be a whole number"
    return None


def write(path: str, record: Dict[str, Any]) -> None:
    """Write `record` to `path` whole: a fresh private file renamed into place (a link planted at `path` is
    replaced, never followed)."""
    folder = os.path.dirname(path)
    try:  # the machine's folder made private where it is missing (a job's folder exists already)
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot make the power restore folder {folder} ({exc.strerror}); power.* keys need "
                         "root") from None
    try:  # fsynced: the record must outlive a crash of the machine's power settings' owner
        write_whole(path, json.dumps(record).encode(), mode=0o600)
    except FileExistsError:
        raise UsageError(f"cannot create a power restore file in {os.path.dirname(path)}: 100 names taken") from None


def remove(path: str, pid: Optional[int] = None) -> None:
    """Remove the record at `path` (only where run `pid` wrote it, if given)."""
    try:
        if pid is not None and (read(path) or {}).get("pid") != pid:
            return
        os.unlink(path)
    except (OSError, UsageError):
        pass


def merge(held: Dict[str, Any], record: Dict[str, Any]) -> Dict[str, Any]:
    """The device as it was before the first job of a sweep: `held`'s values win, `record` adds what is new."""
    out = dict(held)
    out["root"] = held.get("root") or record.get("root")
    if out.get("nvpmodel") is None:
        out["nvpmodel"] = record.get("nvpmodel")
    known = {rel for rel, _ in held.get("files") or []}
    out["files"] = list(held.get("files") or []) + [f for f in record.get("files") or [] if f[0] not in known]
    if out.get("nvml") is None:
        out["nvml"] = record.get("nvml")
    out["nvml_locked"] = bool(held.get("nvml_locked") or record.get("nvml_locked"))
    return out
