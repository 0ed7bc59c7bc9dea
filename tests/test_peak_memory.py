"""A CPU job's peak memory where VmHWM cannot be reset: this program's own peak, not its parent's size."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from mtbench.device import peak

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's")

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


def test_an_unresettable_peak_is_the_jobs_own_not_the_size_of_the_process_that_started_it():
    parent = bytearray(768 << 20)  # a sweep's parent holding memory when it starts a job; written, so resident
    parent[:: 4096] = b"x" * len(parent[:: 4096])
    rss = peak.current_rss_bytes()
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(child.stdout.strip().splitlines()[-1])
    del parent
    # Linux carries the parent's resident size across fork and exec into ru_maxrss: the old figure held it
    assert got["ru_maxrss"] >= 0.9 * rss, (got, rss)
    assert got["mem_peak_source"] == "process_hwm_lifetime" and got["mem_baseline_bytes"] is None
    assert 32 << 20 < got["mem_peak_bytes"] < rss - (512 << 20), (got, rss)


def test_without_proc_the_peak_is_ru_maxrss_and_says_so(monkeypatch):
    monkeypatch.setattr(peak, "_read_hwm_bytes", lambda: None)
    monkeypatch.setattr(peak, "_reset_hwm", lambda: False)
    p = peak.PeakMemory(torch.device("cpu"))
    p.reset()
    got = p.read()
    assert got["mem_peak_source"] == "process_ru_maxrss" and got["mem_baseline_bytes"] is None
    assert got["mem_peak_bytes"] == peak.ru_maxrss_bytes() >= peak.current_rss_bytes()
