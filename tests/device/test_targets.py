"""conf/target/: every board loads with the agreed keys; unknown names are one-line usage errors."""
from __future__ import annotations

import pytest
import yaml

from mtbench.config import conf_dir, group_options
from mtbench.errors import UsageError
from mtbench.device.targets import Target, load_target
from tests.conftest import compose_cfg

BOARDS = ["tx2", "nano", "xavier_nx", "agx_xavier", "orin_nano", "orin_nx", "agx_orin"]
KEYS = {"name", "description", "memory_total_bytes", "memory_budget_bytes", "peak_fp32_flops", "peak_fp16_flops",
        "dram_bandwidth_bytes_per_s", "cpu_cores", "cpu_types", "jetpack", "cuda", "python", "torch", "gpu_capability"}


def test_the_options_are_none_and_the_seven_boards():
    assert sorted(group_options("target")) == sorted(["none"] + BOARDS)


@pytest.mark.parametrize("name", ["none"] + BOARDS)
def test_each_file_has_exactly_the_agreed_keys(name):
    node = yaml.safe_load((conf_dir() / "target" / f"{name}.yaml").read_text())
    assert set(node) == KEYS
    assert node["name"] == name


@pytest.mark.parametrize("name", BOARDS)
def test_board_figures_are_plausible(name):
    t = load_target(name)
    assert 0 < t.memory_budget_bytes < t.memory_total_bytes
    assert t.memory_total_bytes % 2**30 == 0  # whole GiB, as the data sheets give them
    assert isinstance(t.peak_fp32_flops, float) and 1e11 < t.peak_fp32_flops < 1e14
    assert t.peak_fp16_flops >= 2 * t.peak_fp32_flops * 0.999
    assert 1e10 < t.dram_bandwidth_bytes_per_s < 1e12
    if isinstance(t.cpu_types, tuple):
        assert len(t.cpu_types) == t.cpu_cores
    for key in ("jetpack", "cuda", "python", "torch"):
        assert isinstance(getattr(t, key), str)
    assert t.capability() in {(5, 3), (6, 2), (7, 2), (8, 7)}  # Nano, TX2, Xavier, Orin


def test_tx2_has_two_denver2_and_four_a57_cores():
    types = load_target("tx2").cpu_types
    assert types.count("denver2") == 2 and types.count("cortex-a57") == 4


def test_none_is_all_null_and_equals_the_file():
    none = Target.none()
    assert none == load_target("none")
    assert none.is_none and none.name == "none"
    assert all(v is None for k, v in none.to_dict().items() if k != "name")


def test_unknown_target_names_the_allowed_ones():
    with pytest.raises(UsageError, match=r"target='tx3' is not known; allowed: agx_orin, agx_xavier, nano, none"):
        load_target("tx3")


def test_composed_config_defaults_to_none_and_takes_a_board():
    assert Target.from_mapping(compose_cfg([]).target) == Target.none()
    cfg = compose_cfg(["target=nano", "target.memory_budget_bytes=1000"])
    t = Target.from_mapping(cfg.target)
    assert t.name == "nano" and t.memory_budget_bytes == 1000


def test_cli_rejects_an_unknown_target_in_one_line(tmp_path):
    from tests.conftest import mtbench_cli

    proc = mtbench_cli("target=tx3", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("mtbench: error: target='tx3' is not known; allowed: "
                                   "agx_orin, agx_xavier, nano, none, orin_nano, orin_nx, tx2, xavier_nx")
