"""The environment of a Python child a test starts: this repository first on its path, the caller's kept after it."""
from __future__ import annotations

import os
from typing import Dict

from tests.helpers.compose import REPO


def child_env(base: Dict[str, str] = None, **extra: str) -> Dict[str, str]:
    """`base` (default: this process's environment) with PYTHONPATH = the repository, then the caller's entries (a
    machine that carries some packages there, e.g. hydra-core beside a bare torch, keeps them), and `extra` set."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env
