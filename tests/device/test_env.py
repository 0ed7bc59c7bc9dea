"""env records the Jetson board, L4T release, power mode, clocks and core types from fake trees; null elsewhere."""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import torch

from mtbench.device import env

TX2_RELEASE = "# R32 (release), REVISION: 7.1, GCID: 29818004, BOARD: t186ref, EABI: aarch64, DATE: Sat Feb 19 17:05:08 UTC 2022\n"
TX2_NVPMODEL = """< PARAM TYPE=FILE NAME=CPU_ONLINE >
CORE_0 /sys/devices/system/cpu/cpu0/online
< POWER_MODEL ID=0 NAME=MAXN >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=1 NAME=MAXQ >
CPU_ONLINE CORE_1 0
< POWER_MODEL ID=3 NAME=MAXP_CORE_ARM >
< PM_CONFIG DEFAULT=3 >
"""


def _cpuinfo(parts: List[Optional[tuple]]) -> str:
    blocks = []
    for i, part in enumerate(parts):
        if part is None:  # offline: the kernel leaves it out
            continue
        implementer, number = part
        blocks.append(f"processor\t: {i}\nBogoMIPS\t: 62.50\nCPU implementer\t: {implementer}\n"
                      f"CPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: {number}\nCPU revision\t: 3\n")
    return "\n".join(blocks)


def make_jetson(root: Path, model: str, release: str, parts: List[Optional[tuple]], gpu: str,
                khz: int, nvpmodel: Optional[tuple] = None, emc_rel: Optional[str] = None) -> None:
    def put(rel: str, text: str) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    put("proc/device-tree/model", model + "\x00")
    put("proc/device-tree/compatible", "nvidia,p3310-1000+p2597-0000-a00\x00nvidia,tegra186\x00")
    put("etc/nv_tegra_release", release)
    put("proc/cpuinfo", _cpuinfo(parts))
    for i, part in enumerate(parts):
        put(f"sys/devices/system/cpu/cpu{i}/online", "1\n" if part else "0\n")
        if part:
            put(f"sys/devices/system/cpu/cpu{i}/cpufreq/scaling_cur_freq", f"{khz}\n")
            put(f"sys/devices/system/cpu/cpu{i}/cpufreq/cpuinfo_max_freq", f"{khz}\n")
    put(f"sys/class/devfreq/{gpu}/cur_freq", "1300500000\n")
    put(f"sys/class/devfreq/{gpu}/max_freq", "1300500000\n")
    put("sys/class/devfreq/3d00000.pcie/cur_freq", "1\n")  # not the GPU
    if nvpmodel:
        put("var/lib/nvpmodel/status", nvpmodel[0])
        put("etc/nvpmodel.conf", nvpmodel[1])
    if emc_rel:
        put(emc_rel, "1866000000\n")


A57, DENVER2, A78AE = ("0x41", "0xd07"), ("0x4e", "0x003"), ("0x41", "0xd42")


def test_tx2_board_release_power_mode_clocks_and_core_types(tmp_path):
    make_jetson(tmp_path, "quill", TX2_RELEASE, [A57, DENVER2, DENVER2, A57, A57, A57], "17000000.gp10b", 2035200,
                nvpmodel=("pmode:0000\n", TX2_NVPMODEL), emc_rel="sys/kernel/debug/clk/emc/clk_rate")
    info = env.jetson(str(tmp_path))
    assert info["board"] == "quill"
    assert info["l4t"] == "32.7.1"
    assert info["power_mode"] == {"id": 0, "name": "MAXN"}
    assert info["gpu_freq_hz"] == {"cur": 1300500000, "max": 1300500000}
    assert info["emc_freq_hz"] == 1866000000
    assert [c["type"] for c in info["cpu_cores"]] == ["cortex-a57", "denver2", "denver2"] + ["cortex-a57"] * 3
    assert all(c["online"] and c["cur_freq_hz"] == 2035200000 for c in info["cpu_cores"])


