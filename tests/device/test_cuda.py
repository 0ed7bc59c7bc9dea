"""CUDA paths: the allocator's peak memory, a real out-of-memory, kernels in profile=true, NVML.

Skipped where torch sees no CUDA GPU (CI has none). On a machine with one, in the repository:

    pip install torch==2.14.1 torchvision==0.29.1 && pip install -e '.[test,nvidia]' && python -m pytest tests/device/test_cuda.py

(on a Jetson: JetPack's torch and torchvision wheels, and `.[test]`: NVML answers NOT_SUPPORTED there).
"""
from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
import torch

from tests.helpers.run_if import run_if
from tests.helpers.env import child_env

pytestmark = run_if(cuda=True)

CUDA = ["device=cuda", "warmup=1", "steps=3"]


def test_peak_memory_from_the_allocator(run):
    s = run(CUDA + ["model=resnet50", "batch=16"])
    assert s["success"], s["failure"]
    assert s["device"].startswith("cuda") and s["mem_peak_source"] == "cuda_allocator"
    # weights and gradients (fp32) live together at the end of the backward pass: a peak below them is not the
    # peak (a current reading, or one taken after the job let go of its tensors)
    assert s["mem_peak_bytes"] >= 2 * 4 * s["parameters"]
    assert s["mem_peak_bytes"] > s["mem_baseline_bytes"] > 0
    assert s["env"]["device_name"] == torch.cuda.get_device_name(0)


def test_peak_is_reset_between_cuda_jobs(run):
    big = run(CUDA + ["model=vgg16", "batch=64"], name="big")
    small = run(CUDA + ["model=squeezenet", "batch=2"], name="small")
    # each job's own growth over what was allocated when its peak was reset: what earlier tests of this process
    # left behind (cuBLAS's workspace, 32 MiB on sm90) counts in both readings and cancels out
    assert small["mem_peak_bytes"] - small["mem_baseline_bytes"] < (big["mem_peak_bytes"] - big["mem_baseline_bytes"]) / 10


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
    pynvml = pytest.importorskip("pynvml")
    try:  # the module imports where the library is absent (a Jetson, a container without the driver's NVML)
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(f"NVML is not available here: {exc}")
    pynvml.nvmlShutdown()
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

    from tests.job.test_isolation import isolated

    for name in ("first", "second"):  # the second fork finds the parent as clean as the first did
        proc = isolated(tmp_path / name, "device=cuda", "model=squeezenet", "batch=8", "warmup=1", "steps=2")
        s = json.loads(proc.stdout.strip().splitlines()[-1])
        assert s["success"], (s["failure"], proc.stderr)
        assert s["device"].startswith("cuda") and s["mem_peak_source"] == "cuda_allocator"


def _fresh_process(tmp_path, script: str) -> dict:
    """`script` in a Python process of its own (no cuBLAS workspace nor allocator setting of earlier tests);
    it prints one JSON object last."""
    env = child_env()
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


_PREDICT = """
import json, sys
from pathlib import Path
from mtbench.job.run import run_job
from mtbench.predict.predictor import Predictor
from tests.conftest import compose_cfg
model, batch = {model!r}, {batch}
s = run_job(compose_cfg(["model=" + model, "batch=%d" % batch, "device=cuda", "warmup=1", "steps=2"]), Path("job"))
p = Predictor(target_name="none", device="cuda").predict(model, batch)
print(json.dumps({{"success": s["success"], "source": s["mem_peak_source"], "measured": s["mem_peak_bytes"],
                  "traced": p.traced, "tensors": p.tensors_bytes, "reserved": p.allocator_reserved_bytes}}))
"""


@pytest.mark.parametrize("model, batch", [("squeezenet", 8), ("resnet50", 8)])
def test_cuda_prediction_against_max_memory_allocated(tmp_path, model, batch):
    """The predicted allocator peak (traced on fake CUDA tensors) against a real job's max_memory_allocated over its
    measured steps (cuDNN workspaces are allocated too: within 10 %), in a fresh process: one where earlier jobs
    left cuBLAS's workspace allocated would count it in the measured peak."""
    r = _fresh_process(tmp_path, _PREDICT.format(model=model, batch=batch))
    assert r["success"] and r["source"] == "cuda_allocator"
    assert r["traced"] == "fake tensors on cuda"
    assert abs(r["tensors"] - r["measured"]) / r["measured"] < 0.10
    assert r["reserved"] >= r["tensors"]


_EXPANDABLE = """
import json, torch
from pathlib import Path
from mtbench.job.run import run_job
from tests.conftest import compose_cfg
s = run_job(compose_cfg(["device=cuda", "model=squeezenet", "batch=8", "warmup=1", "steps=2",
                         "memory.expandable_segments={expandable}"]), Path("job"))
x = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")  # a segment made after the job: the setting held
segments = torch.cuda.memory_snapshot()
print(json.dumps({{"success": s["success"], "plan": s["memory_plan"],
                  "after": [bool(g.get("is_expandable")) for g in segments]}}))
"""


@pytest.mark.parametrize("expandable", [False, True])
def test_expandable_segments_are_what_the_allocator_made(tmp_path, expandable):
    """Not the config echoed: the allocator's own segments (its snapshot's is_expandable), in a fresh process."""
    if expandable and torch.cuda.get_device_properties(0).is_integrated:
        pytest.skip("expandable segments are refused on an integrated GPU (a Jetson)")
    r = _fresh_process(tmp_path, _EXPANDABLE.format(expandable=str(expandable).lower()))
    assert r["success"], r
    plan = r["plan"]
    assert plan["expandable_segments"] is expandable, plan
    assert r["after"] and set(r["after"]) == {expandable}, r["after"]
    if plan["allocator"]["segments"] and plan["allocator"]["segments"]["total"]:
        segments = plan["allocator"]["segments"]
        assert segments["expandable"] == (segments["total"] if expandable else 0)


def test_expandable_segments_on_a_jetson_are_refused(run):
    if not torch.cuda.get_device_properties(0).is_integrated:
        pytest.skip("needs an integrated GPU (a Jetson)")
    from mtbench.errors import UsageError

    with pytest.raises(UsageError, match="integrated GPU"):
        run(CUDA + ["model=squeezenet", "batch=2", "memory.expandable_segments=true"])
