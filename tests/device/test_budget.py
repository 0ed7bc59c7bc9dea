"""Budgets: the CUDA allocator is capped before the model exists; on CPU an over-budget peak is a "budget" failure."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mtbench.device import budget
from mtbench.device.oom import is_oom
from mtbench.device.targets import Target, load_target
from tests.conftest import compose_cfg
from tests.helpers.run_if import run_if
from tests.helpers.env import child_env

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
    assert {k: held[k] for k in ("budget_bytes", "budget_enforced_by")} == {"budget_bytes": 1610612736,
                                                                            "budget_enforced_by": "peak_check"}
    mem = {"mem_peak_bytes": 2 * 2**30, "mem_peak_source": "process_rss"}
    failure = budget.budget_failure(nano, mem, held["budget_enforced_by"])
    assert failure["kind"] == "budget"
    assert failure["message"].startswith("peak 2.00 GiB (the process's resident high-water mark (VmHWM)")
    assert "exceeds target nano's budget 1.50 GiB by 0.50 GiB (2147483648 > 1610612736 bytes)" in failure["message"]


def test_the_runtime_held_before_the_model_is_taken_off_the_peak():
    nano = load_target("nano")
    mem = {"mem_peak_bytes": 2 * 2**30, "mem_peak_source": "process_rss"}
    # 2 GiB peak, 0.75 GiB of it torch and its libraries before the model existed: 1.25 GiB fits in 1.5 GiB
    assert budget.compared_bytes(mem, 3 * 2**28) == 2 * 2**30 - 3 * 2**28
    assert budget.budget_failure(nano, mem, "peak_check", runtime_bytes=3 * 2**28) is None
    failure = budget.budget_failure(nano, mem, "peak_check", runtime_bytes=2**28)
    assert ("peak 2.00 GiB (the process's resident high-water mark (VmHWM) over the measured steps) less 0.25 GiB "
            "held before the model was built (the runtime) = 1.75 GiB exceeds target nano's budget 1.50 GiB by "
            "0.25 GiB") in failure["message"]


def test_current_rss_grows_with_a_touched_buffer_and_stays_below_the_high_water_mark():
    from mtbench.device.peak import current_rss_bytes
    from mtbench.device.peak import hwm_bytes

    import mmap

    # a fresh anonymous mapping, every page written: new resident pages whatever the heap holds (a tensor could be
    # served from freed blocks still resident from earlier tests in this worker: CI read no growth at all then)
    size = 64 * 2**20
    before = current_rss_bytes()
    buffer = mmap.mmap(-1, size)
    for offset in range(0, size, mmap.PAGESIZE):
        buffer[offset] = 1
    after = current_rss_bytes()
    assert after - before >= 60 * 2**20
    assert after <= hwm_bytes()
    buffer.close()


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


@run_if(cuda=True)
def test_cuda_cap_gives_a_real_out_of_memory_error():
    gpu = torch.device("cuda", 0)
    tiny = Target.from_mapping({**Target.none().to_dict(), "name": "tiny", "memory_budget_bytes": 256 * 2**20,
                                "memory_total_bytes": 512 * 2**20})
    try:
        assert budget.apply_budget(tiny, gpu)["budget_enforced_by"] == "cuda_memory_fraction"
        torch.empty(64 * 2**20, dtype=torch.uint8, device=gpu)  # fits
        # an OutOfMemoryError; on a Jetson torch build one of the allocator's NVML asserts (is_oom knows both)
        with pytest.raises(RuntimeError) as caught:
            torch.empty(512 * 2**20, dtype=torch.uint8, device=gpu)
        assert is_oom(caught.value), caught.value
    finally:
        budget.release_budget(gpu)
        torch.cuda.empty_cache()


# Tensors freed in the middle of glibc's heap stay resident when the mmap threshold has risen (a freed 16 MiB
# mapping raises it to 16 MiB): what a job held to a budget on CPU must not be charged for. In a process of its
# own, so that this process's allocator keeps its settings.
_HELD_SCRIPT = """
import sys, torch
from mtbench.device import budget
from mtbench.device.oom import is_oom
from mtbench.device.peak import current_rss_bytes
from mtbench.device.targets import load_target
if sys.argv[1] == "held":
    assert budget.apply_budget(load_target("nano"), torch.device("cpu"))["cpu_malloc"]["mmap_threshold_bytes"]
