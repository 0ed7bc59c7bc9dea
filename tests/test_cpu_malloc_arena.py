"""memory.cpu_malloc=auto's `cached` probe leaves the main heap as `live` left it (glibc's arenas, real malloc)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from mtbench.planning import malloc

# In a fresh interpreter (mallopt would hold for every later test here): blocks made under `cached` and freed with
# their neighbours kept, then under `live` a 4 MiB block made, written and freed. Prints the MiB still resident.
SCRIPT = textwrap.dedent("""
    import ctypes, re, sys
    import torch
    from mtbench.device import peak
    from mtbench.planning.malloc import in_own_arena
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    MIB = 1 << 20

    def anon():
        with open("/proc/self/status") as f:
            return int(re.search(r"RssAnon:\\s+(\\d+)", f.read()).group(1)) / 1024

    def cached_probe():  # as a probe step under cached: blocks from the heap, some freed, some kept (the gradients)
        blocks = [libc.malloc(8 * MIB) for _ in range(8)]
        for b in blocks:
            ctypes.memset(b, 1, 8 * MIB)
        for b in blocks[::2]:
            libc.free(b)
        return {"kept": blocks[1::2]}

    peak.set_cpu_malloc("cached", budgeted=True)
    kept = (in_own_arena(cached_probe) if sys.argv[1] == "own" else cached_probe())["kept"]
    peak.set_cpu_malloc("live", budgeted=True)
    peak.release_memory(torch.device("cpu"))
    before = anon()
    block = libc.malloc(4 * MIB)
    ctypes.memset(block, 1, 4 * MIB)
    libc.free(block)
    print(anon() - before)
""")


def _resident_after_free(where: str) -> float:
    out = subprocess.run([sys.executable, "-c", SCRIPT, where], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return float(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and /proc: Linux only")
def test_a_cached_probe_in_its_own_arena_leaves_live_tensors_mapped_fresh():
    # the failure, provoked: after a probe in the main thread, a live block comes from the probe's freed blocks and
    # stays resident when freed; after one in its own thread, it is mapped fresh and given back
    assert _resident_after_free("main") >= 3.5
    assert _resident_after_free("own") <= 0.5


def test_in_own_arena_returns_and_raises_as_the_call_would_and_keeps_the_thread_count():
    threads = torch.get_num_threads()
    assert malloc.in_own_arena(lambda: {"threads": torch.get_num_threads()}) == {"threads": threads}

    def fails() -> dict:
        raise MemoryError("out of memory")

    with pytest.raises(MemoryError, match="out of memory"):
        malloc.in_own_arena(fails)
