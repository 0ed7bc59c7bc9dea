"""conf/experiment/liu2019.yaml: the paper's study composes and its sweep expands to the right 112 jobs (not run)."""
from __future__ import annotations

import itertools
from typing import List, Tuple

import pytest
from hydra import compose
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from mtbench.config_overrides import check_overrides
from mtbench.config import group_options
from mtbench.errors import UsageError

# Table II of Liu et al. 2019 as mtbench names its models (docs/models.md "Models")
PAPER_MODELS = ["alexnet", "vgg16", "vgg19", "resnet50", "resnet101", "resnet152", "densenet40", "densenet100",
                "squeezenet", "xception", "inceptionv1", "char_rnn", "dcgan", "dqn", "seq2seq", "bert"]
PAPER_BATCHES = [1, 2, 4, 8, 16, 32, 64]


def sweep_jobs(cfg, command_line: List[str] = ()) -> List[Tuple[str, int]]:
    """(model, batch) of every job, expanded the way Hydra's basic sweeper does it (its params, then the command line)."""
    params = [f"{key}={value}" for key, value in cfg.hydra.sweeper.params.items()] + list(command_line)
    batches = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(params), None)
    jobs = []
    for job in itertools.chain.from_iterable(batches):
        settings = dict(override.split("=", 1) for override in job)
        jobs.append((settings["model"], int(settings["batch"])))
    return jobs


def test_liu2019_sweeps_the_papers_models_at_batch_1_to_64(hydra_conf):
    cfg = compose("config", overrides=["+experiment=liu2019"], return_hydra_config=True)
    jobs = sweep_jobs(cfg)
    assert len(jobs) == 16 * 7
    assert jobs == list(itertools.product(PAPER_MODELS, PAPER_BATCHES))
    assert set(PAPER_MODELS) <= set(group_options("model"))
    assert list(cfg.sampler.sensors) == ["auto"]
    assert str(cfg.hydra.sweep.dir).startswith("multirun/liu2019/")


def test_each_job_of_liu2019_composes_to_its_model(hydra_conf):
    for model in PAPER_MODELS:
        cfg = compose("config", overrides=["+experiment=liu2019", f"model={model}", "batch=64"])
        assert (cfg.model.name, cfg.batch) == (model, 64)
        assert list(cfg.sampler.sensors) == ["auto"]
    dqn = compose("config", overrides=["+experiment=liu2019", "model=dqn"])
    assert dqn.data._target_ == "mtbench.data.atari.Atari"  # the model's own default data is kept


def test_command_line_narrows_the_study(hydra_conf):
    cfg = compose("config", overrides=["+experiment=liu2019", "sampler=procfs"], return_hydra_config=True)
    assert list(cfg.sampler.sensors) == ["procfs"]
    assert sweep_jobs(cfg, ["model=resnet50,vgg16"]) == list(itertools.product(["resnet50", "vgg16"], PAPER_BATCHES))
    assert sweep_jobs(cfg, ["batch=64"]) == [(m, 64) for m in PAPER_MODELS]


def test_cli_accepts_the_experiment_override():
    assert check_overrides(["-m", "+experiment=liu2019"]) is None
    assert check_overrides(["-m", "+experiment=liu2019", "model=resnet50", "batch=1,2"]) is None
    # the same lists with one value the check must refuse: it judges them, it does not wave them through
    with pytest.raises(UsageError, match="nosuch"):
        check_overrides(["-m", "+experiment=nosuch"])
    with pytest.raises(UsageError, match="batch"):
        check_overrides(["-m", "+experiment=liu2019", "model=resnet50", "batch=1,0"])
