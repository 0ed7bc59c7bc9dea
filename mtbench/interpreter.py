"""Starting another Python interpreter, as root may: isolated (-I), so the current folder is never on its path."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Sequence

# the folder that holds the running mtbench package: a child imports this mtbench, never one found elsewhere
PACKAGE_PARENT = str(Path(__file__).resolve().parents[1])


def child_path() -> List[str]:
    """The folders a child puts first on sys.path: this mtbench's, then PYTHONPATH's absolute entries (-I ignores
    the variable; a relative entry, or an empty one, would name the current folder)."""
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(p)]
    return [PACKAGE_PARENT] + [p for p in extra if p != PACKAGE_PARENT]


def python_c(code: str) -> List[str]:
    """argv of `python -c code` with no folder of the caller's on the path: -I (isolated: no current folder, no
    user site, no PYTHON* variables; Python 3.4+) and this mtbench's folder put first by the code itself."""
    return [sys.executable, "-I", "-c", f"import sys; sys.path[0:0] = {child_path()!r}\n{code}"]


def python_m(module: str, args: Sequence[str] = ()) -> List[str]:
    """argv of `python -m module args...` as `python_c` starts it (-m itself would put the current folder first)."""
    code = f"import runpy; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    return python_c(code) + list(args)
