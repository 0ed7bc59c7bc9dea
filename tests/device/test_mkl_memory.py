"""MKL's memory manager, read from its own statistics: the buffers it keeps are resident memory the kernel counts,
and a torch or library where they cannot be read gives null with the reason."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from mtbench.device import mkl_memory
from tests.helpers.run_if import run_if

# products shaped as seq2seq's output projection over four padded batches (rows = target length x batch): MKL's
# memory manager keeps each product's packing buffers and makes new ones for a product with more rows
CHILD = r"""
import json, torch
from mtbench.device.mkl_memory import MklMemory
from mtbench.device.peak import anon_rss_bytes
mkl = MklMemory()
mkl.start()
mkl.reset()
weight = torch.randn(512, 7709)
rows = [torch.randn(n, 512) for n in (42, 62, 64, 74)]
before = anon_rss_bytes()
for x in rows:
    y = x @ weight
    del y
print(json.dumps({**mkl.read(), "anon": anon_rss_bytes() - before, "held": mkl.held()}))
"""

needs_mkl = pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="this torch is built without MKL")


def _child(fast_mm: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "MKL_DISABLE_FAST_MM"}
    if not fast_mm:
        env["MKL_DISABLE_FAST_MM"] = "1"  # read by MKL as the process starts
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, check=True,
                         env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_mkl
@run_if(linux=True, why="RssAnon is Linux's")
def test_the_buffers_mkl_keeps_are_resident_memory_and_its_peak_counts_them():
    kept = _child(fast_mm=True)
    # the kernel's count of the process's anonymous memory grew by what MKL says it keeps (the products' outputs
    # were freed: under 2 MiB each, below glibc's mmap threshold, they stay in the heap, reused)
    assert kept["mem_mkl_bytes"] == kept["held"] > 16 << 20, kept
    assert abs(kept["anon"] - kept["held"]) <= 0.1 * kept["held"], kept
    off = _child(fast_mm=False)
    # MKL_DISABLE_FAST_MM: each product's buffers are given back after it; its peak is one product's
    assert off["held"] == 0 and 0 < off["mem_mkl_bytes"] < kept["mem_mkl_bytes"] / 2, off


@needs_mkl
def test_a_window_counts_what_mkl_held_at_its_start():
    mkl = mkl_memory.process()
    mkl.start()
    torch.randn(64, 1024) @ torch.randn(1024, 4096)  # buffers kept from before the window
    held = mkl.held()
    mkl.reset()
    got = mkl.read()
    assert held is not None and held > 0 and got["mem_mkl_bytes"] == held, (held, got)


def test_a_torch_without_mkl_gives_null_and_why(monkeypatch):
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: False)
    mkl = mkl_memory.MklMemory()
    mkl.reset()
    got = mkl.read()
    assert got["mem_mkl_bytes"] is None and "built without MKL" in got["mem_mkl_note"], got
    assert mkl.held() is None


@needs_mkl
def test_a_library_not_already_loaded_is_not_opened(tmp_path):
    planted = tmp_path / "libtorch_cpu.so"
    planted.write_bytes(b"\x7fELF not a library")  # dlopen would refuse it; RTLD_NOLOAD does not even read it
    mkl = mkl_memory.MklMemory(library=str(planted))
    mkl.start()
    got = mkl.read()
    assert got["mem_mkl_bytes"] is None and "not loaded" in got["mem_mkl_note"], got
