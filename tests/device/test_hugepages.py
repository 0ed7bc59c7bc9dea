"""Under `live` a job asks torch for transparent huge pages (THP_MEM_ALLOC_ENABLE) before its first CPU tensor and
checks with the kernel's own count (AnonHugePages) that it got them; `cached` turns them off for the rest of the
process; the user's setting and a launcher's are kept. Each case in a fresh interpreter: torch reads the variable
once per process."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mtbench.device import hugepages

MODE, PMD = hugepages.thp_setting("enabled"), hugepages.thp_setting("hpage_pmd_size")
pytestmark = pytest.mark.skipif(
    MODE != "madvise" or PMD != str(2 * 2**20) or not os.path.exists("/proc/self/smaps_rollup"),
    reason=f"these cases are for a kernel whose transparent huge pages are 2 MiB and given where advised "
           f"({hugepages.THP_DIR}: enabled {MODE}, hpage_pmd_size {PMD})")

PRELUDE = """
import ctypes, os, sys, torch
from mtbench.device import hugepages, peak
def huge_kib_for(mib):  # AnonHugePages gained by a fresh tensor, made and written
    before = hugepages._anon_huge_kib()
    t = torch.empty(mib << 20, dtype=torch.uint8); t.fill_(1)
    gained = hugepages._anon_huge_kib() - before
    del t
    return gained
env = lambda: os.environ.get("THP_MEM_ALLOC_ENABLE", "unset")
"""


def _run(body: str, **env) -> list:
    clean = {k: v for k, v in os.environ.items() if k != hugepages.THP_ENV and not k.startswith("MALLOC_")
             and k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
    out = subprocess.run([sys.executable, "-c", PRELUDE + body], env={**clean, **env}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.slow
def test_live_gets_huge_pages_cached_turns_them_off_and_live_again_unadvises_cacheds_ranges():
    out = _run("""
import re
def flags_at(address):  # the VmFlags of the mapping that holds address
    inside = False
    for line in open("/proc/self/smaps"):
        head = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if head:
            inside = int(head.group(1), 16) <= address < int(head.group(2), 16)
        elif inside and line.startswith("VmFlags:"):
            return "hg" if " hg" in line else "nh" if " nh" in line else "none"
hugepages.ask_torch()
torch.zeros(3)  # the planner's trace makes tensors after the job asked: torch reads the variable here
live = peak.hold_malloc_to_live_memory()
print(live["huge_pages"], huge_kib_for(64), env())
cached = peak.hold_malloc_cached()
kept = torch.ones(3 << 18)  # 3 MiB from glibc's heap under cached, advised by torch
print(cached["huge_pages"], huge_kib_for(64), env(), flags_at(kept.data_ptr()))
again = peak.hold_malloc_to_live_memory()
print(again["huge_pages"], huge_kib_for(64), env(), flags_at(kept.data_ptr()))
""")
    # a 64 MiB tensor under live: whole aligned 2 MiB blocks of it in huge pages; 4 KiB pages would gain nothing
    assert out[0] == "True" and int(out[1]) >= 2048, out
    assert out[2] == "unset", "the variable, once read, is taken out of the environment"
    assert out[3:7] == ["False", "0", "unset", "hg"], out
    # live again: on again, and the range torch advised under cached is unadvised (khugepaged leaves it alone)
    assert out[7] == "True" and int(out[8]) >= 2048 and out[9:] == ["unset", "nh"], out


@pytest.mark.slow
def test_live_twice_without_cached_between_keeps_its_answer():
    """A budgeted job sets live, then again where its plan's live peak leaves no room for a cached probe."""
    out = _run("""
hugepages.ask_torch()
first = peak.hold_malloc_to_live_memory()
second = peak.hold_malloc_to_live_memory()
print(first["huge_pages"], second["huge_pages"], second["huge_pages_note"] == first["huge_pages_note"], env())
print(huge_kib_for(64) >= 2048)
""")
    assert out == ["True", "True", "True", "unset", "True"], out


@pytest.mark.slow
def test_a_tensor_made_before_the_job_asks_means_no_huge_pages_and_says_why():
    out = _run("""
torch.zeros(3)  # torch reads the variable at its first CPU tensor: not set yet
live = peak.hold_malloc_to_live_memory()
print(live["huge_pages"], huge_kib_for(64), live["huge_pages_note"].count("before it was set"))
""")
    assert out == ["False", "0", "1"], out


@pytest.mark.slow
@pytest.mark.parametrize("value", ["0", "1 ", "true"])
def test_the_users_own_value_is_kept_and_cached_then_leaves_thp_alone(value):
    """torch >= 2.2 reads exactly "1" as on; anything else is off (with a warning): the check sees what torch did."""
    out = _run("""
hugepages.ask_torch()
live = peak.hold_malloc_to_live_memory()
print(live["huge_pages"], huge_kib_for(64), repr(env()).replace(" ", "_"))
cached = peak.hold_malloc_cached()
print("huge_pages" in cached, ctypes.CDLL(None).prctl(42, 0, 0, 0, 0))
""", THP_MEM_ALLOC_ENABLE=value)
    assert out[:3] == ["False", "0", repr(value).replace(" ", "_")], out
    assert out[3:] == ["False", "0"], "cached leaves THP alone where torch does not advise it"


@pytest.mark.slow
def test_thp_turned_off_by_what_started_the_job_stays_off():
    out = _run("""
libc = ctypes.CDLL(None)
assert libc.prctl(41, 1, 0, 0, 0) == 0  # as systemd's or a wrapper's setting would
live = peak.hold_malloc_to_live_memory()
print(live["huge_pages"], huge_kib_for(64), libc.prctl(42, 0, 0, 0, 0), env())
""")
    assert out == ["False", "0", "1", "unset"], out


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [["memory.cpu_malloc=live"],
                                       ["memory.plan=recompute", "memory.budget_gb=4", "memory.cpu_malloc=live"]],
                         ids=["live", "recompute-under-a-budget"])
def test_a_job_under_live_runs_in_huge_pages_and_says_so(tmp_path, overrides):
    """The wiring: the job asks before the planner's trace makes its first tensors (a budgeted recompute traces)."""
    env = {k: v for k, v in os.environ.items() if k != hugepages.THP_ENV}
    out = subprocess.run([sys.executable, "-m", "mtbench", "model=squeezenet", "batch=2", "device=cpu", "warmup=0",
                          "steps=1", "data.image_size=32", "memory.breakdown=false", *overrides,
                          f"hydra.run.dir={tmp_path}"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    held = json.loads((tmp_path / "summary.json").read_text())["cpu_malloc"]
    assert held["setting"] == "live" and held["huge_pages"] is True, held
