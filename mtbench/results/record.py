"""What a run records about itself (docs/results.md "The run's record"): UTC start and end, versions, git, command line."""
from __future__ import annotations

import datetime
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import mtbench

GIT_TIMEOUT_S = 5.0  # a git that hangs (a network file system) must not hold the job's results back
CHECKOUT = Path(mtbench.__file__).resolve().parent.parent  # the folder above the package: a checkout's root, or site-packages


def utc_now() -> str:
    """The time now in UTC, ISO 8601 with its offset: '2026-12-01T22:35:35.123456+00:00'."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def command_line(argv: Optional[List[str]] = None) -> str:
    """The command as typed (sys.argv, each word quoted as a POSIX shell would need it)."""
    return " ".join(shlex.quote(a) for a in (sys.argv if argv is None else argv))


def git_state(root: Path = CHECKOUT) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """({commit, dirty}, None) where mtbench runs from a git checkout at `root`; (None, why) elsewhere. `dirty`:
    a tracked file differs from the commit (untracked files, e.g. results in outputs/, do not count)."""
    if not (root / ".git").exists():
        return None, f"mtbench does not run from a git checkout ({root} has no .git)"
    try:
        commit = _git(root, "rev-parse", "HEAD")
        status = _git(root, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError) as exc:
        text = str(getattr(exc, "stderr", "") or exc).strip().splitlines()
        return None, f"git could not read {root}: {text[-1] if text else type(exc).__name__}"
    return {"commit": commit, "dirty": bool(status)}, None


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                          check=True, env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})  # status must not write .git
    return done.stdout.strip()


def nvml_driver_version() -> Tuple[Optional[str], Optional[str]]:
    """(the NVIDIA driver's version as NVML gives it, None), or (None, why): no pynvml, no driver, or a Jetson
    (whose NVML answers NOT_SUPPORTED)."""
    try:
        import pynvml
    except ImportError:
        return None, "pynvml is not installed (pip install 'mtbench[nvidia]' adds nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, _NotSupported
        return None, f"NVML gives no driver version here: {type(exc).__name__}: {exc}"
    return version.decode() if isinstance(version, bytes) else str(version), None


def software_versions() -> Tuple[Dict[str, Any], Dict[str, str]]:
    """({mtbench, python, torch, cuda, cudnn, nvml_driver}, {field: why it is null}); torch's where this process has
    already loaded it (a job's always does; mtbench-sample's does not and says so)."""
    import platform

    versions: Dict[str, Any] = {"mtbench": mtbench.__version__, "python": platform.python_version(),
                                "torch": None, "cuda": None, "cudnn": None}
    reasons: Dict[str, str] = {}
    torch = sys.modules.get("torch")
    if torch is None:
        reasons["torch"] = reasons["cuda"] = reasons["cudnn"] = "torch was not loaded by this process"
    else:
        versions["torch"] = torch.__version__
        versions["cuda"] = torch.version.cuda
        if versions["cuda"] is None:
            reasons["cuda"] = "torch is a build without CUDA"
        # cuDNN's version is read from its library, without a CUDA context (the parent of a job never makes one)
        versions["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        if versions["cudnn"] is None:
            reasons["cudnn"] = "torch's cuDNN is not available"
    versions["nvml_driver"], why = nvml_driver_version()
    if why:
        reasons["nvml_driver"] = why
    return versions, reasons


def run_record(started_at: Optional[str], finished_at: Optional[str] = None,
               argv: Optional[List[str]] = None) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """(the keys a summary.json gains: started_at, finished_at (now where not given), mtbench_version, git,
    versions, command_line; {key: why it is null}, keys as summary.json's `unavailable` names them)."""
    versions, missing = software_versions()
    reasons = {f"versions.{k}": why for k, why in missing.items()}
    git, why = git_state()
    if why:
        reasons["git"] = why
    if started_at is None:
        reasons["started_at"] = "the job's start was not recorded"
    return {
        "started_at": started_at,
        "finished_at": finished_at or utc_now(),
        "mtbench_version": mtbench.__version__,
        "git": git,
        "versions": versions,
        "command_line": command_line(argv),
    }, reasons


def stamp(summary: Dict[str, Any], started_at: Optional[str], argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """`summary` with the run's record added (finished_at: now) and the reasons of its nulls in `unavailable`."""
    keys, reasons = run_record(started_at, argv=argv)
    summary.update(keys)
    summary["unavailable"] = {**(summary.get("unavailable") or {}), **reasons}
    return summary
