"""The `_target_` allow-list judges what a target resolves to, not how its dotted name starts."""
from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

from mtbench.config import check_targets
from mtbench.errors import UsageError
from tests.conftest import compose_cfg


@pytest.mark.parametrize("target, defined_in", [
    ("mtbench.sample_cli.os.system", "system from posix"),
    ("mtbench.sample_cli.subprocess.Popen", "Popen from subprocess"),
    ("torch.optim.optimizer.torch.load", "load from torch.serialization"),
    ("mtbench.sample_cli.os", "a module"),
])
def test_a_target_that_escapes_its_prefix_is_refused(target, defined_in):
    cfg = compose_cfg(["model=alexnet", f"model.workload.net._target_={target}"])
    with pytest.raises(UsageError) as err:
        check_targets(cfg)
    message = str(err.value)
    assert "\n" not in message
    assert f"_target_ '{target}' at model.workload.net is {defined_in}, which is not allowed" in message
    assert "allowed: callables defined under models., mtbench., torch.optim., torchvision.models." in message


@pytest.mark.parametrize("target, reason", [
    ("os.system", "is not allowed"),
    ("models.nope.Net", "does not exist (models has no 'nope.Net')"),
    ("models.alexnet.Nope", "does not exist (models.alexnet has no 'Nope')"),
])
def test_outside_or_missing_targets_are_refused(target, reason):
    with pytest.raises(UsageError, match=re.escape(f"_target_ '{target}' at net {reason}")):
        check_targets(OmegaConf.create({"net": {"_target_": target}}))


@pytest.mark.parametrize("model", ["alexnet", "resnet50", "mobilenetv2", "bert", "dqn", "dcgan"])
def test_every_shipped_config_passes(model):
    check_targets(compose_cfg([f"model={model}"]))


def test_targets_in_lists_are_checked():
    with pytest.raises(UsageError, match=r"at layers\[1\]"):
        check_targets(OmegaConf.create({"layers": [{"_target_": "torch.optim.SGD"},
                                                   {"_target_": "mtbench.sample_cli.os.system"}]}))
