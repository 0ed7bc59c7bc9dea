"""Result folders are claimed before a run writes into them: a default folder taken by another run gives way to
the next free name, an explicit one that holds another run's results is refused (unless resume=true)."""
from __future__ import annotations

import errno
import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from mtbench.errors import UsageError
from mtbench.regular_files import read_regular, write_whole

CLAIM = ".mtbench-claim"  # JSON: pid, host and start time of the run that writes into the folder
DIR_KEYS = ("hydra.run.dir", "hydra.sweep.dir")


def claim_explicit_dirs(args: List[str]) -> None:
    """For `hydra.run.dir=D` / `hydra.sweep.dir=D` given on the command line: refuse D when another run is
    writing there, or (without resume=true) when an earlier run's results are there; else claim it."""
    values = _explicit(args)
    resume = values.get("resume", "false").lower() == "true"
    key = "hydra.sweep.dir" if ("-m" in args or "--multirun" in args) else "hydra.run.dir"  # the one Hydra uses
    folder = values.get(key)
    if folder is not None and "${" not in folder:  # an interpolation: the default's own claim (free_dir) applies
        _claim(Path(folder), key, resume)
    elif folder is None:  # the default, under the current folder: said here, not in a traceback from its resolver
        default = Path("multirun" if key == "hydra.sweep.dir" else "outputs")
        made = not os.path.lexists(default)
        try:
            writable_folder(default, "")
        except UsageError:
            raise UsageError(f"the results go to {default}/ in the current folder ({os.getcwd()}), which this user "
                             f"cannot write; allowed: run from a folder this user can write, or {key}=DIR") from None
        try:
            check_room(default)
        except OSError as exc:
            if made:
                os.rmdir(default)
            raise UsageError(f"the results go to {default}/ in the current folder ({os.getcwd()}), which cannot be "
                             f"written ({exc.strerror or exc}); allowed: a folder on a file system with room, or "
                             f"{key}=DIR") from None


def _explicit(args: List[str]) -> Dict[str, str]:
    found: Dict[str, str] = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        if sep and key.lstrip("+") in (*DIR_KEYS, "resume"):
            found[key.lstrip("+")] = value
    return found


def _claim(folder: Path, key: str, resume: bool) -> None:
    if folder.is_dir():
        other = _claim_of(folder)
        if other is not None and _alive(other):
            raise UsageError(f"{key}={folder} is being written by another mtbench run ({_describe(other)}); "
                             "allowed: another folder, or wait for that run to end")
        if not resume and (other is not None or _has_results(folder)):
            who = f" ({_describe(other)})" if other is not None else ""
            raise UsageError(f"{key}={folder} already holds the results of another run{who}; nothing there is "
                             "replaced: allowed: another folder, or resume=true to finish that run")
    elif folder.exists() or folder.is_symlink():
        return  # not a folder: Hydra's own check (and the command line's) says so in one line
    try:
        folder.mkdir(parents=True, exist_ok=True)
        check_room(folder)
        _write_claim(folder)
    except OSError as exc:  # a full disk: Hydra's first write of the config would end in a traceback
        raise UsageError(f"{key}={folder} cannot be written ({exc.strerror or exc}); allowed: a folder on a file "
                         "system with room that this user can write") from None


ROOM_BYTES = 1 << 16  # what the first result files need at least: the config Hydra saves, the claim, the log


def check_room(folder: Path) -> None:
    """OSError where `folder` has no room for ROOM_BYTES (reserved with posix_fallocate, so a full file system says
    so now, not at a later write; then removed)."""
    fd, probe = tempfile.mkstemp(prefix=".mtbench-room-check-", dir=str(folder))
    try:
        try:
            os.posix_fallocate(fd, 0, ROOM_BYTES)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):  # a file system without it
                raise
            os.write(fd, bytes(ROOM_BYTES))
    finally:
        os.close(fd)
        os.unlink(probe)


def _write_claim(folder: Path) -> None:
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
    # a claim left by a finished (or dead) earlier run is replaced by this one
    write_whole(str(folder / CLAIM), json.dumps(record).encode(), mode=0o644, sync=False)


def _claim_of(folder: Path) -> Optional[Dict[str, Any]]:
    if not os.path.lexists(folder / CLAIM):
        return None
    try:
        record = json.loads(read_regular(str(folder / CLAIM), 4096).decode("utf-8"))
    except (OSError, ValueError):  # RefusedFile too: a link or FIFO planted as the claim
        return {"pid": None, "host": None, "started": None}  # a claim we cannot read is still a claim
    return record if isinstance(record, dict) else {"pid": None, "host": None, "started": None}


def _alive(claim: Dict[str, Any]) -> bool:
    """The claiming run is still running (same host, its pid alive and not this process)."""
    pid = claim.get("pid")
    if not isinstance(pid, int) or claim.get("host") != socket.gethostname() or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def _describe(claim: Dict[str, Any]) -> str:
    started = claim.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {claim.get('pid', '?')} on {claim.get('host', '?')}, started {when}"


def _has_results(folder: Path) -> bool:
    """An earlier run wrote here: a job's summary or Hydra's record of a job (.hydra/), at most two levels down."""
    for pattern in ("summary.json", ".hydra", "*/summary.json", "*/.hydra"):
        if any(folder.glob(pattern)):
            return True
    return False


def dated_dir(top: str) -> str:
    """A command's default results folder, in the one scheme of docs/results.md ("Where results go"):
    TOP/<YYYY-MM-DD>/<HH-MM-SS>, the first free name (free_dir), made now. Runs and sweeps get theirs from
    conf/config.yaml (outputs/..., multirun/..., Hydra's convention) in the same shape."""
    now = time.localtime()
    return free_dir(os.path.join(top, time.strftime("%Y-%m-%d", now), time.strftime("%H-%M-%S", now)))


def free_dir(path: str) -> str:
    """`path`, or `path-2`, `path-3` ... : the first that did not exist, made now (atomically: os.mkdir), so two
    runs started in the same second never share a default folder. Hydra's resolver cache keeps the answer for a
    config (and hands it to a sweep's jobs), so one run asks once."""
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    for n in range(1, 10000):
        candidate = path if n == 1 else f"{path}-{n}"
        try:
            os.mkdir(candidate)
            return candidate
        except FileExistsError:
            continue
    raise UsageError(f"{path}: 10,000 folders of that name exist; allowed: a folder of your own (hydra.run.dir=...)")


def writable_folder(path: Path, what: str) -> Path:
    """`path` made (with its parents) and shown writable now, before any work: a UsageError naming `what` (the
    option) where it is a file, under a file, or a folder this user cannot write (/proc, a read-only mount)."""
    import tempfile

    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".mtbench-write-check-", dir=str(path))
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"{what}{'' if what.endswith('=') else ' '}{str(path)!r} is not a folder this user can "
                         f"write ({exc.strerror or exc}); "
                         "allowed: a new or existing folder this user can write") from None
    return path
