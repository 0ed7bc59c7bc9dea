"""Fake sysfs trees laid out as the kernel drivers lay out real boards: a Jetson TX2 on L4T 32 (iio driver
ina3221x), a Jetson Orin on L4T 35/36 (hwmon driver ina3221), and an Intel RAPL host.

As on a real board: values are unpadded ("9000\\n"); each monitor's device directory lives under
sys/devices/... and is reached through the links sys/bus/i2c/devices/<bus>-<addr> (whose `name` file names
the driver: discovery as jetson-stats does it) and sys/bus/i2c/drivers/<driver>/<bus>-<addr>; the hwmon
driver labels in1..in3 only (an unconnected channel "NC"), in1..in3_input are bus voltages (mV),
curr1..curr3_input currents (mA), in4..in6_input the unlabelled shunt voltages (uV), curr4_input the summed
current, in7 "sum of shunt voltages" with no curr7_input; the Orin GPU's devfreq node is 17000000.gpu whose
device/of_node/name is "gpu".
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

TX2_RAILS = {  # device, channel, label: the TX2's two INA3221 monitors
    ("0-0040", "iio:device0"): ["VDD_SYS_GPU", "VDD_SYS_SOC", "VDD_4V0_WIFI"],
    ("0-0041", "iio:device1"): ["VDD_IN", "VDD_SYS_CPU", "VDD_SYS_DDR"],
}
SHUNT_MOHM = 5  # the shunt resistors' value: shunt voltage (uV) = current (mA) x 5


def write_value(path: Path, value: float) -> None:
    """Overwrite in place, unpadded as the kernel writes; the new digits first, then the file cut to them, so a
    concurrent reader sees the new number followed at most by stale bytes after its newline."""
    with open(path, "r+" if path.exists() else "w") as f:
        f.write(f"{int(round(value))}\n")
        f.truncate()


def _i2c_device(root: Path, bus: int, addr: str, driver: str, controller: str) -> Path:
    """The monitor's device directory and the two links to it that a real sysfs has."""
    dev = root / f"sys/devices/{controller}/i2c-{bus}/{addr}"
    dev.mkdir(parents=True, exist_ok=True)
    (dev / "name").write_text(driver + "\n")
    for link_dir in (root / "sys/bus/i2c/devices", root / f"sys/bus/i2c/drivers/{driver}"):
        link_dir.mkdir(parents=True, exist_ok=True)
        link = link_dir / addr
        if not link.exists():
            link.symlink_to(os.path.relpath(dev, link_dir))
    drv = root / f"sys/bus/i2c/drivers/{driver}"
    for name in ("bind", "unbind", "uevent"):  # write-only files beside the links
        (drv / name).touch()
    return dev


def _device_tree_node(root: Path, i2c_dev: Path, node: str, props: Dict[str, int]) -> None:
    """The device's `of_node` link to its node under sys/firmware/devicetree/base, each u32 property stored as
    the kernel exports it: 4 bytes, big-endian."""
    dt = root / "sys/firmware/devicetree/base" / node
    dt.mkdir(parents=True, exist_ok=True)
    (dt / "name").write_bytes(node.rsplit("/", 1)[-1].split("@")[0].encode() + b"\x00")
    for prop, value in props.items():
        (dt / prop).write_bytes(value.to_bytes(4, "big"))
    link = i2c_dev / "of_node"
    if not link.exists():
        link.symlink_to(os.path.relpath(dt, i2c_dev))


