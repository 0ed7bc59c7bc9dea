"""CUDA paths: the allocator's peak memory, a real out-of-memory, kernels in profile=true, NVML.

Skipped on machines without a CUDA GPU (CI has none). On a lent GPU machine whose image lacks hydra-core
and gymnasium, carry their wheels (hydra-core, omegaconf, antlr4-python3-runtime==4.9.3, gymnasium,
ale-py, farama-notifications) and run, in the repo root:

    PYTHONPATH=/tmp/site:. python3 -m pytest -q tests/test_cuda.py tests/test_models.py
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
    failed = run(CUDA + ["model=vgg16", "batch=200000"], name="oom")
    assert failed["success"] is False and failed["failure"]["kind"] == "oom", failed["failure"]
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
    assert s["gpu_util_pct"]["mean"] > 0
    assert s["power_w"]["gpu0"] > 20
    assert s["energy_j"]["source_by_rail"]["gpu0"] in ("counter", "power_integral")
    assert s["energy_j"]["per_step_mean"] > 0
