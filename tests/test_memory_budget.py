"""Budgets: the CUDA allocator is capped before the model exists; on CPU an over-budget peak is a "budget" failure."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mtbench.memory import budget
from mtbench.memory.targets import Target, load_target
from tests.conftest import compose_cfg

CPU = torch.device("cpu")


def test_target_from_cfg_takes_command_line_overrides():
    assert budget.target_from_cfg(compose_cfg([])) == Target.none()
    t = budget.target_from_cfg(compose_cfg(["target=tx2", "target.memory_budget_bytes=12345"]))
    assert t.name == "tx2" and t.memory_budget_bytes == 12345


def test_no_target_no_budget():
    assert budget.apply_budget(Target.none(), CPU) == {"budget_bytes": None, "budget_enforced_by": None}
    assert budget.budget_failure(Target.none(), {"mem_peak_bytes": 10**12}, None) is None


def test_cpu_peak_over_the_budget_is_a_budget_failure_with_the_figures():
    nano = load_target("nano")
    held = budget.apply_budget(nano, CPU)
    assert held == {"budget_bytes": 1610612736, "budget_enforced_by": "peak_check"}
    mem = {"mem_peak_bytes": 2 * 2**30, "mem_peak_source": "process_rss"}
    failure = budget.budget_failure(nano, mem, held["budget_enforced_by"])
    assert failure["kind"] == "budget"
    assert failure["message"].startswith("peak 2.00 GiB (the process's resident high-water mark (VmHWM)")
    assert "exceeds target nano's budget 1.50 GiB by 0.50 GiB (2147483648 > 1610612736 bytes)" in failure["message"]


def test_cpu_peak_within_the_budget_passes():
    mem = {"mem_peak_bytes": 2**30, "mem_peak_source": "process_rss"}
    assert budget.budget_failure(load_target("nano"), mem, "peak_check") is None


def test_cuda_cap_is_the_budget_over_the_gpu_memory(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=16 * 2**30))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: calls.append((f, d)))
    gpu = torch.device("cuda", 0)
    held = budget.apply_budget(load_target("tx2"), gpu)
    assert held == {"budget_bytes": 5905580032, "budget_enforced_by": "cuda_memory_fraction"}
    assert calls == [(5905580032 / (16 * 2**30), gpu)]
    # a GPU smaller than the board's budget is left alone, and the summary says so
    held = budget.apply_budget(load_target("agx_orin"), gpu)
    assert held["budget_enforced_by"] is None and "not capped" in held["budget_note"]
    assert len(calls) == 1
    # where the allocator enforces it, there is nothing to check afterwards
    assert budget.budget_failure(load_target("tx2"), {"mem_peak_bytes": 10**12}, "cuda_memory_fraction") is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_cap_gives_a_real_out_of_memory_error():
    gpu = torch.device("cuda", 0)
    tiny = Target.from_mapping({**Target.none().to_dict(), "name": "tiny", "memory_budget_bytes": 256 * 2**20,
                                "memory_total_bytes": 512 * 2**20})
    try:
        assert budget.apply_budget(tiny, gpu)["budget_enforced_by"] == "cuda_memory_fraction"
        torch.empty(64 * 2**20, dtype=torch.uint8, device=gpu)  # fits
        with pytest.raises(torch.cuda.OutOfMemoryError):
            torch.empty(512 * 2**20, dtype=torch.uint8, device=gpu)
    finally:
        budget.release_budget(gpu)
        torch.cuda.empty_cache()