def test_tx2_with_denver_cores_off_and_no_root_access(tmp_path):
    # power mode 3 turns the Denver2 cores off; without root, debugfs (EMC) is unreadable
    make_jetson(tmp_path, "quill", TX2_RELEASE, [A57, None, None, A57, A57, A57], "17000000.gp10b", 1420800,
                nvpmodel=("pmode:0003\n", TX2_NVPMODEL))
    info = env.jetson(str(tmp_path))
    assert info["power_mode"] == {"id": 3, "name": "MAXP_CORE_ARM"}
    assert info["emc_freq_hz"] is None
    offline = [c for c in info["cpu_cores"] if not c["online"]]
    assert [c["cpu"] for c in offline] == [1, 2] and all(c["type"] is None for c in offline)


def test_orin_without_nvpmodel_files(tmp_path):
    release = "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: Wed Jan  8 01:49:37 UTC 2025\n"
    make_jetson(tmp_path, "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super", release,
                [A78AE] * 6, "17000000.ga10b", 1728000, emc_rel="sys/kernel/debug/bpmp/debug/clk/emc/rate")
    info = env.jetson(str(tmp_path))
    assert info["board"].startswith("NVIDIA Jetson Orin Nano") and info["l4t"] == "36.4.3"
    assert info["power_mode"] is None
    assert info["emc_freq_hz"] == 1866000000
    assert {c["type"] for c in info["cpu_cores"]} == {"cortex-a78ae"}


def test_not_a_jetson_is_null(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R)\n")
    assert env.jetson(str(tmp_path)) is None
    assert env.describe(torch.device("cpu"), root=str(tmp_path))["jetson"] is None


def _never_blocks(fn, fifo: Path):
    """fn() in a thread: it must return within 2 s; a reader stuck in open() is freed before failing."""
    import threading
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("value", fn()), daemon=True)
    thread.start()
    thread.join(2.0)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # a writer frees the blocked open
        thread.join(2.0)
        raise AssertionError(f"blocked on the FIFO {fifo}")
    return out.get("value")


def test_a_fifo_at_nv_tegra_release_does_not_block(tmp_path):
    """Issue 19 item 6: nothing under the sysfs root is opened unless it is a regular file."""
    make_jetson(tmp_path, "NVIDIA Jetson TX2", TX2_RELEASE, [A57] * 4, "17000000.gp10b", 2035200)
    release = tmp_path / "etc/nv_tegra_release"
    release.unlink()
    os.mkfifo(release)
    info = _never_blocks(lambda: env.jetson(str(tmp_path)), release)
    assert info["board"] == "NVIDIA Jetson TX2" and info["l4t"] is None


def _tx2_cores_and_tick_fields(tmp_path):
    """A TX2 tree's cores as env.jetson reads them (2 Denver2, 4 Cortex-A57) and procfs's busy/total tick fields
    of its six CPUs."""
    from mtbench.sampling.sensor import COUNTER, Field

    make_jetson(tmp_path, "NVIDIA Jetson TX2", TX2_RELEASE, [A57, DENVER2, DENVER2, A57, A57, A57],
                "17000000.gp10b", 2035200)
    fields = [Field(f"cpu{c}_{kind}_ticks", COUNTER, f"cpu_{kind}", str(c)) for c in range(6)
              for kind in ("busy", "total")]
    return env.jetson(str(tmp_path))["cpu_cores"], fields


def test_tx2_cpu_util_grouped_by_core_type(tmp_path):
    """Issue 27 item 15: the paper reports Denver2 and Cortex-A57 apart; the sampler's figures group by type."""
    from mtbench.sampling.sampler import Samples
    from mtbench.sampling.windows import cpu_util_by_core_type
    cores, fields = _tx2_cores_and_tick_fields(tmp_path)
    busy_per_s = [60, 10, 20, 60, 60, 60]  # ticks a second of 100: the A57s 60 % busy, the Denvers 10 and 20 %
    rows = [[v for c in range(6) for v in (busy_per_s[c] * t, 100 * t)] for t in (0.0, 1.0, 2.0)]
    got = cpu_util_by_core_type(Samples(fields, [0.0, 1.0, 2.0], rows), [(0.0, 2.0)], cores)
    assert got == {"cortex-a57": {"mean": 60.0, "cpus": [0, 3, 4, 5]}, "denver2": {"mean": 15.0, "cpus": [1, 2]}}


