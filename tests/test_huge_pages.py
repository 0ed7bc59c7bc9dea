"""Under `live` a job asks torch for transparent huge pages (THP_MEM_ALLOC_ENABLE) before its first CPU tensor, checks
with the kernel's own count (AnonHugePages) that it got them, turns them off under `cached` and on again under `live`;
each case in a fresh interpreter, as torch reads the variable once per process."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from mtbench.device.peak import THP_ENV, THP_MODE_FILE


def _thp_mode() -> str:
    try:
        with open(THP_MODE_FILE) as f:
            found = re.search(r"\[(\w+)\]", f.read())
    except OSError:
        return "missing"
    return found.group(1) if found else "missing"


pytestmark = pytest.mark.skipif(
    _thp_mode() not in ("madvise", "always") or not os.path.exists("/proc/self/smaps_rollup"),
    reason=f"this kernel gives no transparent huge pages to ask for ({THP_MODE_FILE}: {_thp_mode()})")

PRELUDE = """
import os, sys, torch
from mtbench.device import peak
def huge_kib_for(mib):  # AnonHugePages gained by a fresh tensor, made and written
    before = peak._anon_huge_kib()
    t = torch.empty(mib << 20, dtype=torch.uint8); t.fill_(1)
    gained = peak._anon_huge_kib() - before
    del t
    return gained
"""


def _run(body: str, **env) -> str:
    clean = {k: v for k, v in os.environ.items() if k != THP_ENV and not k.startswith("MALLOC_")
             and k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
    out = subprocess.run([sys.executable, "-c", PRELUDE + body], env={**clean, **env}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_live_gets_huge_pages_cached_does_not_and_live_again_does():
    out = _run("""
peak.ask_torch_for_huge_pages()
torch.zeros(3)  # the trace's tensors come after the job asked: torch reads the variable here
live = peak.hold_malloc_to_live_memory()
print(live["huge_pages"], huge_kib_for(64), os.environ.get("THP_MEM_ALLOC_ENABLE", "unset"))
cached = peak.hold_malloc_cached()
print(cached["huge_pages"], huge_kib_for(64))
again = peak.hold_malloc_to_live_memory()
print(again["huge_pages"], huge_kib_for(64))
""")
    # a 64 MiB tensor under live: the kernel backs at least 31 of its 2 MiB pages with huge ones
    assert out[0] == "True" and int(out[1]) >= 31 * 2048, out
    assert out[2] == "unset", "the variable, once read, is not passed on to processes the job starts"
    assert out[3] == "False" and int(out[4]) == 0, out
    assert out[5] == "True" and int(out[6]) >= 31 * 2048, out


def test_a_tensor_made_before_the_job_asks_means_no_huge_pages_and_says_why():
    out = _run("""
torch.zeros(3)  # torch reads the variable at its first CPU tensor: not set yet
live = peak.hold_malloc_to_live_memory()
print(live["huge_pages"], huge_kib_for(64), live["huge_pages_note"].count("before it was set"))
""")
    if _thp_mode() == "always":  # the kernel gives them without torch's advice
        assert out[0] == "True"
    else:
        assert out == ["False", "0", "1"], out


def test_the_users_own_setting_is_kept():
    out = _run("""
peak.ask_torch_for_huge_pages()
live = peak.hold_malloc_to_live_memory()
print(live["huge_pages"], huge_kib_for(64), os.environ["THP_MEM_ALLOC_ENABLE"])
cached = peak.hold_malloc_cached()
print("huge_pages" in cached)
""", THP_MEM_ALLOC_ENABLE="0")
    if _thp_mode() == "madvise":
        assert out[:3] == ["False", "0", "0"], out
    assert out[3] == "False", "cached leaves THP alone where live did not ask for it"


@pytest.mark.parametrize("overrides", [["memory.cpu_malloc=live"], ["memory.plan=recompute", "memory.budget_gb=4", "memory.cpu_malloc=live"]],
                         ids=["live", "recompute-under-a-budget"])
def test_a_job_under_live_runs_in_huge_pages_and_says_so(tmp_path, overrides):
    """The wiring: the job asks before the planner's trace makes its first tensors (a budgeted job traces)."""
    env = {k: v for k, v in os.environ.items() if k != THP_ENV}
    out = subprocess.run([sys.executable, "-m", "mtbench", "model=squeezenet", "batch=2", "device=cpu", "warmup=0",
                          "steps=1", "data.image_size=32", "memory.breakdown=false", *overrides,
                          f"hydra.run.dir={tmp_path}"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    held = json.loads((tmp_path / "summary.json").read_text())["cpu_malloc"]
    assert held["setting"] == "live" and held["huge_pages"] is True, held
