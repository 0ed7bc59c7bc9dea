"""NVIDIA Jetson power rails (INA3221 monitors) and GPU load, straight from sysfs.

Two layouts, both under a configurable root (`sysfs_root`: tests use a fake tree; a container may mount
the host's sysfs elsewhere):
- JetPack 4 (TX2, Xavier), iio driver: `sys/bus/i2c/drivers/ina3221x/<bus>-<addr>/iio:deviceN/`
  `rail_name_K` (the rail's label) and `in_powerK_input` (mW).
- JetPack 5+ (Orin), hwmon driver: `sys/bus/i2c/drivers/ina3221/<bus>-<addr>/hwmon/hwmonN/`
  `inK_label`, `inK_input` (bus voltage, mV) and `currK_input` (mA); power = V x I. The channel labelled
  as the sum of shunt voltages (in7 on Orin) and channels labelled "NC" (not connected) are skipped.
GPU load: `sys/devices/gpu.0/load` (per mille, older L4T) or the `load` file of the GPU's devfreq device
(`sys/class/devfreq/<node>/device/load`, Orin: the node whose `device/of_node/name` is "gpu").
Only regular files are opened (sysfs.open_regular): a FIFO planted at a rail file makes the sensor
unavailable with that reason instead of blocking the job.
"""
from __future__ import annotations

import glob
import os
import re
from typing import Any, List, Optional, Sequence, Tuple

from mtbench.sampling.sensor import GAUGE, GPU_UTIL, POWER, Field, Sensor, SensorUnavailable
from mtbench.sampling.sysfs import AttrFile, parse_int, read_small, read_text

IIO_GLOB = "sys/bus/i2c/drivers/ina3221x/*/iio:device*"
HWMON_GLOB = "sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*"
# rails that carry the whole module's input: the total energy is theirs alone (the others lie inside them)
INPUT_RAILS = ("VDD_IN", "POM_5V_IN")
GPU_DEVFREQ_NAMES = ("gpu", "gp10b", "gv11b", "ga10b", "gb10b")


