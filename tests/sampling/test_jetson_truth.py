"""What a Jetson and a CUDA GPU do that CPU-only CI cannot: the NVML asserts of a failed cudaMalloc, expandable
segments on an integrated GPU, the allocator settings that took effect, the untimed step after a plan change
(issue 27 items 4, 5, 7, 9), with fakes that behave as torch does."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mtbench.device.oom import is_oom, is_oom_text, oom_message
from mtbench.errors import UsageError
from mtbench.planning import planner as planning
from mtbench.planning.planner import Planner
from mtbench.workload.base import SetupContext, Workload
from tests.conftest import compose_cfg
from tests.fake_workloads import _Base
from tests.helpers.compose import FAKE as FAKE_JOB

# The three texts of a failed cudaMalloc on a Jetson torch build (pytorch issues 185240, 112377, 112950, 130486):
# CUDACachingAllocator's reportProcessMemoryInfo asserts on NVML, which Tegra lacks, instead of raising OOM
JETSON_ASSERTS = [
    'NVML_SUCCESS == r INTERNAL ASSERT FAILED at "../c10/cuda/CUDACachingAllocator.cpp":830, please report a bug '
    'to PyTorch. ',
    'NVML_SUCCESS == DriverAPI::get()->nvmlInit_v2_() INTERNAL ASSERT FAILED at '
    '"../c10/cuda/CUDACachingAllocator.cpp":1123, please report a bug to PyTorch. ',
    'NVML_SUCCESS == DriverAPI::get()->nvmlDeviceGetHandleByPciBusId_v2_( pci_id, &nvml_device) INTERNAL ASSERT '
    'FAILED at "../c10/cuda/CUDACachingAllocator.cpp":815, please report a bug to PyTorch. ',
]
# the same asserts elsewhere in torch 2.14's libc10_cuda.so (peer access, a missing NVML symbol) are no OOM
NOT_OOM = [
    'NVML_SUCCESS == DriverAPI::get()->nvmlInit_v2_() INTERNAL ASSERT FAILED at '
    '"/__w/pytorch/pytorch/c10/cuda/PeerToPeerAccess.cpp":83, please report a bug to PyTorch. ',
    'r.nvmlInit_v2_ INTERNAL ASSERT FAILED at "/__w/pytorch/pytorch/c10/cuda/driver_api.cpp":70, please report a '
    'bug to PyTorch. ',
]


@pytest.mark.parametrize("text", JETSON_ASSERTS)
def test_every_jetson_nvml_assert_is_an_out_of_memory(text):
    assert is_oom(RuntimeError(text)) and is_oom_text("RuntimeError: " + text)


@pytest.mark.parametrize("text", NOT_OOM)
def test_the_same_asserts_outside_the_caching_allocator_are_not(text):
    assert not is_oom(RuntimeError(text))


class JetsonAssert(_Base):
    """Fails at step `at_step` (1-based) as a Jetson torch build does when cudaMalloc fails."""

    def __init__(self, variant: int = 0, at_step: int = 1) -> None:
        self.variant, self.at_step, self.steps = variant, at_step, 0

    def step(self) -> None:
        self.steps += 1
        if self.steps == self.at_step:
            raise RuntimeError(JETSON_ASSERTS[self.variant])


FAKE = [*FAKE_JOB, "model.workload._target_=tests.sampling.test_jetson_truth.JetsonAssert"]


@pytest.mark.parametrize("variant", [0, 1, 2])
def test_a_jetson_assert_in_warm_up_is_oom_and_names_the_cudnn_workspace(run, variant):
    s = run(FAKE + [f"+model.workload.variant={variant}", "warmup=1", "steps=2"])
    assert s["failure"]["kind"] == "oom", s["failure"]
    assert "INTERNAL ASSERT FAILED" in s["failure"]["message"] and "cuDNN workspace" in s["failure"]["message"]


def test_a_jetson_assert_in_a_measured_step_is_oom_without_the_warm_up_note(run):
    s = run(FAKE + ["+model.workload.variant=1", "+model.workload.at_step=3", "warmup=1", "steps=3"])
    assert s["failure"]["kind"] == "oom" and s["measured_steps"] == 1
    assert "cuDNN" not in s["failure"]["message"]
    assert oom_message("CUDA out of memory", True) == "CUDA out of memory"


# -- allocator settings on CUDA (fakes of torch's allocator-settings calls, as torch 2.9+ behaves) ----------------

class FakeAllocatorSettings:
    """torch._C._accelerator_{set,get}AllocatorSettings: "key:value" pairs, later ones replacing earlier."""

    def __init__(self) -> None:
        self.values = {}

    def set(self, text: str) -> None:
        for pair in text.split(","):
            key, _, value = pair.partition(":")
            self.values[key.strip()] = value.strip()

    def get(self) -> str:
        return ",".join(f"{k}:{v}" for k, v in self.values.items())


@pytest.fixture
def fake_gpu(monkeypatch):
    """A CUDA device 0 as torch describes it: properties, allocator settings and the allocator's snapshot."""
    settings = FakeAllocatorSettings()
    gpu = SimpleNamespace(props=SimpleNamespace(is_integrated=False, total_memory=16 * 2**30), settings=settings,
                          segments=[])
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: gpu.props)
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", settings.set, raising=False)
    monkeypatch.setattr(torch._C, "_accelerator_getAllocatorSettings", settings.get, raising=False)
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: gpu.segments)
    monkeypatch.delenv(planning.ALLOC_CONF, raising=False)
    return gpu