def make_tx2(root: Path, power_mw: Dict[str, float], gpu_load_permille: int = 500, running_mode: int = 0,
             continuous_config: Optional[int] = None, trigger_config: Optional[int] = None) -> Dict[str, Path]:
    """L4T 32 iio layout; returns {rail label: its in_powerN_input file}. Each rail at 5000 mV. `running_mode` is
    the driver's: 0 triggered (every read is that moment's value: what a test that writes the files as it goes
    stands for; the read's blocking is TriggeredChip's), 1 continuous (a new average once per cycle); the configs
    are the device tree's ti,continuous-config and ti,trigger-config (None: not set, the driver's defaults)."""
    files = {}
    props = {k: v for k, v in (("ti,continuous-config", continuous_config), ("ti,trigger-config", trigger_config))
             if v is not None}
    for (addr, dev_name), labels in TX2_RAILS.items():
        i2c_dev = _i2c_device(root, 0, addr, "ina3221x", "3160000.i2c")
        _device_tree_node(root, i2c_dev, f"i2c@3160000/ina3221x@{addr[-2:]}", props)
        d = i2c_dev / dev_name
        d.mkdir(parents=True, exist_ok=True)
        (d / "name").write_text("ina3221x\n")
        write_value(d / "running_mode", running_mode)
        for k, label in enumerate(labels):
            mw = power_mw.get(label, 0)
            (d / f"rail_name_{k}").write_text(label + "\n")
            write_value(d / f"in_voltage{k}_input", 5000)
            write_value(d / f"in_current{k}_input", mw / 5)
            write_value(d / f"in_power{k}_input", mw)
            write_value(d / f"crit_current_limit_{k}", 4000)
            write_value(d / f"warn_current_limit_{k}", 3000)
            files[label] = d / f"in_power{k}_input"
    gpu = root / "sys/devices/17000000.gp10b"
    gpu.mkdir(parents=True, exist_ok=True)
    write_value(gpu / "load", gpu_load_permille)
    legacy = root / "sys/devices/gpu.0"
    if not legacy.exists():
        legacy.symlink_to("17000000.gp10b")
    return files


def make_orin(root: Path, rails: Dict[str, Tuple[float, float]], gpu_load_permille: int = 250) -> Dict[str, Path]:
    """L4T 35/36 hwmon layout of one INA3221 at 1-0040 (Orin Nano / NX); rails = {label: (mV, mA)}, at most
    three, the channels left over labelled "NC"; returns {label: its currN_input file}."""
    assert len(rails) <= 3, "an INA3221 has three channels"
    dev = _i2c_device(root, 1, "1-0040", "ina3221", "platform/c240000.i2c")
    d = dev / "hwmon/hwmon3"
    d.mkdir(parents=True, exist_ok=True)
    (d / "name").write_text("ina3221\n")
    channels = list(rails.items()) + [("NC", (0.0, 0.0))] * (3 - len(rails))
    files = {}
    for k, (label, (mv, ma)) in enumerate(channels, start=1):
        (d / f"in{k}_label").write_text(label + "\n")
        write_value(d / f"in{k}_input", mv)  # bus voltage, mV
        write_value(d / f"curr{k}_input", ma)  # mA
        write_value(d / f"in{k + 3}_input", ma * SHUNT_MOHM)  # shunt voltage, uV, unlabelled
        write_value(d / f"curr{k}_max", 4000)
        write_value(d / f"curr{k}_crit", 5000)
        write_value(d / f"curr{k}_crit_alarm", 0)
        write_value(d / f"curr{k}_max_alarm", 0)
        write_value(d / f"shunt{k}_resistor", SHUNT_MOHM * 1000)  # uOhm
        if label != "NC":
            files[label] = d / f"curr{k}_input"
    total_ma = sum(ma for _, (_, ma) in channels)
    write_value(d / "curr4_input", total_ma)  # the summed current
    (d / "in7_label").write_text("sum of shunt voltages\n")
    write_value(d / "in7_input", total_ma * SHUNT_MOHM)
    gpu = root / "sys/devices/platform/17000000.gpu"
    (gpu / "of_node").mkdir(parents=True, exist_ok=True)
    (gpu / "of_node/name").write_bytes(b"gpu\x00")
    write_value(gpu / "load", gpu_load_permille)
    devfreq = root / "sys/class/devfreq"
    devfreq.mkdir(parents=True, exist_ok=True)
    for node, target in (("17000000.gpu", gpu), ("3d00000.pcie", None)):  # a devfreq node that is not the GPU
        d_node = devfreq / node
        d_node.mkdir(exist_ok=True)
        if target is not None and not (d_node / "device").exists():
            (d_node / "device").symlink_to(os.path.relpath(target, d_node))
    return files


def make_rapl(root: Path, zones: Dict[str, Tuple[str, int, int]]) -> Dict[str, Path]:
    """zones = {"intel-rapl:0": (name, energy_uj, max_energy_range_uj)}; returns {zone: energy_uj file}."""
    files = {}
    for zone, (name, energy, max_range) in zones.items():
        d = root / "sys/class/powercap" / zone
        d.mkdir(parents=True, exist_ok=True)
        (d / "name").write_text(name + "\n")
        (d / "max_energy_range_uj").write_text(f"{max_range}\n")
        write_value(d / "energy_uj", energy)
        files[zone] = d / "energy_uj"
    return files


