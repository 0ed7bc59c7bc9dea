"""The data set a job composes, read from the config files as Hydra picks it, and the one composition it saves."""
from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from mtbench.config import conf_dir, default_option, group_options


def _hydras_choice(model: str, overrides: list) -> str:
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model={model}", *overrides], return_hydra_config=True)
    return str(cfg.hydra.runtime.choices.data)


@pytest.mark.slow
def test_the_data_option_is_the_one_hydra_composes_for_every_model():
    for model in group_options("model"):
        assert default_option("data", model) == _hydras_choice(model, []), model
    assert default_option("data", "dqn") == "atari"  # its file's `override /data: atari`


@pytest.mark.parametrize("model, overrides", [("dqn", ["data=synthetic"]), ("bert", ["data=squad"]),
                                              ("dqn", ["seed=3"]), ("resnet50", ["data=cifar10", "seed=3"])])
def test_the_data_option_an_override_picks_is_the_one_hydra_composes(model, overrides):
    assert default_option("data", model, overrides) == _hydras_choice(model, overrides)


def test_another_groups_override_leaves_the_data_option_unknown():
    assert default_option("data", "bert", ["experiment=anything"]) is None
    assert default_option("data", "bert", ["data=squad", "sampler=procfs"]) is None  # a later group override could pick it
    assert default_option("data", "bert", ["sampler=procfs", "data=squad"]) == "squad"


def test_a_model_on_synthetic_data_is_composed_once_and_its_data_node_is_the_jobs(monkeypatch):
    pytest.importorskip("torch.distributed._tools.mem_tracker", reason="the predictor needs torch >= 2.5")
    from mtbench.predict.predictor import Predictor

    composed = []
    original = Predictor._compose

    def counted(self, model, batch, extra, data):
        composed.append((model, data))
        return original(self, model, batch, extra, data)

    monkeypatch.setattr(Predictor, "_compose", counted)
    p = Predictor(target_name="tx2", first_model="bert")
    p.prepare("bert")
    assert composed == [("bert", "synthetic")]
    assert p._job_data_node("bert") == p.compose("bert", 1, data=None).data
    p.prepare("dqn")  # Atari by its own file: its own data node needs a composition of its own
    assert composed[-2:] == [("dqn", "synthetic"), ("dqn", None)]
    assert p._job_data_node("dqn")["_target_"] != p.compose("dqn", 1).data["_target_"]
