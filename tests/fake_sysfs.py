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
from typing import Dict, Tuple

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


def make_tx2(root: Path, power_mw: Dict[str, float], gpu_load_permille: int = 500) -> Dict[str, Path]:
    """L4T 32 iio layout; returns {rail label: its in_powerN_input file}. Each rail at 5000 mV."""
    files = {}
    for (addr, dev_name), labels in TX2_RAILS.items():
        d = _i2c_device(root, 0, addr, "ina3221x", "3160000.i2c") / dev_name
        d.mkdir(parents=True, exist_ok=True)
        (d / "name").write_text("ina3221x\n")
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
