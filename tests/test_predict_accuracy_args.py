"""benchmarks/predict_accuracy.py refuses a model name conf/model does not have before it runs or reads a sweep
(a misspelt --held-out model would otherwise be calibrated on and its accuracy reported as held out)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.parametrize("flags, named", [
    (["--models", "alexnet,inceptionv3"], "--models: unknown model 'inceptionv3'"),
    (["--models", "alexnet,resnet101", "--held-out", "resnet10"], "--held-out: unknown model 'resnet10'"),
])
def test_unknown_model_is_one_line_and_no_sweep(tmp_path, flags, named):
    sweep = tmp_path / "sweep"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "predict_accuracy.py"), "--sweep", str(sweep),
                           "--no-speed", *flags], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(named), done.stderr
    assert "resnet101" in lines[0]  # the allowed names are listed
    assert "Traceback" not in done.stderr + done.stdout
    assert not sweep.exists()  # nothing was run
