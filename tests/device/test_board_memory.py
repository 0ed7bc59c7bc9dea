"""A Jetson's GPU memory is the board's DRAM (issue 49 item 1): a CUDA job on an integrated GPU records its board
memory, the host's training memory plus what the allocator reserved, and its budget is judged on that; nvmap's
per-process figure is read where readable."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mtbench.device import budget, peak
from mtbench.device.targets import load_target

# nvmap's iovmm/clients as the L4T driver prints it ("%-18s %18s %8u %10uK"), two clients of pid 4242
CLIENTS = ("CLIENT                        PROCESS      PID        SIZE\n"
           "user                          python3     4242     524288K\n"
           "user                          python3     4242      65536K\n"
           "user                     nvargus-daemon      911      12288K\n"
           "total                                            602112K\n"
           "Note: total memory is precise account of pages allocated by NvMap.\n"
           "It doesn't match with all clients \"SIZE\" accumulated as shared memory \n"
           "is accounted in full in each clients \"SIZE\" that shared memory.\n")


def test_nvmap_counts_every_client_of_the_process(tmp_path):
    clients = tmp_path / "clients"
    clients.write_text(CLIENTS)
    assert peak.nvmap_bytes(4242, str(clients)) == (524288 + 65536) * 1024
    assert peak.nvmap_bytes(911, str(clients)) == 12288 * 1024
    assert peak.nvmap_bytes(1, str(clients)) == 0
    assert peak.nvmap_bytes(4242, str(tmp_path / "absent")) is None  # not root, no debugfs, not a Jetson


@pytest.fixture
def cuda(monkeypatch):
    """torch.cuda as a GPU answers it: properties and the allocator's counters (reserved 512 MiB at peak)."""
    gpu = SimpleNamespace(is_integrated=True, total_memory=8 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: gpu)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: 2**20)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: 400 * 2**20)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d=None: 512 * 2**20)
    return gpu


def test_an_integrated_gpus_job_records_the_boards_memory(cuda):
    meter = peak.PeakMemory(torch.device("cuda", 0))
    meter.reset()
    held = torch.ones(64 * 2**20, dtype=torch.uint8)  # the host's share: 64 MiB, every page written
    mem = meter.read()
    del held
    assert mem["mem_peak_source"] == "cuda_allocator" and mem["mem_peak_reserved_bytes"] == 512 * 2**20
    assert mem["mem_training_peak_bytes"] >= 64 * 2**20
    assert mem["mem_board_bytes"] == mem["mem_training_peak_bytes"] + 512 * 2**20
    assert "allocator reserved" in mem["mem_board_source"]
    assert "mem_nvmap_bytes" in mem  # None here: no nvmap


def test_a_discrete_gpus_job_has_no_board_memory(cuda):
    cuda.is_integrated = False
    meter = peak.PeakMemory(torch.device("cuda", 0))
    meter.reset()
    assert "mem_board_bytes" not in meter.read()


def test_the_budget_of_an_integrated_gpu_is_judged_on_the_boards_memory():
    """The allocator alone fits the TX2's 5.5 GiB (it is capped there), the host's memory on top of it does not."""
    tx2 = load_target("tx2")
    mem = {"mem_peak_bytes": 4 * 2**30, "mem_peak_source": "cuda_allocator", "mem_peak_reserved_bytes": 5 * 2**30,
           "mem_board_bytes": 6 * 2**30, "mem_board_source": "host training memory + CUDA allocator reserved peak"}
    failure = budget.budget_failure(tx2, mem, "cuda_memory_fraction", runtime_bytes=2**28)
    assert failure["kind"] == "budget"
    assert failure["message"].startswith("peak 6.00 GiB (board memory: host training memory + CUDA allocator "
                                         "reserved peak) less 0.25 GiB held before the model was built")
    assert budget.budget_failure(tx2, {**mem, "mem_board_bytes": 5 * 2**30}, "cuda_memory_fraction",
                                 runtime_bytes=2**28) is None
    # a discrete GPU: the allocator's cap is the whole check
    assert budget.budget_failure(tx2, {k: v for k, v in mem.items() if not k.startswith("mem_board")},
                                 "cuda_memory_fraction") is None
