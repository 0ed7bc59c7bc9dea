"""Every model trains one real step on the CPU at batch 2 and reports a parameter count."""
from __future__ import annotations

import pytest

from mtbench.catalog import model_rows
from mtbench.config import group_options

CNNS = ["alexnet", "vgg16", "vgg19", "resnet50", "resnet101", "resnet152", "densenet40", "densenet100",
        "squeezenet", "xception", "inceptionv1", "mobilenetv2"]


def test_the_cnn_suite_is_complete():
    assert set(CNNS) <= set(group_options("model"))


@pytest.mark.parametrize("model", group_options("model"))
def test_model_trains_one_step(run, model):
    summary = run([f"model={model}", "batch=2"])
    assert summary["success"], summary["failure"]
    assert summary["measured_steps"] == 1
    assert summary["step_time_s"]["median"] > 0
    assert summary["parameters"] > 10_000


def test_model_listing_counts_parameters():
    rows = {name: params for name, params, _, _ in model_rows()}
    assert set(rows) == set(group_options("model"))
    # the counts that the architectures fix exactly (10-class heads)
    assert rows["vgg16"] == 134_301_514
    assert rows["resnet50"] == 23_528_522
    assert 0.95e6 < rows["densenet40"] < 1.1e6  # Huang et al. Table 2: 1.0M
    assert 6.8e6 < rows["densenet100"] < 7.2e6  # Huang et al. Table 2: 7.0M
