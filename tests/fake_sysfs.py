"""Fake sysfs trees laid out like a real Jetson TX2 (iio), a Jetson Orin (hwmon) and an Intel RAPL host."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Tuple

TX2_RAILS = {  # device, channel, label: the TX2's two INA3221 monitors
    ("0-0040", "iio:device0"): ["VDD_SYS_GPU", "VDD_SYS_SOC", "VDD_4V0_WIFI"],
    ("0-0041", "iio:device1"): ["VDD_IN", "VDD_SYS_CPU", "VDD_SYS_DDR"],
}


def write_value(path: Path, value: float) -> None:
    """Overwrite in place with a fixed width, so that a concurrent reader never sees a half-written number."""
    with open(path, "r+" if path.exists() else "w") as f:
        f.write(f"{int(round(value)):>12d}\n")


def make_tx2(root: Path, power_mw: Dict[str, float], gpu_load_permille: int = 500) -> Dict[str, Path]:
    """JetPack 4 iio layout; returns {rail label: its in_powerN_input file}."""
    files = {}
    for (addr, dev), labels in TX2_RAILS.items():
        d = root / "sys/bus/i2c/drivers/ina3221x" / addr / dev
        d.mkdir(parents=True, exist_ok=True)
        for k, label in enumerate(labels):
            (d / f"rail_name_{k}").write_text(label + "\n")
            write_value(d / f"in_voltage{k}_input", 5000)
            write_value(d / f"in_current{k}_input", power_mw.get(label, 0) / 5)
            write_value(d / f"in_power{k}_input", power_mw.get(label, 0))
            files[label] = d / f"in_power{k}_input"
    gpu = root / "sys/devices/gpu.0"
    gpu.mkdir(parents=True, exist_ok=True)
    write_value(gpu / "load", gpu_load_permille)
    return files


def make_orin(root: Path, rails: Dict[str, Tuple[float, float]], gpu_load_permille: int = 250) -> Dict[str, Path]:
    """JetPack 5+ hwmon layout (Orin Nano rails on 1-0040, an unconnected channel and the shunt-sum channel);
    rails = {label: (mV, mA)}; returns {label: its currN_input file}."""
    d = root / "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon3"
    d.mkdir(parents=True, exist_ok=True)
    files = {}
    for k, (label, (mv, ma)) in enumerate(rails.items(), start=1):
        (d / f"in{k}_label").write_text(label + "\n")
        write_value(d / f"in{k}_input", mv)
        write_value(d / f"curr{k}_input", ma)
        files[label] = d / f"curr{k}_input"
    n = len(rails) + 1
    (d / f"in{n}_label").write_text("NC\n")  # an unconnected channel
    write_value(d / f"in{n}_input", 0)
    write_value(d / f"curr{n}_input", 0)
    (d / "in7_label").write_text("sum of shunt voltages\n")
    write_value(d / "in7_input", 999)
    write_value(d / "curr7_input", 999)
    gpu = root / "sys/class/devfreq/17000000.ga10b/device"
    gpu.mkdir(parents=True, exist_ok=True)
    write_value(gpu / "load", gpu_load_permille)
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