big = torch.ones(16 * 2**20, dtype=torch.uint8)  # a mapping of its own; freeing it raises a dynamic threshold
del big
before = current_rss_bytes()
parts = [torch.ones(8 * 2**20, dtype=torch.uint8) for _ in range(10)]  # 80 MiB, every page written
del parts[:-1]  # the last stays: the freed ones are not at the top of the heap, so not trimmed
print((current_rss_bytes() - before) // 2**20)
"""


@pytest.mark.slow
@run_if(linux=True, why="glibc's malloc")
def test_a_cpu_job_held_to_a_budget_is_not_charged_for_what_malloc_keeps():
    import subprocess

    def kept_mib(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _HELD_SCRIPT, mode], capture_output=True, text=True, check=True,
                             cwd=str(Path(__file__).resolve().parents[2]))
        return int(out.stdout.split()[-1])

    assert kept_mib("held") < 20  # the one live 8 MiB tensor and small change
    assert kept_mib("default") > 60  # the control: glibc's default keeps the freed 72 MiB


_PRELOADABLE = {"jemalloc": "libjemalloc.so.2", "tcmalloc": "libtcmalloc_minimal.so.4"}


def _system_library(name: str) -> str:
    """The path of a shared library the system's loader knows (Debian's libjemalloc2, libtcmalloc-minimal4), or a
    skip saying so."""
    import ctypes.util

    for folder in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"):
        if os.path.isfile(os.path.join(folder, name)):
            return os.path.join(folder, name)
    pytest.skip(f"{name} is not installed (Debian: apt-get install libjemalloc2 libtcmalloc-minimal4)"
                f"{'' if ctypes.util.find_library('c') else '; no libc found either'}")


_THRESHOLD = "from mtbench.device.peak import hold_malloc_to_live_memory as h; print(h()['mmap_threshold_bytes'])"


@pytest.mark.slow
@run_if(linux=True, why="glibc's malloc")
@pytest.mark.parametrize("allocator", sorted(_PRELOADABLE))
def test_a_preloaded_allocator_is_said_not_glibc(allocator):
    """With jemalloc or tcmalloc put in front of glibc (LD_PRELOAD), glibc's mallopt answers 1 and changes nothing:
    the summary must not claim the threshold was fixed. The real allocators, as CPU images preload them."""
    import subprocess

    library = _system_library(_PRELOADABLE[allocator])
    env = child_env()
    plain = subprocess.run([sys.executable, "-c", _THRESHOLD], capture_output=True, text=True, env=env, timeout=120)
    preloaded = subprocess.run([sys.executable, "-c", _THRESHOLD], capture_output=True, text=True, timeout=120,
                               env=dict(env, LD_PRELOAD=library))
    assert plain.stdout.split()[-1] == str(128 * 1024), plain.stderr
    assert preloaded.stdout.split()[-1] == "None", preloaded.stderr


def _is_position_dependent(executable: str) -> bool:
    """An ELF executable of type ET_EXEC (not PIE): its calls to malloc go through a PLT entry of its own, which
    is what `malloc` resolves to in the process."""
    with open(executable, "rb") as f:
        head = f.read(18)
    return head[:4] == b"\x7fELF" and int.from_bytes(head[16:18], "little") == 2


@run_if(linux=True, why="glibc's malloc")
def test_glibc_is_known_under_an_interpreter_that_is_not_position_independent():
    """Debian's /usr/bin/python3 is an ET_EXEC executable: the process's `malloc` is the executable's PLT entry, not
    glibc's address, and an address check called glibc a preloaded allocator. glibc.py imports no torch, so the
    system's own interpreter runs it as it is."""
    import subprocess

    system = os.path.realpath("/usr/bin/python3")
    if not os.path.isfile(system) or not _is_position_dependent(system):
        pytest.skip("no position-dependent /usr/bin/python3 here (Debian's is one)")
    code = ("import ctypes; from mtbench.device import glibc; "
            "p = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value; "
            "q = ctypes.cast(ctypes.CDLL('libc.so.6').malloc, ctypes.c_void_p).value; "
            "print(p != q, glibc.glibc_malloc() is not None)")
    repo = str(Path(__file__).resolve().parents[2])
    probe = [system, "-I", "-c", f"import sys; sys.path.insert(0, {repo!r}); {code}"]  # -I: no user site, no venv
    out = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    # the addresses differ (what fooled the old check), and glibc is still known to be the process's malloc
    assert out.stdout.split() == ["True", "True"], out.stderr
    library = _system_library(_PRELOADABLE["jemalloc"])
    preloaded = subprocess.run(probe, capture_output=True, text=True, timeout=60,
                               env=dict(os.environ, LD_PRELOAD=library))
    assert preloaded.stdout.split()[-1] == "False", preloaded.stderr


