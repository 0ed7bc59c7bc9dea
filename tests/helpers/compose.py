"""The real config composed with small overrides (no torch imported here: a test's subprocess starts fast)."""
from __future__ import annotations

from pathlib import Path
from typing import List

from hydra import compose, initialize_config_dir

from mtbench import config

REPO = Path(__file__).resolve().parents[2]
# fast defaults for tests: no warm-up, one measured step, CPU
FAST = ["device=cpu", "warmup=0", "steps=1"]
# a job whose workload is one of tests/fake_workloads.py's: the model group's node without its network
FAKE = ["model=squeezenet", "~model.workload.net", "~model.workload.optimizer", "~model.workload.input_shape",
        "~model.workload.num_classes"]


def compose_cfg(overrides: List[str]):
    with initialize_config_dir(config_dir=str(config.conf_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=FAST + list(overrides))