# ---------------------------------------------------------------------------------------------------------------
# Power-mode trees (issue 22): a board's cpu online files, cpufreq (cpuN/cpufreq a link to its cluster's policy, as
# on L4T), the GPU's devfreq (sys/class/devfreq/<node> a link into sys/devices), Orin's EMC cap, nvpmodel.conf in
# nvpmodel's own format (PARAM blocks name the files, POWER_MODEL blocks the values: -1 the highest clock) and
# /var/lib/nvpmodel/status. `kernel_write` wraps a writer with the kernel's rules; `install_fake_nvpmodel` puts
# an `nvpmodel` program on a PATH folder that changes such a tree as the real one changes /sys.

POWER_BOARDS = {
    # name: (model, cpu clusters [(policy, cores)], cpu kHz table, gpu node, gpu Hz table, modes, emc cap file)
    "orin": ("NVIDIA Jetson AGX Orin Developer Kit", [(0, [0, 1, 2, 3]), (4, [4, 5, 6, 7])],
             [115200, 729600, 1497600, 2201600], "17000000.ga10b",
             [306000000, 612000000, 918000000, 1300500000],
             [(0, "MAXN", 8, -1, -1), (1, "MODE_15W", 4, 1497600, 612000000), (2, "MODE_30W", 8, 1728000, 918000000)],
             True),
    "tx2": ("quill", [(0, [0, 3, 4, 5]), (1, [1, 2])], [345600, 1113600, 2035200], "17000000.gp10b",
            [114750000, 624750000, 1300500000],
            [(0, "MAXN", 6, -1, -1), (1, "MAXQ", 4, 1113600, 624750000), (3, "MAXP_CORE_ARM", 4, -1, 624750000)],
            False),
}


def _nvpmodel_conf(board: str) -> str:
    _, clusters, _, gpu, _, modes, emc = POWER_BOARDS[board]
    cores = sorted(c for _, cs in clusters for c in cs)
    lines = ["< PARAM TYPE=FILE NAME=CPU_ONLINE >"] + [f"CORE_{c} /sys/devices/system/cpu/cpu{c}/online" for c in cores]
    lines += ["", "< PARAM TYPE=CLOCK NAME=CPU >",
              "MAX_FREQ " + " ".join(f"/sys/devices/system/cpu/cpu{c}/cpufreq/scaling_max_freq" for c in cores),
              "", "< PARAM TYPE=CLOCK NAME=GPU >", f"MAX_FREQ /sys/class/devfreq/{gpu}/max_freq"]
    if emc:
        lines += ["", "< PARAM TYPE=FILE NAME=EMC >", "MAX_FREQ /sys/kernel/nvpmodel_emc_cap/emc_iso_cap"]
    for mode_id, name, online, cpu_khz, gpu_hz in modes:
        lines += ["", f"< POWER_MODEL ID={mode_id} NAME={name} >"]
        lines += [f"CPU_ONLINE CORE_{c} {1 if i < online else 0}" for i, c in enumerate(cores) if c != 0]
        lines += [f"CPU MAX_FREQ {cpu_khz}", f"GPU MAX_FREQ {gpu_hz}"] + (["EMC MAX_FREQ 0"] if emc else [])
    return "\n".join(lines) + "\n"


