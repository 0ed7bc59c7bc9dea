"""`mtbench models`' cache: each model's row (parameters, FLOPs per sample, ...) per model and overrides, on disk.

Counting a model's FLOPs builds it and runs one training step on the meta device (~0.1-5 s a model), and composing
its config costs ~0.1 s more; the row depends only on the model's name, the overrides, the files in conf/, torch's
version and mtbench's model code, so it is kept under the user's cache folder (`$XDG_CACHE_HOME/mtbench/models`, else `~/.cache/mtbench/models`), one file
per key, and counted again when any of those change. Folders are made 0700 and never followed where they are
links; each file is written under a fresh name (mkstemp: O_EXCL) and renamed into place, and read back as a
regular file of bounded size: a planted link or FIFO is a cache miss, never read.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from mtbench.regular_files import KIB, read_regular
from mtbench.results.files import atomic_write

log = logging.getLogger("mtbench")
CACHE_FORMAT = 1  # bumped when what a file holds changes
MAX_FILE_BYTES = 16 * KIB
# the code a row depends on: the models, the workload interface and plans, the data shapes, the counting itself
CODE_DIRS = ("models", "mtbench/workload", "mtbench/data")
CODE_FILES = ("mtbench/report/flops.py", "mtbench/report/catalog.py")
ROOT = Path(__file__).resolve().parent.parent.parent
ROW_FIELDS = ("name", "parameters", "paper_params", "flops_per_sample", "flops_note", "description")  # catalog.ModelRow


def default_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mtbench" / "models"


def code_digest(root: Path = ROOT) -> str:
    """A digest of the source files a row depends on (their paths and contents)."""
    digest = hashlib.sha256()
    files = [root / f for f in CODE_FILES]
    for folder in CODE_DIRS:
        files.extend(sorted((root / folder).glob("*.py")))
    for path in files:
        digest.update(str(path.relative_to(root)).encode())
        try:
            digest.update(path.read_bytes())
        except OSError:
            digest.update(b"<missing>")
    return digest.hexdigest()


def conf_digest(conf: Path) -> str:
    """A digest of every YAML file under conf/ (a model's, a data set's, the defaults)."""
    digest = hashlib.sha256()
    for path in sorted(conf.rglob("*.yaml")):
        digest.update(str(path.relative_to(conf)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def torch_version() -> str:
    """torch's version from its installed metadata: no torch import for a cached listing."""
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # noqa: BLE001 - no metadata (a source tree on the path): the import says it
        import torch

        return str(torch.__version__)


class FlopCache:
    """Rows keyed by (model name, overrides, a digest of conf/ and of the model code, torch's version)."""

    def __init__(self, folder: Optional[Path] = None) -> None:
        self.folder = Path(folder) if folder is not None else default_dir()
        self._salt: Optional[str] = None
        self.hits = self.misses = 0

    def key(self, name: str, overrides: Sequence[str]) -> str:
        if self._salt is None:
            from mtbench.config import conf_dir

            self._salt = f"{CACHE_FORMAT}|{torch_version()}|{code_digest()}|{conf_digest(Path(conf_dir()))}"
        text = json.dumps({"name": name, "overrides": list(overrides), "salt": self._salt})
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def load(self, key: str) -> Optional[Dict[str, Any]]:
        """The stored row, or None (absent, unreadable, a link, or not a row)."""
        try:
            row = json.loads(read_regular(str(self.folder / f"{key}.json"), MAX_FILE_BYTES))
        except (OSError, ValueError):
            self.misses += 1
            return None
        ok = (isinstance(row, dict) and set(row) == set(ROW_FIELDS) and isinstance(row["parameters"], int)
              and isinstance(row["flops_per_sample"], (int, float, type(None))) and isinstance(row["flops_note"], str)
              and isinstance(row["name"], str) and isinstance(row["description"], str)
              and isinstance(row["paper_params"], (int, float, type(None))))
        self.hits += ok
        self.misses += not ok
        return row if ok else None

    def store(self, key: str, row: Dict[str, Any]) -> None:
        """Keep `row`; a cache that cannot be written is a debug line, never an error (the listing stands)."""
        try:
            _make_dirs(self.folder)
            atomic_write(self.folder / f"{key}.json", json.dumps(row) + "\n")
        except OSError as exc:
            log.debug("the models cache %s cannot be written: %s", self.folder, exc)


def _make_dirs(folder: Path) -> None:
    """`folder` and its missing parents, each new one 0700; an existing one that is a link is refused."""
    missing = []
    path = folder
    while not path.exists() and not path.is_symlink():
        missing.append(path)
        path = path.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    if folder.is_symlink() or not folder.is_dir():
        raise OSError(0, f"{folder} is not a folder (a link or a file), refused")
