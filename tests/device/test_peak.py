"""A CPU job's peak memory where VmHWM cannot be reset: a program started by exec reports its own peak, not the
size ru_maxrss carries over from the process that started it."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from mtbench.device import peak
from tests.helpers.run_if import run_if

pytestmark = run_if(linux=True, why="VmHWM and clear_refs are Linux's")

CHILD = r"""
import json
from mtbench.device import peak
import torch
peak._reset_hwm = lambda: False  # a /proc that refuses the write to clear_refs (Linux before 4.0, a locked-down /proc)
p = peak.PeakMemory(torch.device("cpu"))
p.reset()
held = bytearray(32 << 20)  # touched: resident
print(json.dumps({**p.read(), "ru_maxrss": peak.ru_maxrss_bytes()}))
"""


@pytest.mark.slow
def test_an_unresettable_peak_is_the_jobs_own_not_the_size_of_the_process_that_started_it():
    parent = bytearray(768 << 20)  # a sweep's parent holding memory when it starts a job; written, so resident
    parent[:: 4096] = b"x" * len(parent[:: 4096])
    rss = peak.current_rss_bytes()
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(child.stdout.strip().splitlines()[-1])
    del parent
    # Linux carries the forked copy's resident size across exec into ru_maxrss (all of it under vfork; under plain
    # fork, at least the written pages): the old figure held the parent's 768 MiB
    assert got["ru_maxrss"] >= 768 << 20, (got, rss)
    assert got["mem_peak_source"] == "process_hwm_lifetime" and got["mem_baseline_bytes"] is None
    assert 32 << 20 < got["mem_peak_bytes"] < rss - (512 << 20), (got, rss)


def test_without_proc_the_peak_is_ru_maxrss_and_says_so(monkeypatch):
    monkeypatch.setattr(peak, "hwm_bytes", lambda: None)
    monkeypatch.setattr(peak, "_reset_hwm", lambda: False)
    p = peak.PeakMemory(torch.device("cpu"))
    p.reset()
    before = peak.ru_maxrss_bytes()
    got = p.read()
    assert got["mem_peak_source"] == "process_ru_maxrss" and got["mem_baseline_bytes"] is None
    # KiB on Linux, read as bytes; not compared with VmRSS, which the kernel counts apart (in an xdist worker it was
    # read above ru_maxrss)
    assert before <= got["mem_peak_bytes"] <= peak.ru_maxrss_bytes()


# In a fresh interpreter (mallopt holds for the rest of a process): glibc's dynamic threshold raised to 32 MiB by a
# freed 16 MiB mapping, then a heap left with 12 holes of 4 MiB, written (resident) and kept from the top by the
# blocks between them, as a training step's frees leave it; the "step" then holds 8 MiB. Prints the plain peak (the
# measured steps' reset and read) and measure_training_step's, less what the process owns without the holes.
HOLES = """
import ctypes, json
import torch
from mtbench.device import peak
torch.set_num_threads(1)
torch.ones(4 * 2**20)  # 16 MiB, freed at once: a mapping of its own, whose free raises the threshold to it
blocks = [torch.ones(2**20) for _ in range(24)]  # 4 MiB each, now from the heap
held = blocks[1::2]
del blocks
def step():
    x = torch.ones(2 * 2**20)  # 8 MiB
    return float(x.sum())
gauge = peak.PeakMemory(torch.device("cpu"))
gauge.reset()
step()
plain = gauge.read()["mem_training_peak_bytes"]
measured = peak.measure_training_step(torch.device("cpu"), step)
ctypes.CDLL("libc.so.6").malloc_trim(0)
print(json.dumps({"plain": plain, "measured": measured["mem_training_peak_bytes"], "owned": peak.anon_rss_bytes(),
                  "how": measured["mem_training_step"]}))
"""


@run_if(linux=True, why="glibc's malloc and /proc/self/status: Linux only")
def test_training_memory_leaves_out_the_holes_the_measured_steps_left_in_the_heap():
    """memory.cpu_malloc=auto without a budget: the measured steps run under glibc's own malloc, whose heap keeps
    every freed hole resident (which ones differs from run to run); measure_training_step counts what the step
    holds (8 MiB here) above what the process owns, not the 48 MiB of holes the plain peak carries."""
    child = subprocess.run([sys.executable, "-c", HOLES], capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(child.stdout)
    mib = 2**20
    assert 6 * mib <= got["measured"] - got["owned"] <= 12 * mib, got
    assert got["plain"] - got["measured"] >= 40 * mib, got
    assert "arena of its own" in got["how"], got["how"]