@pytest.mark.slow
@run_if(linux=True, why="glibc's malloc")
def test_cpu_malloc_settings_change_how_often_a_tensor_is_faulted_in():
    """memory.cpu_malloc, against the kernel's own count of page faults: with `live` a freed 4 MiB tensor goes back
    to the kernel and the next one is faulted in page by page; with `cached` glibc keeps it for the next (a heap
    top trimmed after each free, as a C int overflowed to a trim threshold of 0 did, would fault it in again)."""
    import subprocess

    code = """
import resource, sys, torch
from mtbench.device.peak import set_cpu_malloc
print(set_cpu_malloc(sys.argv[1], budgeted=False)["mmap_threshold_bytes"])
for _ in range(10):  # glibc settles (its heap grows for the first few)
    x = torch.ones(6 * 2 ** 20); del x
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    x = torch.ones(6 * 2 ** 20); del x  # 24 MiB each: below the 32 MiB threshold, at the heap's top
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
    base = child_env()
    base.pop("THP_MEM_ALLOC_ENABLE", None)
    out = {}
    # live in 4 KiB pages (huge pages kept off by the user's variable), cached, and live as a job runs it (in huge pages
    # where the kernel gives them: tests/device/test_hugepages.py)
    for name, mode, env in (("live", "live", dict(base, THP_MEM_ALLOC_ENABLE="0")), ("cached", "cached", base),
                            ("live_huge", "live", base)):
        proc = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, env=env)
        threshold, faults = proc.stdout.split()[-2:]
        out[name] = (int(threshold), int(faults))
    pages = 20 * 24 * 2**20 // 4096
    assert out["live"][0] == 128 * 1024 and out["live"][1] > 0.9 * pages, out
    assert out["cached"][0] == 32 * 2**20 and out["cached"][1] < 0.05 * pages, out
    # each tensor faulted in afresh all the same: at least its 11 whole 2 MiB pages (24 MiB, not 2 MiB-aligned)
    assert out["live_huge"][0] == 128 * 1024 and out["live_huge"][1] >= 20 * 11, out
    from mtbench.device import hugepages

    if hugepages.thp_setting("enabled") == "madvise" and hugepages.thp_setting("hpage_pmd_size") == str(2 * 2**20):
        assert out["live_huge"][1] < 0.5 * pages, out  # a fault per 2 MiB in most of each tensor


def test_an_unknown_cpu_malloc_is_refused(run):
    from mtbench.errors import UsageError

    with pytest.raises(UsageError, match="memory.cpu_malloc='fast' is not known; allowed: auto, glibc, live, cached"):
        run(["model=squeezenet", "batch=1", "memory.cpu_malloc=fast"])


def test_a_training_peak_is_compared_where_measured_and_named_in_the_failure():
    nano = load_target("nano")
    mem = {"mem_peak_bytes": 3 * 2**30, "mem_peak_source": "process_rss", "mem_training_peak_bytes": 2 * 2**30,
           "mem_file_bytes": 2**30}
    assert budget.compared_bytes(mem, 2**28) == 2 * 2**30 - 2**28
    failure = budget.budget_failure(nano, mem, "peak_check", runtime_bytes=2**28)
    assert failure["message"].startswith("peak 2.00 GiB (training memory: the resident high-water mark less the "
                                         "file-backed pages (the libraries' code)) less 0.25 GiB held")


def test_a_cpu_job_is_held_to_its_budget_on_the_training_memory_its_summary_reports(run):
    """The budget's figure is the summary's mem_training_bytes (VmHWM less the file-backed pages) less what the job
    owned before its model was built (budget_runtime_bytes), never VmHWM with the libraries' pages in it."""
    s = run(["model=squeezenet", "batch=2", "data.image_size=32", "warmup=1", "steps=2", "memory.breakdown=false",
             "memory.budget_gb=0.001"])
    assert s["failure"]["kind"] == "budget"
    assert s["mem_training_source"] == "rss_hwm_less_file"
    assert s["mem_training_bytes"] == s["mem_peak_bytes"] - s["mem_file_bytes"]
    compared = s["mem_training_bytes"] - s["budget_runtime_bytes"]
    assert f"({compared} > {s['budget_bytes']} bytes)" in s["failure"]["message"]
    assert 0 < s["budget_runtime_bytes"] < s["mem_runtime_bytes"]  # the runtime's own memory, not its mapped code