def make_power_board(root: Path, board: str = "orin", mode: int = 0) -> Dict[str, Path]:
    """A writable power-mode tree of `board` ("orin" or "tx2") in nvpmodel mode `mode` (as nvpmodel left it);
    returns {"gpu": its devfreq folder, "cpufreq": cpu0's policy folder}."""
    model, clusters, khz, gpu_node, gpu_hz, modes, emc = POWER_BOARDS[board]
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc/nv_tegra_release").write_text("# R35 (release), REVISION: 4.1, GCID: 1, BOARD: t186ref, EABI: aarch64\n")
    (root / "proc/device-tree").mkdir(parents=True, exist_ok=True)
    (root / "proc/device-tree/model").write_bytes(model.encode() + b"\x00")
    (root / "proc/device-tree/compatible").write_bytes(b"nvidia,tegra\x00")
    (root / "etc/nvpmodel.conf").write_text(_nvpmodel_conf(board))
    cpu = root / "sys/devices/system/cpu"
    for policy, cores in clusters:
        pol = cpu / f"cpufreq/policy{policy}"
        pol.mkdir(parents=True, exist_ok=True)
        (pol / "scaling_available_frequencies").write_text(" ".join(map(str, khz)) + " \n")
        (pol / "scaling_available_governors").write_text("interactive conservative ondemand userspace powersave "
                                                          "performance schedutil \n")
        (pol / "scaling_governor").write_text("schedutil\n")
        for name, value in (("cpuinfo_min_freq", khz[0]), ("cpuinfo_max_freq", khz[-1]), ("scaling_min_freq", khz[0]),
                            ("scaling_max_freq", khz[-1]), ("scaling_cur_freq", khz[-1])):
            write_value(pol / name, value)
        for c in cores:
            d = cpu / f"cpu{c}"
            d.mkdir(parents=True, exist_ok=True)
            if c != 0:  # cpu0 cannot go offline: no online file
                write_value(d / "online", 1)
            if not (d / "cpufreq").exists():
                (d / "cpufreq").symlink_to(f"../cpufreq/policy{policy}")
    dev = root / f"sys/devices/platform/{gpu_node}/devfreq/{gpu_node}"
    dev.mkdir(parents=True, exist_ok=True)
    (dev / "available_frequencies").write_text(" ".join(map(str, gpu_hz)) + "\n")
    (dev / "governor").write_text("nvhost_podgov\n")
    for name, value in (("min_freq", gpu_hz[0]), ("max_freq", gpu_hz[-1]), ("cur_freq", gpu_hz[-1])):
        write_value(dev / name, value)
    (root / "sys/class/devfreq").mkdir(parents=True, exist_ok=True)
    link = root / f"sys/class/devfreq/{gpu_node}"
    if not link.exists():
        link.symlink_to(os.path.relpath(dev, link.parent))
    if emc:
        (root / "sys/kernel/nvpmodel_emc_cap").mkdir(parents=True, exist_ok=True)
        write_value(root / "sys/kernel/nvpmodel_emc_cap/emc_iso_cap", 0)
    (root / "var/lib/nvpmodel").mkdir(parents=True, exist_ok=True)
    (root / "var/lib/nvpmodel/status").write_text(f"pmode:{mode:04d}\n")
    return {"gpu": dev, "cpufreq": cpu / "cpufreq/policy0"}


def _settle(path: str) -> None:
    """The value a kernel shows after a write: cpufreq clamps to cpuinfo_min/max_freq; devfreq's max_freq is the
    highest available frequency at or below the value (min_freq the lowest at or above)."""
    p = Path(path)
    value = int(p.read_text().split()[0]) if p.read_text().split() and p.read_text().split()[0].isdigit() else None
    if value is None:
        return
    if p.name in ("scaling_max_freq", "scaling_min_freq"):
        low, high = (int((p.parent / n).read_text()) for n in ("cpuinfo_min_freq", "cpuinfo_max_freq"))
        write_value(p, min(max(value, low), high))
    elif p.name in ("max_freq", "min_freq") and (p.parent / "available_frequencies").exists():
        table = sorted(int(v) for v in (p.parent / "available_frequencies").read_text().split())
        below, above = [f for f in table if f <= value], [f for f in table if f >= value]
        write_value(p, (below[-1] if below else table[0]) if p.name == "max_freq" else (above[0] if above else table[-1]))


def kernel_write(write):
    """`write(root, rel, text)` followed by the kernel's rules (`_settle`): wrap power_sysfs.write_attr with it."""
    def wrapped(root: str, rel: str, text: str) -> None:
        write(root, rel, text)
        _settle(os.path.join(root, rel))
    return wrapped


