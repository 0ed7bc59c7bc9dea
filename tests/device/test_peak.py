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
