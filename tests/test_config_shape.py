"""Values of the wrong kind for their key end in one line before any job (issue 51 item 11): whole nodes replaced
by one value, a list where a path belongs, a target's figures that are no numbers, unbounded loader processes."""
from __future__ import annotations

import os

import pytest

from mtbench.config_overrides import check_overrides
from mtbench.device.targets import Target, load_target
from mtbench.errors import UsageError
from tests.conftest import mtbench_cli

JOB = ["model=squeezenet", "batch=1", "device=cpu"]


@pytest.mark.parametrize("override, needle", [
    ("memory=/tmp/f", "memory='/tmp/f' replaces the node memory (keys plan, microbatch, recompute, recompute_share, "
                      "...) with one value; allowed: its keys one by one (memory.plan=...)"),
    ("power=99999999999999999999", "power=99999999999999999999 replaces the node power"),
    ("until=-inf", "until=-inf replaces the node until (keys accuracy, loss, eval_every)"),
    ("sampler.options.nvml=\\\\", "sampler.options.nvml='\\\\' replaces the node sampler.options.nvml (keys indices, "
                                  "job_uuids, other_gpus)"),
    ("sampler.options.procfs.proc_root=[1,2]", "sampler.options.procfs.proc_root=[1, 2] is a list; allowed: a text, "
                                               "as sampler.options.procfs.proc_root='/proc' is"),
    ("sampler.options.thermal.every_ms=abc", "sampler.options.thermal.every_ms='abc' is a text; allowed: a number"),
    ("sampler.options.nvml.other_gpus=3", "sampler.options.nvml.other_gpus=3 is a number; allowed: true or false"),
    ("data.workers=100000", f"data.workers=100000 is out of range; allowed: 0-{4 * (os.cpu_count() or 1)} (at most 4 "
                            "loader processes per core of this machine)"),
    ("data.prefetch_factor=65", "data.prefetch_factor=65 is out of range; allowed: 1-64"),
])
def test_a_value_of_the_wrong_kind_is_one_line_before_any_job(override, needle):
    with pytest.raises(UsageError) as caught:
        check_overrides([*JOB, override])
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_values_of_their_keys_kind_pass():
    check_overrides([*JOB, "sampler.options.thermal.every_ms=50", "sampler.options.nvml.indices=[0]",
                     "target=tx2", "target.jetpack=5.1", "target.peak_fp32_flops=7e11", "data.workers=2",
                     "data.prefetch_factor=64", "sampler.options={}", "until.loss=0.5", "+extra.key=[1,2]"])


@pytest.mark.parametrize("key, value, needle", [
    ("peak_fp16_flops", "/nonexistent/x", "target.peak_fp16_flops='/nonexistent/x' is not a number > 0"),
    ("peak_fp32_flops", float("nan"), "target.peak_fp32_flops=nan is not a number > 0"),
    ("cpu_cores", float("-inf"), "target.cpu_cores=-inf is not a whole number >= 0"),
    ("memory_budget_bytes", [1], "target.memory_budget_bytes=[1] is not a whole number >= 0"),
    ("cpu_types", [1, 2], "target.cpu_types=[1, 2] is not a core type or a list of them"),
    ("jetpack", {"a": 1}, "target.jetpack={'a': 1} is not a text"),
])
def test_a_targets_figure_of_the_wrong_kind_is_one_line(key, value, needle):
    node = load_target("tx2").to_dict()
    node[key] = value
    with pytest.raises(UsageError, match=None) as caught:
        Target.from_mapping(node)
    assert needle in str(caught.value)


@pytest.mark.slow
def test_a_target_figure_that_is_no_number_ends_the_command_in_one_line(tmp_path):
    proc = mtbench_cli(*JOB, "steps=1", "warmup=0", "target.peak_fp16_flops=/nonexistent/x",
                       f"hydra.run.dir={tmp_path / 'job'}")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == ("mtbench: error: target.peak_fp16_flops='/nonexistent/x' is not a number > 0; "
                                   "allowed: such a number or null")
    assert not (tmp_path / "job" / "summary.json").exists()


@pytest.mark.parametrize("overrides", [
    ["memory.plan=recompute", "memory.plan=none"],
    ["memory.plan=none", "++memory.plan=recompute"],
    ["++memory.plan=recompute", "memory.plan=none"],
    ["target=tx2", "target=nano"],
])
def test_the_value_read_from_overrides_is_the_one_hydra_composes(overrides):
    """config_schema.last_override against Hydra itself: the value the jobs' config takes from the same overrides
    (`++key=` forces a value; Hydra refuses it for a config group such as target)."""
    from mtbench.config_schema import last_override
    from tests.helpers.compose import compose_cfg

    cfg = compose_cfg(["model=squeezenet", *overrides])
    assert last_override(overrides, "memory.plan", "none") == cfg.memory.plan
    assert last_override(overrides, "target", "none") == cfg.target.name
