"""The `_target_` allow-list judges what a target resolves to, not how its dotted name starts, and each config
node may build only its own kind of object (a workload, a network or optimizer, a data source)."""
from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

from mtbench.config import check_targets
from mtbench.errors import UsageError
from tests.conftest import compose_cfg, mtbench_cli


@pytest.mark.parametrize("target, defined_in", [
    ("mtbench.commands.sample.os.system", "system from posix"),
    ("mtbench.commands.sample.subprocess.Popen", "Popen from subprocess"),
    ("torch.optim.optimizer.torch.load", "load from torch.serialization"),
    ("mtbench.commands.sample.os", "a module"),
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
    with pytest.raises(UsageError, match=re.escape(f"_target_ '{target}' at model.workload.net {reason}")):
        check_targets(OmegaConf.create({"model": {"workload": {"net": {"_target_": target}}}}))


# Callables under mtbench. and models. that a config must not reach: each passed the prefix rule on the old main.
# (mtbench.results.files.atomic_write wrote a file the config named; mtbench.commands.sample.main ran a shell command.)
@pytest.mark.parametrize("where, target", [
    ("data", "mtbench.results.files.atomic_write"),
    ("data", "mtbench.commands.sample.main"),
    ("data", "models.alexnet.AlexNetCIFAR"),             # a network is not a data source
    ("model.workload", "mtbench.commands.sample.main"),
    ("model.workload", "mtbench.data.synthetic.Synthetic"),        # a data source is not a workload
    ("model.workload", "models.alexnet.AlexNetCIFAR"),   # nor is a bare network
    ("model.workload.net", "mtbench.results.files.atomic_write"),
    ("model.workload.net", "mtbench.commands.sample.main"),
    ("model.workload.net", "models.qa.pad_ids"),         # a function of models. that returns a tensor
    ("model.workload.optimizer", "mtbench.commands.sample.main"),
    ("model.workload.optimizer", "torch.optim.lr_scheduler.StepLR"),  # under torch.optim., not an Optimizer
])
def test_each_node_builds_only_its_kind(where, target):
    cfg = compose_cfg(["model=alexnet"])
    node = OmegaConf.select(cfg, where)
    OmegaConf.update(cfg, f"{where}._target_", target, force_add=True) if node is not None else \
        OmegaConf.update(cfg, where, {"_target_": target}, force_add=True)
    with pytest.raises(UsageError) as err:
        check_targets(cfg)
    message = str(err.value)
    assert "\n" not in message and f"_target_ '{target}' at {where}" in message, message
    assert "not allowed" in message or "allowed there:" in message, message


def test_a_target_where_no_object_is_built_is_refused():
    cfg = compose_cfg(["model=alexnet"])
    OmegaConf.update(cfg, "sampler.hook", {"_target_": "models.alexnet.AlexNetCIFAR"}, force_add=True)
    with pytest.raises(UsageError, match=r"at sampler\.hook: no _target_ belongs there"):
        check_targets(cfg)


@pytest.mark.parametrize("target", ["mtbench.results.files.atomic_write", "mtbench.commands.sample.main"])
def test_the_command_line_cannot_name_an_mtbench_function_as_data(target, tmp_path):
    victim = tmp_path / "victim"
    proc = mtbench_cli("model=squeezenet", f"data._target_={target}", f"+data.path={victim}", "+data.data=x",
                       "+data.argv=[x,--,touch," + str(victim) + "]", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a data source class" in lines[0], lines
    assert not victim.exists() and not (tmp_path / "run" / "summary.json").exists()


def _passes_and_is_judged(cfg, node: str) -> None:
    """check_targets passes `cfg`, and the same config with `node`'s _target_ swapped for os.system is refused: the
    pass is a judgement of this config's targets, not a check that judges nothing."""
    assert check_targets(cfg) is None
    planted = OmegaConf.merge(cfg, OmegaConf.from_dotlist([f"{node}._target_=os.system"]))
    with pytest.raises(UsageError, match=rf"at {re.escape(node)}\b"):
        check_targets(planted)


@pytest.mark.parametrize("model", ["alexnet", "resnet50", "mobilenetv2", "bert", "dqn", "dcgan", "char_rnn",
                                   "seq2seq", "bidaf", "densenet40", "xception"])
def test_every_shipped_config_passes(model):
    cfg = compose_cfg([f"model={model}"])
    _passes_and_is_judged(cfg, "model.workload")


@pytest.mark.parametrize("data", ["synthetic", "cifar10", "shakespeare", "squad", "iwslt15", "atari"])
def test_every_shipped_data_source_passes(data):
    _passes_and_is_judged(compose_cfg(["model=alexnet", f"data={data}"]), "data")


def test_torchvision_builders_are_networks():
    _passes_and_is_judged(compose_cfg(["model=alexnet", "model.workload.net._target_=torchvision.models.resnet18",
                                       "~model.workload.net.variant"]), "model.workload.net")


def test_targets_in_lists_are_checked():
    with pytest.raises(UsageError, match=r"at model\.workload\.layers\[1\]"):
        check_targets(OmegaConf.create({"model": {"workload": {"layers": [
            {"_target_": "torch.optim.SGD"}, {"_target_": "mtbench.commands.sample.os.system"}]}}}))


# Hydra's own nodes: what Hydra builds or calls before any job (callbacks, what is nested in a plugin's node,
# logging.config's "()" factories) is judged too, from the command line and from a YAML alike
@pytest.mark.parametrize("override, needle", [
    ("+hydra.callbacks.x._target_=mtbench.commands.sample.main", "at hydra.callbacks.x is main from "
                                                                 "mtbench.commands.sample, not a Hydra Callback"),
    ("+hydra.callbacks.x._target_=mtbench.results.files.atomic_write", "not a Hydra Callback subclass"),
    ("+hydra.callbacks.x._target_=os.system", "is not allowed"),
    ("+hydra.launcher.x._target_=mtbench.results.files.atomic_write", "at hydra.launcher.x: no _target_ belongs"),
    ("+hydra.sweeper.x._target_=mtbench.commands.sample.main", "at hydra.sweeper.x: no _target_ belongs"),
    ("+hydra.job._target_=mtbench.commands.sample.main", "at hydra.job: no _target_ belongs"),
    ("hydra.job_logging.handlers.console.class=mtbench.commands.sample.main", "not a class of the logging package"),
    ("+hydra.job_logging.handlers.x.class=subprocess.Popen", "not a class of the logging package"),
])
def test_hydra_nodes_that_would_run_code_are_refused(override, needle):
    from mtbench.config_overrides import check_overrides

    with pytest.raises(UsageError) as err:
        check_overrides([override])
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("override", ["hydra/launcher=submitit_local", "hydra/sweeper=optuna",
                                      "hydra/job_logging=disabled", "hydra.job_logging.root.level=WARNING"])
def test_hydra_nodes_as_shipped_pass(override):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from mtbench.config_overrides import check_overrides

    check_overrides(["-m", override])


def _write_lab_yaml(folder, body: str) -> None:
    (folder / "lab").mkdir(parents=True)
    (folder / "lab" / "evil.yaml").write_text("# @package _global_\n" + body)


@pytest.mark.parametrize("body", [
    "hydra:\n  callbacks:\n    x:\n      _target_: mtbench.results.files.atomic_write\n      path: VICTIM\n"
    "      text: PWNED\n",
    "hydra:\n  job_logging:\n    handlers:\n      x:\n        (): mtbench.results.files.atomic_write\n"
    "        path: VICTIM\n        text: PWNED\n",
    "hydra:\n  launcher:\n    x:\n      _target_: mtbench.results.files.atomic_write\n      path: VICTIM\n"
    "      text: PWNED\n",
])
def test_a_callback_in_a_shared_config_folder_is_refused_before_any_job(body, tmp_path):
    """The same nodes in a YAML that hydra.searchpath reaches (a lab's shared config folder): refused in one line,
    and nothing it names ran."""
    victim = tmp_path / "victim"
    _write_lab_yaml(tmp_path / "conf", body.replace("VICTIM", str(victim)))
    proc = mtbench_cli("model=squeezenet", "batch=1", f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "+lab=evil",
                       f"hydra.run.dir={tmp_path / 'run'}", timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    # a plugin's node is a structured config: Hydra itself refuses a key it does not have, naming the YAML
    assert len(lines) == 1 and ("hydra." in lines[0] or "lab/evil" in lines[0]), lines
    assert not victim.exists() and not (tmp_path / "run" / "summary.json").exists()
