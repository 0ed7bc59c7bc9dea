"""Every model trains one real step on the CPU at batch 2 and reports a parameter count."""
from __future__ import annotations

import pytest

from mtbench.catalog import model_rows
from mtbench.config import group_options

CNNS = ["alexnet", "vgg16", "vgg19", "resnet50", "resnet101", "resnet152", "densenet40", "densenet100",
        "squeezenet", "xception", "inceptionv1", "mobilenetv2"]


def test_the_cnn_suite_is_complete():
    assert set(CNNS) <= set(group_options("model"))


# tiny sizes through config overrides, so that every model's real training step stays fast
TINY = {
    "char_rnn": ["model.workload.seq_len=16", "model.workload.hidden=32", "model.workload.conv_channels=16"],
    "dcgan": ["model.workload.ngf=8", "model.workload.ndf=8"],
    "dqn": ["data=synthetic", "model.workload.learning_starts=8", "model.workload.buffer_size=16",
            "model.workload.target_update=1"],
    "seq2seq": ["model.workload.hidden=32", "data.src_vocab=200", "data.tgt_vocab=150"],
    "bidaf": ["model.workload.d=16", "model.workload.words=500", "data.word_vocab=400"],
    "bert": ["model.workload.hidden=32", "model.workload.layers=2", "model.workload.heads=2",
             "model.workload.intermediate=64", "model.workload.seq_len=64", "model.workload.vocab_size=500"],
    "densenet100": ["model.workload.net.depth=22"],
}


@pytest.mark.parametrize("model", group_options("model"))
def test_model_trains_one_step(run, model):
    summary = run([f"model={model}", "batch=2"] + TINY.get(model, []))
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