def test_tx2_steps_csv_columns_per_core_type(tmp_path):
    """Issue 27 item 15: steps.csv has each step's busy % per core type beside the whole CPU's."""
    from mtbench.sampling.sampler import Samples, StepMark
    from mtbench.sampling.windows import step_rows
    cores, fields = _tx2_cores_and_tick_fields(tmp_path)
    # second 0-1: the A57s 60 % busy, the Denvers idle; second 1-2: the Denvers 80 %, the A57s 20 %
    busy = {0.0: [0] * 6, 1.0: [60, 0, 0, 60, 60, 60], 2.0: [80, 80, 80, 80, 80, 80]}
    rows = [[v for c in range(6) for v in (busy[t][c], 100 * t)] for t in (0.0, 1.0, 2.0)]
    samples = Samples(fields, [0.0, 1.0, 2.0], rows)
    marks = [StepMark(0, 0.0, 1.0, False), StepMark(1, 1.0, 2.0, False)]
    header, out = step_rows(marks, samples, 1000.0, cores)
    a57, denver = header.index("cpu_util_pct_cortex-a57"), header.index("cpu_util_pct_denver2")
    assert [(r[a57], r[denver]) for r in out] == [(60.0, 0.0), (20.0, 80.0)]
    assert "cpu_util_pct_denver2" not in step_rows(marks, samples, 1000.0)[0]  # no types: no columns


def test_a_jobs_summary_groups_cpu_by_core_type_on_a_tx2_tree(tmp_path, run):
    """summary.json `cpu_util_pct.by_core_type`: the job's own procfs ticks, grouped by the board's core types."""
    make_jetson(tmp_path, "NVIDIA Jetson TX2", TX2_RELEASE, [A57, DENVER2, DENVER2, A57, A57, A57],
                "17000000.gp10b", 2035200)
    s = run(["model=squeezenet", "batch=1", "steps=3", "warmup=0", "device=cpu", "sampler=procfs",
             f"sampler.sysfs_root={tmp_path}"])
    groups = s["cpu_util_pct"]["by_core_type"]
    here = {str(c) for c in range(os.cpu_count() or 1)}  # this machine's cores, typed by the fake board's list
    assert set(groups) <= {"cortex-a57", "denver2"} and groups, groups
    assert {str(c) for g in groups.values() for c in g["cpus"]} <= here
    assert all(g["mean"] is None or 0 <= g["mean"] <= 100 for g in groups.values())
    header = (tmp_path / "job" / "steps.csv").read_text().splitlines()[0].split(",")
    assert {f"cpu_util_pct_{t}" for t in groups} <= set(header)


def test_a_cuda_summary_records_the_float32_math_its_kernels_were_allowed(monkeypatch):
    """TF32 and matmul precision decide a CUDA step's time and numerics: every CUDA job's env records them as torch
    reports them (a CPU job's is null)."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        described = env.describe(torch.device("cuda", 0))
    finally:
        torch.set_float32_matmul_precision(before)
    math = described["cuda_math"]
    assert math["float32_matmul_precision"] == "high"
    assert math["matmul_allow_tf32"] is True  # "high" allows TF32 in matmuls, as torch reports it
    assert set(math) >= {"cudnn_allow_tf32", "matmul_allow_fp16_reduced_precision_reduction"}
    assert all(v is None or isinstance(v, (bool, str)) for v in math.values())
    assert env.describe(torch.device("cpu"))["cuda_math"] is None
