"""CUDA paths: the allocator's peak memory, a real out-of-memory, kernels in profile=true, NVML.

Skipped where torch sees no CUDA GPU (CI has none). On a machine with one, in the repository:

    pip install torch==2.14.1 torchvision==0.29.1 && pip install -e '.[test,nvidia]' && python -m pytest tests/test_cuda.py

(on a Jetson: JetPack's torch and torchvision wheels, and `.[test]`: NVML answers NOT_SUPPORTED there).
"""
from __future__ import annotations

import csv

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CUDA = ["device=cuda", "warmup=1", "steps=3"]


def test_peak_memory_from_the_allocator(run):
    s = run(CUDA + ["model=resnet50", "batch=16"])
    assert s["success"], s["failure"]
    assert s["device"].startswith("cuda") and s["mem_peak_source"] == "cuda_allocator"
    assert s["mem_peak_reserved_bytes"] >= s["mem_peak_bytes"] > s["mem_baseline_bytes"] > 0
    assert s["env"]["device_name"] == torch.cuda.get_device_name(0)


def test_peak_is_reset_between_cuda_jobs(run):
    big = run(CUDA + ["model=vgg16", "batch=64"], name="big")
    small = run(CUDA + ["model=squeezenet", "batch=2"], name="small")
    assert small["mem_peak_bytes"] < big["mem_peak_bytes"] / 10


def test_real_out_of_memory_is_recorded_and_the_next_job_runs(run):
    # the caching allocator refuses an exabyte on the GPU itself: no host memory is touched first (on a Jetson,
    # whose GPU shares the DRAM, building huge batches on the host would be a host OOM instead)
    failed = run(CUDA + ["model=squeezenet", "model.workload._target_=tests.fake_workloads.OutOfMemory",
                         "+model.workload.error=cuda", "~model.workload.net", "~model.workload.optimizer",
                         "~model.workload.input_shape", "~model.workload.num_classes"], name="oom")
    assert failed["success"] is False and failed["failure"]["kind"] == "oom", failed["failure"]
    assert "CUDA out of memory" in failed["failure"]["message"] or "NVML_SUCCESS" in failed["failure"]["message"]
    assert run(CUDA + ["model=squeezenet", "batch=8"], name="next")["success"]


def test_profile_attributes_along_cuda_kernels(run, tmp_path):
    s = run(CUDA + ["model=resnet50", "batch=8", "profile=true"])
    assert s["profile"]["timeline"] == "cuda kernels", s["profile"]
    with open(tmp_path / "job" / "ops.csv") as f:
        devices = {r["device"] for r in csv.DictReader(f)}
    assert {"cuda", "cpu"} <= devices


def test_nvml_gives_power_energy_and_utilization(run):
    pytest.importorskip("pynvml")
    s = run(CUDA + ["model=resnet50", "batch=64", "sampler=nvml", "steps=20"])
    assert s["success"], s["failure"]
    # only the GPU the job trains on counts (matched by UUID); a busy GPU draws well above idle and below 1.2 kW
    rails = s["energy_j"]["total_rails"]
    assert len(rails) == 1, s["energy_j"]
    assert s["gpu_util_pct"]["mean"] > 10
    assert 20 < s["power_w"][rails[0]] < 1200
    assert s["energy_j"]["per_step_mean"] > 0


def test_a_cuda_job_in_its_own_process(tmp_path):
    """The sweep's parent never initializes CUDA, so the forked job can (CUDA does not survive a fork)."""
    import json

    from tests.test_isolation import isolated

    for name in ("first", "second"):  # the second fork finds the parent as clean as the first did
        proc = isolated(tmp_path / name, "device=cuda", "model=squeezenet", "batch=8", "warmup=1", "steps=2")
        s = json.loads(proc.stdout.strip().splitlines()[-1])
        assert s["success"], (s["failure"], proc.stderr)
        assert s["device"].startswith("cuda") and s["mem_peak_source"] == "cuda_allocator"
