"""One skip marker for the conditions the suite depends on (in the style of lightning-hydra-template's RunIf):
`@run_if(linux=True, cuda=True, root=True, not_root=True, plugin="hydra_submitit_launcher")`, each condition
that fails named in the skip's reason."""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import List, Optional

import pytest


def run_if(linux: bool = False, cuda: bool = False, root: bool = False, not_root: bool = False,
           plugin: Optional[str] = None, why: str = "") -> pytest.MarkDecorator:
    """A skipif that holds where any asked condition fails; `why` says what the test needs the condition for."""
    missing: List[str] = []
    if linux and not sys.platform.startswith("linux"):
        missing.append("Linux")
    if cuda:
        import torch

        if not torch.cuda.is_available():
            missing.append("a CUDA GPU")
    if root and os.geteuid() != 0:
        missing.append("root")
    if not_root and os.geteuid() == 0:
        missing.append("a user other than root")
    if plugin is not None:
        try:
            found = importlib.util.find_spec(f"hydra_plugins.{plugin}") is not None
        except ModuleNotFoundError:  # no hydra_plugins namespace at all
            found = False
        if not found:
            missing.append(f"the {plugin} package")
    reason = f"needs {', '.join(missing)}" + (f": {why}" if why else "")
    return pytest.mark.skipif(bool(missing), reason=reason)