def test_expandable_segments_on_an_integrated_gpu_is_refused_before_the_model(fake_gpu):
    fake_gpu.props.is_integrated = True  # a Jetson: cuMemCreate/cuMemMap fail there
    planner = Planner(compose_cfg(["device=cuda", "memory.expandable_segments=true"]))
    with pytest.raises(UsageError) as caught:
        planner.before_build(torch.device("cuda", 0))
    assert "memory.expandable_segments=true" in str(caught.value) and "integrated" in str(caught.value)
    assert "\n" not in str(caught.value) and fake_gpu.settings.values == {}  # nothing was set


def test_the_allocator_setting_is_recorded_as_set_and_only_its_segments_say_what_took_effect(fake_gpu):
    """torch gives the settings string back as it was set: recorded as the value set, never as a confirmation;
    what took effect is the allocator's segments, and without a segment it is not known."""
    planner = Planner(compose_cfg(["device=cuda", "memory.expandable_segments=true"]))
    planner.before_build(torch.device("cuda", 0))
    assert fake_gpu.settings.values == {"expandable_segments": "True"}
    plan = planner.summary({"mem_peak_bytes": 10, "mem_peak_reserved_bytes": 0})
    assert plan["allocator"]["settings_set"] == "expandable_segments:True" and plan["allocator"]["requested"]
    assert plan["allocator"]["expandable_segments_set"] is True
    assert "not what the allocator applied" in plan["allocator"]["settings_note"]
    assert plan["expandable_segments"] is None  # no segment yet: the string set is no confirmation
    # the segments say what took effect: here the setting was asked for, yet the allocator's segments are not
    fake_gpu.segments = [{"is_expandable": False, "total_size": 2**21}]
    plan = planner.summary({"mem_peak_bytes": 10, "mem_peak_reserved_bytes": 2**21})
    assert plan["allocator"]["segments"] == {"total": 1, "expandable": 0}
    assert plan["expandable_segments"] is False
    fake_gpu.segments = [{"is_expandable": True, "total_size": 2**21}]
    assert planner.summary({})["expandable_segments"] is True


def test_without_a_read_back_call_the_record_says_so(fake_gpu, monkeypatch):
    monkeypatch.delattr(torch._C, "_accelerator_getAllocatorSettings")  # torch < 2.9
    planner = Planner(compose_cfg(["device=cuda"]))
    planner.before_build(torch.device("cuda", 0))
    plan = planner.summary({})
    assert plan["allocator"]["expandable_segments_set"] is None
    assert "does not give its allocator settings back" in plan["allocator"]["settings_note"]
    assert plan["expandable_segments"] is None  # no segments yet, no read-back: not known, never a guess