FAKE_NVPMODEL = '''#!{python}
"""A fake nvpmodel: `-m ID` applies the mode's lines of $MTBENCH_SYSFS_ROOT/etc/nvpmodel.conf to that tree (never /);
`-q` prints the mode. Exit 1 with nvpmodel's message where the tree's files are not writable."""
import os, re, sys
root = os.environ["MTBENCH_SYSFS_ROOT"]
assert os.path.realpath(root) != "/", "the fake nvpmodel never changes the real /sys"
conf = open(os.path.join(root, "etc/nvpmodel.conf")).read()
status = os.path.join(root, "var/lib/nvpmodel/status")
if sys.argv[1:] == ["-q"]:
    print("NV Power Mode: ?"); print(int(open(status).read().split(":")[1])); sys.exit(0)
if len(sys.argv) != 3 or sys.argv[1] != "-m":
    sys.exit("usage: nvpmodel -m ID | -q")
files, blocks, current = {{}}, {{}}, None
for line in conf.splitlines():
    head = re.match(r"<\\s*(PARAM|POWER_MODEL)\\s+(.*?)\\s*>", line)
    if head:
        fields = dict(f.split("=", 1) for f in head.group(2).split())
        current = (head.group(1), fields.get("NAME"), fields.get("ID"))
        blocks.setdefault(current, [])
    elif line.strip() and current:
        blocks[current].append(line.split())
for (kind, name, _), lines in blocks.items():
    if kind == "PARAM":
        for words in lines:
            files[(name, words[0])] = words[1:]
mode = [ls for (kind, _, i), ls in blocks.items() if kind == "POWER_MODEL" and i == sys.argv[2]]
if not mode:
    sys.exit("NVPM ERROR: Invalid mode id " + sys.argv[2])
# an Orin's GPU power gating cannot change once the GPU is up: nvpmodel asks for a reboot and, not told YES on its
# standard input, changes nothing
for param, arg, value in mode[0]:
    if param in ("TPC_POWER_GATING", "GPU_POWER_GATING"):
        for path in files[(param, arg)]:
            path = os.path.join(root, path.lstrip("/"))
            if open(path).read().strip() != value:
                print("NVPM WARN: Golden image context is already created")
                print("NVPM WARN: Reboot required for changing to this power mode: " + sys.argv[2])
                print("NVPM WARN: DO YOU WANT TO REBOOT NOW? enter YES/yes to confirm:", flush=True)
                if sys.stdin.readline().strip().lower() != "yes":
                    sys.exit(0)
for param, arg, value in mode[0]:
    for path in files[(param, arg)]:
        path = os.path.join(root, path.lstrip("/"))
        if not os.access(path, os.W_OK):
            sys.exit("NVPM ERROR: failed to write " + path + ": Permission denied")
        if value == "-1":  # the highest clock of the file's table
            table = [f for f in ("scaling_available_frequencies", "available_frequencies")
                     if os.path.exists(os.path.join(os.path.dirname(path), f))]
            value = open(os.path.join(os.path.dirname(path), table[0])).read().split()[-1] if table else "0"
        with open(path, "w") as f:
            f.write(value + "\\n")
with open(status, "w") as f:
    f.write("pmode:%04d\\n" % int(sys.argv[2]))
'''


def install_fake_nvpmodel(bin_dir: Path) -> Path:
    """An executable `nvpmodel` in `bin_dir` (put it first on PATH) that changes the tree in $MTBENCH_SYSFS_ROOT."""
    import sys

    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "nvpmodel"
    path.write_text(FAKE_NVPMODEL.format(python=sys.executable))
    path.chmod(0o755)
    return path


def mean_of(signal: Callable[[float], float], start: float, end: float, points: int = 200) -> float:
    """The mean of `signal` over [start, end] (midpoint rule): what a monitor that averages leaves in its register."""
    step = (end - start) / points
    return sum(signal(start + (k + 0.5) * step) for k in range(points)) / points


class Refresher:
    """A monitor's own refresh, on a virtual clock: at every multiple of `period_s` it writes, into each file, the
    mean of that file's signal over the period just ended (an INA3221 in continuous mode, its registers renewed
    once per averaging cycle). `advance(now)` writes the refreshes up to `now`; between them the files hold."""

    def __init__(self, signals: Dict[Path, Callable[[float], float]], period_s: float) -> None:
        self.signals, self.period_s = signals, period_s
        self.done = 0  # refreshes written

    def advance(self, now: float) -> None:
        while (self.done + 1) * self.period_s <= now:
            self.done += 1
            end = self.done * self.period_s
            for path, signal in self.signals.items():
                write_value(path, mean_of(signal, end - self.period_s, end))


class TriggeredChip:
    """An INA3221 under the L4T 32 driver's triggered mode: reading a rail's file powers the chip up for one
    conversion and waits for it, so the read blocks for the conversion time (`convert_s`, read on `clock`, which
    the read moves on) and returns that moment's value. `read(path)` is what happens before the file's bytes are
    read; `reads` counts them."""

    def __init__(self, signals: Dict[Path, Callable[[float], float]], clock, convert_s: float) -> None:
        self.signals, self.clock, self.convert_s = {str(p): f for p, f in signals.items()}, clock, convert_s
        self.reads: List[float] = []

    def read(self, path: str) -> None:
        signal = self.signals.get(path)
        if signal is None:
            return
        self.clock.now += self.convert_s
        self.reads.append(self.clock.now)
        write_value(Path(path), signal(self.clock.now))

