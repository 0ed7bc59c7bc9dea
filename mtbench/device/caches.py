"""The size of a machine's last-level cache (a CPU's from sysfs, a CUDA GPU's L2 from torch), for the predictor."""
from __future__ import annotations

import glob
import os
import re
from typing import Optional

from mtbench.regular_files import read_head

CPU_CACHES = "/sys/devices/system/cpu/cpu0/cache"  # index<N>/{level,type,size} (ABI: sysfs-devices-system-cpu)
_SIZE = re.compile(r"^(\d+)([KMG]?)$")
_SHIFT = {"": 0, "K": 10, "M": 20, "G": 30}


def cpu_last_level_cache_bytes(root: str = CPU_CACHES) -> Optional[int]:
    """Bytes of cpu0's largest data or unified cache ("32768K" in index3/size on this VM's EPYC: its L3); None where
    sysfs lists none (a container without /sys, another OS)."""
    best: Optional[int] = None
    for folder in sorted(glob.glob(os.path.join(root, "index*"))):
        try:
            kind = read_head(os.path.join(folder, "type"), 64).decode(errors="replace").strip()
            size = read_head(os.path.join(folder, "size"), 64).decode(errors="replace").strip()
        except OSError:
            continue
        match = _SIZE.match(size)
        if kind == "Instruction" or not match:
            continue
        nbytes = int(match.group(1)) << _SHIFT[match.group(2)]
        best = nbytes if best is None else max(best, nbytes)
    return best


def gpu_l2_cache_bytes() -> Optional[int]:
    """This host's first CUDA GPU's L2 cache (torch's device properties); None without a GPU, or on a torch that does
    not report it."""
    import torch

    if not torch.cuda.is_available():
        return None
    return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 0) or None
