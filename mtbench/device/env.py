"""What the result was measured on: versions, host, device name, and on a Jetson the board, L4T, power mode, clocks."""
from __future__ import annotations

import glob
import os
import platform
import re
from typing import Any, Dict, List, Optional

from mtbench.sampling.sysfs import read_small


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                # x86 says "model name"; ARM kernels (Jetson) often give only "Hardware" / "CPU part"
                if line.lower().startswith(("model name", "hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host() -> Dict[str, Any]:
    """The machine, without importing torch (mtbench-sample uses this alone)."""
    import numpy

    import mtbench

    return {
        "versions": {"mtbench": mtbench.__version__, "python": platform.python_version(), "numpy": numpy.__version__},
        "host": platform.node(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "device_name": cpu_model(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
    }


def describe(device: Any, root: str = "/") -> Dict[str, Any]:
    """host() plus the torch stack, the training device and the Jetson board (null elsewhere; `root`: where
    /proc, /sys and /etc are found, as sampler.sysfs_root)."""
    import hydra
    import torch
    import torchvision

    out = host()
    out["versions"].update({
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "hydra": hydra.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
    })
    out["device_name"] = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    out["torch_threads"] = torch.get_num_threads()
    out["cuda_math"] = cuda_math() if device.type == "cuda" else None
    out["jetson"] = jetson(root)
    return out


def cuda_math() -> Dict[str, Any]:
    """The float32 math a CUDA job's kernels were allowed (TF32, reduced-precision reductions): what decides a
    step's time and numerics on Ampere and newer. Each setting torch has, as torch reports it (torch >= 2.9 names
    them fp32_precision; older ones allow_tf32); null where this torch has no such setting."""
    import warnings

    import torch

    reads = {
        "float32_matmul_precision": lambda: torch.get_float32_matmul_precision(),
        "matmul_fp32_precision": lambda: torch.backends.cuda.matmul.fp32_precision,  # torch >= 2.9
        "cudnn_conv_fp32_precision": lambda: torch.backends.cudnn.conv.fp32_precision,  # torch >= 2.9
        "matmul_allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
        "matmul_allow_fp16_reduced_precision_reduction":
            lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "matmul_allow_bf16_reduced_precision_reduction":
            lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
    }
    out: Dict[str, Any] = {}
    for name, read in reads.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch >= 2.9 deprecates allow_tf32 in favour of fp32_precision
            try:
                value = read()
            except (AttributeError, RuntimeError):
                value = None
        out[name] = value if isinstance(value, (bool, str)) or value is None else str(value)
    return out


# (implementer, part) from /proc/cpuinfo -> core type; NVIDIA's own cores have implementer 0x4e
CPU_PARTS = {
    ("0x41", "0xd03"): "cortex-a53", ("0x41", "0xd07"): "cortex-a57", ("0x41", "0xd08"): "cortex-a72",
    ("0x41", "0xd09"): "cortex-a73", ("0x41", "0xd0b"): "cortex-a76", ("0x41", "0xd41"): "cortex-a78",
    ("0x41", "0xd42"): "cortex-a78ae", ("0x41", "0xd4f"): "neoverse-v2",
    ("0x4e", "0x003"): "denver2", ("0x4e", "0x004"): "carmel",
}
# the GPU's devfreq node: gp10b (TX2), gm20b (Nano: 57000000.gpu), gv11b (Xavier), ga10b (Orin)
GPU_DEVFREQ = ("gp10b", "gm20b", "gv11b", "ga10b", "gpu")
# the memory (EMC) clock is in debugfs (root only): L4T r32/r35, then Orin's BPMP
EMC_RATE_FILES = ("sys/kernel/debug/clk/emc/clk_rate", "sys/kernel/debug/bpmp/debug/clk/emc/rate")


MAX_READ_BYTES = 1 << 16  # nvpmodel.conf is a few kB; everything else a line


def _read(root: str, rel: str) -> Optional[str]:
    """A small regular file's text; None where it is missing, unreadable, or not a regular file (a FIFO
    planted at etc/nv_tegra_release must not block the job)."""
    data = read_small(os.path.join(root, rel), MAX_READ_BYTES)
    return None if data is None else data.decode("utf-8", "replace").replace("\x00", "").strip()


def _int(text: Optional[str]) -> Optional[int]:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def jetson(root: str = "/") -> Optional[Dict[str, Any]]:
    """The Jetson this runs on (None elsewhere); each field None where this user cannot read it."""
    release = _read(root, "etc/nv_tegra_release")
    compatible = _read(root, "proc/device-tree/compatible") or ""
    if release is None and "nvidia,tegra" not in compatible:
        return None
    return {
        "board": _read(root, "proc/device-tree/model"),
        "l4t": l4t_release(release),
        "power_mode": power_mode(root),
        "gpu_freq_hz": gpu_clock(root),
        "emc_freq_hz": next((v for v in (_int(_read(root, f)) for f in EMC_RATE_FILES) if v is not None), None),
        "cpu_cores": cpu_cores(root),
    }


def l4t_release(text: Optional[str]) -> Optional[str]:
    """'# R32 (release), REVISION: 7.1, ...' -> '32.7.1'."""
    match = re.search(r"R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", text or "")
    return f"{match.group(1)}.{match.group(2)}" if match else None


def power_mode(root: str = "/") -> Optional[Dict[str, Any]]:
    """nvpmodel's current mode: its id from /var/lib/nvpmodel/status, its name from /etc/nvpmodel.conf."""
    status = _read(root, "var/lib/nvpmodel/status")
    match = re.search(r"pmode:(\d+)", status or "")
    if not match:
        return None
    mode_id = int(match.group(1))
    names = dict((int(i), n) for i, n in re.findall(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=(\S+?)\s*>",
                                                     _read(root, "etc/nvpmodel.conf") or ""))
    return {"id": mode_id, "name": names.get(mode_id)}


def gpu_clock(root: str = "/") -> Optional[Dict[str, Optional[int]]]:
    for dev in sorted(glob.glob(os.path.join(root, "sys/class/devfreq/*"))):
        if any(key in os.path.basename(dev) for key in GPU_DEVFREQ):
            rel = os.path.relpath(dev, root)
            return {"cur": _int(_read(root, f"{rel}/cur_freq")), "max": _int(_read(root, f"{rel}/max_freq"))}
    return None


def cpu_cores(root: str = "/") -> List[Dict[str, Any]]:
    """Each CPU core: index, type (from /proc/cpuinfo), online, current and maximum clock (Hz)."""
    types: Dict[int, str] = {}
    index, implementer = None, None
    for line in (_read(root, "proc/cpuinfo") or "").splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "processor":
            index = _int(value)
        elif key == "CPU implementer":
            implementer = value.lower()
        elif key == "CPU part" and index is not None:
            part = value.lower()
            types[index] = CPU_PARTS.get((implementer or "", part), f"{implementer}:{part}")
    cores = []
    paths = glob.glob(os.path.join(root, "sys/devices/system/cpu/cpu[0-9]*"))
    for n in sorted(int(os.path.basename(p)[3:]) for p in paths):
        rel = f"sys/devices/system/cpu/cpu{n}"
        online = _read(root, f"{rel}/online")
        khz_cur = _int(_read(root, f"{rel}/cpufreq/scaling_cur_freq"))
        khz_max = _int(_read(root, f"{rel}/cpufreq/cpuinfo_max_freq"))
        cores.append({
            "cpu": n,
            "type": types.get(n),  # an offline core is absent from /proc/cpuinfo: None
            "online": n in types if online is None else online == "1",
            "cur_freq_hz": None if khz_cur is None else khz_cur * 1000,
            "max_freq_hz": None if khz_max is None else khz_max * 1000,
        })
    return cores