def _rail_key(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", label).strip("_") or "rail"


def find_iio_rails(root: str) -> List[Tuple[str, str]]:
    """[(label, power file in mW)] for every iio INA3221 channel with a rail name."""
    rails = []
    for dev in sorted(glob.glob(os.path.join(root, IIO_GLOB))):
        for name_file in sorted(glob.glob(os.path.join(dev, "rail_name_*"))):
            k = name_file.rsplit("_", 1)[1]
            label = read_text(name_file)
            power = os.path.join(dev, f"in_power{k}_input")
            if label and os.path.exists(power):
                rails.append((label, power))
    return rails


def find_hwmon_rails(root: str) -> List[Tuple[str, str, str]]:
    """[(label, voltage file in mV, current file in mA)] for every connected hwmon INA3221 channel."""
    rails = []
    for dev in sorted(glob.glob(os.path.join(root, HWMON_GLOB))):
        for label_file in sorted(glob.glob(os.path.join(dev, "in*_label"))):
            k = re.match(r"in(\d+)_label", os.path.basename(label_file)).group(1)
            label = read_text(label_file) or ""
            volt, curr = os.path.join(dev, f"in{k}_input"), os.path.join(dev, f"curr{k}_input")
            if not label or label.upper() == "NC" or "sum" in label.lower() or not os.path.exists(curr):
                continue
            rails.append((label, volt, curr))
    return rails


def find_gpu_load(root: str) -> Optional[str]:
    legacy = os.path.join(root, "sys/devices/gpu.0/load")
    if os.path.exists(legacy):
        return legacy
    nodes = sorted(glob.glob(os.path.join(root, "sys/class/devfreq/*")))
    # the GPU's node says so in its device-tree node's name (as jetson-stats finds it); older trees only in
    # the node's own name
    by_of_node = [d for d in nodes if read_text(os.path.join(d, "device/of_node/name")) == "gpu"]
    by_name = [d for d in nodes if any(n in os.path.basename(d).lower() for n in GPU_DEVFREQ_NAMES)]
    for dev in by_of_node + by_name:
        load = os.path.join(dev, "device/load")
        if os.path.exists(load):
            return load
    return None


def update_interval(rail_file: str) -> dict:
    """The hwmon ina3221 driver's `update_interval` (ms; L4T 35+) beside a rail's files, as Field's resolution
    keywords: the period its readings change at, as the driver says it, each reading the chip's average since
    its previous one (window_mean). {} where the file is absent."""
    text = read_text(os.path.join(os.path.dirname(rail_file), "update_interval"))
    try:
        ms = int(text) if text is not None else 0
    except ValueError:
        ms = 0
    if ms <= 0:
        return {}
    return {"resolution_s": ms / 1000.0, "resolution_how": "device", "window_mean": True,
            "resolution_note": f"the INA3221's hwmon update_interval, {ms} ms"}


# the INA3221's configuration register (TI datasheet; the L4T 32 ina3221x driver's defaults where the device
# tree sets none): bits 14-12 the enabled channels, 11-9 the averaged samples, 8-6 and 5-3 the bus and shunt
# conversion times
CONVERSION_US = (140, 204, 332, 588, 1100, 2116, 4156, 8244)
AVERAGED_SAMPLES = (1, 4, 16, 64, 128, 256, 512, 1024)
IIO_CONTINUOUS_DEFAULT = 0x7727  # 3 channels, 64 samples, 1.1 ms + 1.1 ms
IIO_TRIGGERED_DEFAULT = 0x7003  # 3 channels, 1 sample, 0.14 ms + 0.14 ms (the macro; its comment says 0x7723)


def ina3221_cycle_us(config: int) -> int:
    """One complete update of every enabled channel's registers under `config`: channels x samples x (bus +
    shunt conversion time), the hwmon driver's update_interval formula."""
    channels = bin((config >> 12) & 0x7).count("1")
    samples = AVERAGED_SAMPLES[(config >> 9) & 0x7]
    return channels * samples * (CONVERSION_US[(config >> 6) & 0x7] + CONVERSION_US[(config >> 3) & 0x7])


def _device_tree_u32(i2c_dev: str, prop: str) -> Optional[int]:
    raw = read_small(os.path.join(i2c_dev, "of_node", prop), 8)
    return int.from_bytes(raw[:4], "big") if raw is not None and len(raw) >= 4 else None  # big-endian cells


def iio_mode(iio_dev: str) -> dict:
    """The L4T 32 ina3221x driver's running mode (`running_mode`: 0 triggered, 1 continuous) and averaging
    configuration (the device tree's ti,continuous-config / ti,trigger-config, else the driver's defaults) as
    Field's resolution keywords. Continuous: the registers hold the mean of the last averaging cycle and change
    once per cycle (window_mean). Triggered: every read powers the chip up for one conversion and waits for it,
    so each reading is that instant's (resolution 0: as fine as sampled) and each read blocks for the conversion.
    The driver may switch between the two with the CPUs' load (unless forced): the mode is the one read when the
    sensor opened."""
    mode = parse_int(read_small(os.path.join(iio_dev, "running_mode")))
    if mode is None:
        return {}
    i2c_dev = os.path.dirname(iio_dev)
    if mode == 0:
        config = _device_tree_u32(i2c_dev, "ti,trigger-config") or IIO_TRIGGERED_DEFAULT
        return {"resolution_s": 0.0, "resolution_how": "device",
                "resolution_note": f"the ina3221x driver's triggered mode (running_mode 0): every read converts anew "
                                   f"(config {config:#06x}, {ina3221_cycle_us(config) / 1000:g} ms per read)"}
    config = _device_tree_u32(i2c_dev, "ti,continuous-config") or IIO_CONTINUOUS_DEFAULT
    us = ina3221_cycle_us(config)
    return {"resolution_s": us / 1e6, "resolution_how": "device", "window_mean": True,
            "resolution_note": f"the ina3221x driver's continuous mode (running_mode 1), config {config:#06x}: "
                               f"a new average every {us / 1000:g} ms"}


class _Rail:
    """One rail: read() gives its power in mW (None when a file gave nothing)."""

    def __init__(self, label: str, files: Sequence[str]) -> None:
        self.label = label
        self.files = [AttrFile(f) for f in files]

    def read_raw(self) -> List[Optional[bytes]]:
        return [f.read_bytes() for f in self.files]

    @staticmethod
    def decode_mw(raw: Sequence[Optional[bytes]]) -> Optional[float]:
        values = [parse_int(b) for b in raw]
        if any(v is None for v in values):
            return None
        if len(values) == 1:
            return float(values[0])
        return values[0] * values[1] / 1000.0  # mV x mA / 1000 = mW

    def close(self) -> None:
        for f in self.files:
            f.close()


class JetsonSensor(Sensor):
    name = "jetson"

    def __init__(self, sysfs_root: str = "/") -> None:
        root = str(sysfs_root)
        if not os.path.isdir(root):
            raise SensorUnavailable(f"sysfs_root={root!r} is not a directory")
        found = [(label, [power]) for label, power in find_iio_rails(root)]
        modes = {os.path.dirname(power): iio_mode(os.path.dirname(power)) for _, [power] in found}
        self.layout = "iio (JetPack 4: TX2 / Xavier)" if found else None
        if not found:
            found = [(label, [volt, curr]) for label, volt, curr in find_hwmon_rails(root)]
            self.layout = "hwmon (JetPack 5+: Orin)" if found else None
        if not found:
            raise SensorUnavailable(
                f"no INA3221 rails under {os.path.join(root, IIO_GLOB)} (TX2/Xavier) "
                f"nor {os.path.join(root, HWMON_GLOB)} (Orin)")
        try:
            self.rails = [_Rail(label, files) for label, files in found]
        except OSError as exc:
            raise SensorUnavailable(f"cannot open {exc.filename}: {exc.strerror}") from None
        has_input = any(r.label in INPUT_RAILS for r in self.rails)
        self._fields = [
            Field(f"{_rail_key(r.label)}_power_mw", GAUGE, POWER, r.label, 1e-3,
                  total=(r.label in INPUT_RAILS) if has_input else True, **self._resolution(r.files[0].path, modes))
            for r in self.rails
        ]
        load_path = find_gpu_load(root)
        self.gpu_load = AttrFile(load_path) if load_path else None
        if self.gpu_load is not None:
            self._fields.append(Field("gpu_load_permille", GAUGE, GPU_UTIL, "0", 0.1))

    @staticmethod
    def _resolution(rail_file: str, iio_modes: dict) -> dict:
        folder = os.path.dirname(rail_file)
        return iio_modes[folder] if folder in iio_modes else update_interval(rail_file)

    def fields(self) -> List[Field]:
        return list(self._fields)

    def read_raw(self) -> List[Any]:
        # bytes only in the sampling loop; numbers are parsed after the run (decode)
        raw: List[Any] = [r.read_raw() for r in self.rails]
        if self.gpu_load is not None:
            raw.append(self.gpu_load.read_bytes())
        return raw

    def decode(self, raw: List[Any]) -> List[Optional[float]]:
        out: List[Optional[float]] = [_Rail.decode_mw(r) for r in raw[: len(self.rails)]]
        if self.gpu_load is not None:
            load = parse_int(raw[-1])
            out.append(None if load is None else float(load))
        return out


    def close(self) -> None:
        for r in self.rails:
            r.close()
        if self.gpu_load is not None:
            self.gpu_load.close()
