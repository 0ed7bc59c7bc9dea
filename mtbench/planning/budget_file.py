"""memory.budget_file: a budget a run watches, read between steps (one number of GiB, or bytes)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple

from mtbench.regular_files import KIB, read_regular


def read_budget_file(path: Path) -> Optional[int]:
    """The budget in a watched file: one number, in GiB (e.g. `1.5`), optionally followed by `GiB`; or a whole
    number followed by `bytes`. None when the file is missing or empty; ValueError when it holds anything else
    (also a value too large to be a number of bytes: `1e400`, `inf`); RefusedFile (an OSError) when it is not a
    regular file (a FIFO would block the job) or larger than 4 KiB."""
    try:
        text = read_regular(str(path), 4 * KIB).decode("utf-8", errors="replace").strip()
    except FileNotFoundError:
        return None
    if not text:
        return None
    words = text.split()
    try:
        if len(words) == 2 and words[1].lower() == "bytes":
            value = int(words[0])
        elif len(words) == 1 or (len(words) == 2 and words[1].lower() == "gib"):
            value = int(float(words[0]) * 2**30)
        else:
            raise ValueError(text)
    except (ValueError, OverflowError):  # int(float("1e400") * 2**30): an infinite budget is no budget
        raise ValueError(f"{path}: {text[:60]!r} is not a budget; allowed: a number of GiB (1.5), '1.5 GiB' or "
                         "'1610612736 bytes'") from None
    if value <= 0:
        raise ValueError(f"{path}: a budget must be > 0, not {text[:60]!r}")
    return value


class BudgetFile:
    """A file the run watches: a changed modification time or size means a new budget, read between steps."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.stamp: Optional[Tuple[int, int]] = None

    def changed(self) -> bool:
        try:
            st = self.path.stat()
            stamp: Optional[Tuple[int, int]] = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp == self.stamp:
            return False
        self.stamp = stamp
        return stamp is not None