def test_a_cpu_job_has_no_allocator_record(run, monkeypatch):
    monkeypatch.delenv(planning.ALLOC_CONF, raising=False)
    s = run(["model=squeezenet", "batch=1", "data.image_size=8", "memory.expandable_segments=true"])
    assert s["success"], s["failure"]
    assert "expandable_segments" not in s["memory_plan"] and "allocator" not in s["memory_plan"]
    import os

    assert planning.ALLOC_CONF not in os.environ  # nor is CUDA's allocator configured by a CPU job


def test_warmup_0_with_cudnn_benchmark_on_cuda_warns_once(fake_gpu, capsys):
    Planner(compose_cfg(["device=cuda", "warmup=0"])).before_build(torch.device("cuda", 0))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mtbench: warning: warmup=0 with cudnn_benchmark=true")
    for quiet in (["warmup=1"], ["warmup=0", "cudnn_benchmark=false"]):
        Planner(compose_cfg(["device=cuda", *quiet])).before_build(torch.device("cuda", 0))
        assert capsys.readouterr().err == ""
    Planner(compose_cfg(["device=cpu", "warmup=0"])).before_build(torch.device("cpu"))
    assert capsys.readouterr().err == ""


# -- an untimed step after a plan change -----------------------------------------------------------------------

class CountingWorkload(Workload):
    def __init__(self) -> None:
        self.steps = 0

    def setup(self, ctx: SetupContext) -> None:
        pass

    def step(self) -> None:
        self.steps += 1

    def modules(self):
        return []

    def set_memory_plan(self, plan) -> None:
        self.plan = plan


def test_a_budget_file_replan_runs_an_untimed_step_before_the_next_measured_one(tmp_path):
    budget_file = tmp_path / "budget"
    budget_file.write_text("2 GiB")
    planner = Planner(compose_cfg(["warmup=0", f"memory.budget_file={budget_file}"]))
    planner.before_build(torch.device("cpu"))
    workload = CountingWorkload()
    planner.start(workload, lambda exc: False)
    planner.before_step(0)
    assert workload.steps == 0  # no change, no extra step
    budget_file.write_text("1.5 GiB")
    planner.before_step(1)
    assert workload.steps == 1 and planner.summary({})["untimed_steps_before"] == [1]
    planner.before_step(2)
    assert workload.steps == 1  # once per change


@pytest.mark.parametrize("warmup, untimed", [(0, [0]), (1, [])])
def test_auto_probes_are_followed_by_an_untimed_step_unless_a_warm_up_step_follows(run, monkeypatch, warmup, untimed):
    from mtbench.device import peak

    monkeypatch.setattr(peak, "set_cpu_malloc", lambda mode, budgeted: {"note": "fake"})
    s = run(["model=squeezenet", "batch=2", "data.image_size=8", f"warmup={warmup}", "steps=1", "memory.plan=auto",
             "memory.select=probes", "target.memory_budget_bytes=2000000000"])
    assert s["success"], s["failure"]
    assert s["memory_plan"]["method"] == "probes" and s["memory_plan"]["untimed_steps_before"] == untimed


def test_an_orin_rails_resolution_is_the_hwmon_update_interval(tmp_path):
    """The ina3221 hwmon driver (L4T 35+) says how often its readings change in `update_interval` (ms): the rails
    take it as their resolution (said as the device's), instead of learning it from the samples."""
    from mtbench.sampling.jetson import JetsonSensor
    from tests.fake_sysfs import make_orin

    files = make_orin(tmp_path, {"VDD_IN": (5000.0, 1000.0), "VDD_CPU_GPU_CV": (5000.0, 400.0)})
    (next(iter(files.values())).parent / "update_interval").write_text("100\n")
    sensor = JetsonSensor(str(tmp_path))
    try:
        rails = [f for f in sensor.fields() if f.group == "power"]
        assert rails and all(f.resolution_s == 0.1 and f.resolution_how == "device" for f in rails)
        assert "update_interval, 100 ms" in rails[0].resolution_note
    finally:
        sensor.close()
    (next(iter(files.values())).parent / "update_interval").unlink()  # the iio driver of L4T 32 has none
    sensor = JetsonSensor(str(tmp_path))
    try:
        assert all(f.resolution_s is None for f in sensor.fields())
    finally:
        sensor.close()
