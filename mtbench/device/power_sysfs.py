"""A board's power files under a sysfs root: where each knob lives, read and written as root may (no links)."""
from __future__ import annotations

import errno
import glob
import os
import re
import stat
from typing import Dict, List, Optional

from mtbench.device.env import GPU_DEVFREQ, jetson
from mtbench.regular_files import RefusedFile, read_head

CPU_DIR = "sys/devices/system/cpu"
NVPMODEL_CONF = "etc/nvpmodel.conf"
NVPMODEL_STATUS = "var/lib/nvpmodel/status"
EMC_CAP = "sys/kernel/nvpmodel_emc_cap/emc_iso_cap"  # Orin (L4T 35/36): nvpmodel's EMC cap, Hz
MAX_BYTES = 1 << 16


def _inside(root: str, rel: str) -> str:
    """The path of `rel` under `root`, refused where a link in a folder above leads outside the root."""
    path = os.path.join(root, rel)
    real_root = os.path.realpath(root)
    folder = os.path.realpath(os.path.dirname(path))
    if folder != real_root and not folder.startswith(real_root.rstrip(os.sep) + os.sep):
        raise RefusedFile(f"{path} leads outside the sysfs root {root} (to {folder}), refused")
    return path


def read_attr(root: str, rel: str) -> Optional[str]:
    """A sysfs attribute's text, stripped; None where it is missing, unreadable or not a regular file."""
    try:
        return read_head(_inside(root, rel), MAX_BYTES).decode("utf-8", "replace").replace("\x00", "").strip()
    except OSError:
        return None


def write_attr(root: str, rel: str, text: str) -> None:
    """Write `text` to the regular file `rel` under `root`: never a link (O_NOFOLLOW), a FIFO or a device, never a
    file that does not exist (no O_CREAT), never outside the root. OSError (the kernel's EINVAL, EACCES) as raised."""
    path = _inside(root, rel)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RefusedFile(f"{path} is a symbolic link, refused") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RefusedFile(f"{path} is not a regular file, refused")
        os.ftruncate(fd, 0)  # sysfs ignores it; a fake tree's file then holds just the new value
        os.write(fd, (text + "\n").encode())
    finally:
        os.close(fd)


def writable(root: str, rel: str) -> bool:
    return os.access(os.path.join(root, rel), os.W_OK)


def is_jetson(root: str) -> bool:
    return jetson(root) is not None


def cpus(root: str) -> List[int]:
    """The CPU cores the kernel knows (online or not)."""
    found = [os.path.basename(p)[3:] for p in glob.glob(os.path.join(root, CPU_DIR, "cpu[0-9]*"))]
    return sorted(int(n) for n in found if n.isdigit())


def online_file(n: int) -> str:
    return f"{CPU_DIR}/cpu{n}/online"


def cpufreq(n: int, name: str) -> str:
    return f"{CPU_DIR}/cpu{n}/cpufreq/{name}"


def online_cpus(root: str) -> List[int]:
    """Cores online now (cpu0 usually has no online file: it is always online)."""
    return [n for n in cpus(root) if read_attr(root, online_file(n)) in (None, "1")]


def devfreq_node(root: str, keys: tuple) -> Optional[str]:
    """The devfreq node (relative to root) whose name has one of `keys`: the GPU (GPU_DEVFREQ) or the EMC."""
    for dev in sorted(glob.glob(os.path.join(root, "sys/class/devfreq/*"))):
        if any(key in os.path.basename(dev) for key in keys):
            return os.path.relpath(dev, root)
    return None


def gpu_devfreq(root: str) -> Optional[str]:
    return devfreq_node(root, GPU_DEVFREQ)


def emc_max_file(root: str) -> Optional[str]:
    """The EMC's upper clock file: an emc devfreq node's max_freq, else Orin's nvpmodel EMC cap."""
    node = devfreq_node(root, ("emc",))
    if node is not None:
        return f"{node}/max_freq"
    return EMC_CAP if os.path.exists(os.path.join(root, EMC_CAP)) else None


def nvpmodel_modes(root: str) -> Dict[int, str]:
    """{mode id: name} from the board's /etc/nvpmodel.conf ({} where there is none)."""
    text = read_attr(root, NVPMODEL_CONF) or ""
    return dict((int(i), n) for i, n in re.findall(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=(\S+?)\s*>", text))


def nvpmodel_mode(root: str) -> Optional[int]:
    """The board's current nvpmodel mode (/var/lib/nvpmodel/status: "pmode:0002"), None where unknown."""
    match = re.search(r"pmode:(\d+)", read_attr(root, NVPMODEL_STATUS) or "")
    return int(match.group(1)) if match else None


def nvpmodel_not_applied(root: str, mode: int, said: str) -> Optional[str]:
    """Why `nvpmodel -m mode`, which exited 0 saying `said`, did not apply the mode; None where it did. A mode that
    changes what cannot change while the GPU is up (an Orin's power gating) takes effect only after a reboot:
    nvpmodel asks for one (its standard input is empty: no) and the board stays as it was."""
    reboot = [line.strip() for line in said.splitlines() if "reboot required" in line.lower()]
    now = nvpmodel_mode(root)
    if not reboot and now == mode:
        return None
    why = reboot[0] if reboot else f"the board reports mode {now} after it"
    return (f"mode {mode} was not applied ({why}); the board stays in mode {now}: set it and reboot before the "
            f"run (sudo nvpmodel -m {mode}), or choose a mode that applies without a reboot")


def available(root: str, rel: str) -> List[int]:
    """The whole numbers in a space-separated sysfs list (available_frequencies), [] where absent."""
    return [int(v) for v in (read_attr(root, rel) or "").split() if v.isdigit()]


def as_int(text: Optional[str]) -> Optional[int]:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def mode_list(*roots: Optional[str]) -> str:
    """The board's nvpmodel mode ids as a sweep list ("0,1,2"), from the first root given (else /); "none" where
    the board has none (the sweep's check then names the file and what is allowed)."""
    root = next((str(r) for r in roots if r), "/")
    return ",".join(str(i) for i in sorted(nvpmodel_modes(root))) or "none"


def core_counts(*roots: Optional[str]) -> str:
    """power.cpu_cores values for a sweep ("1,2,4,6"): powers of two up to the cores a job may get, and that
    number (a Jetson's cores, else those this process may use)."""
    root = next((str(r) for r in roots if r), "/")
    total = len(cpus(root)) if is_jetson(root) else len(os.sched_getaffinity(0))
    counts = sorted({2 ** k for k in range(total.bit_length()) if 2 ** k <= total} | {total})
    return ",".join(map(str, counts))
