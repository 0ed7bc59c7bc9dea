"""The thermal sensor: each zone's temperature and each cooling device's state per sample and per step (issue 22)."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Dict, Tuple

import pytest

from mtbench.sampling import SensorUnavailable, open_sensors
from mtbench.sampling.sampler import Samples, StepMark
from mtbench.sampling.thermal import ThermalSensor, step_columns
from tests.fake_sysfs import write_value
from tests.helpers.compose import FAKE as FAKE_JOB

FAKE = [*FAKE_JOB, "batch=1"]


def make_thermal(root: Path, zones: Dict[str, int], cooling: Dict[str, Tuple[int, int]]) -> Path:
    """An Orin's /sys/class/thermal: thermal_zoneN/{type,temp} (millidegrees C, unpadded as the kernel writes them)
    and cooling_deviceN/{type,cur_state,max_state}."""
    base = root / "sys/class/thermal"
    for n, (name, temp_mc) in enumerate(zones.items()):
        zone = base / f"thermal_zone{n}"
        zone.mkdir(parents=True)
        (zone / "type").write_text(name + "\n")
        write_value(zone / "temp", temp_mc)
    for n, (name, (cur, top)) in enumerate(cooling.items()):
        dev = base / f"cooling_device{n}"
        dev.mkdir(parents=True)
        (dev / "type").write_text(name + "\n")
        write_value(dev / "cur_state", cur)
        write_value(dev / "max_state", top)
    return base


ORIN_ZONES = {"CPU-therm": 45500, "GPU-therm": 43000, "SOC0-therm": 44000, "tj-therm": 46000}
ORIN_COOLING = {"gpu-balanced": (0, 4), "pwm-fan": (1, 3)}


def test_each_zone_and_cooling_device_is_a_field_read_in_its_units(tmp_path):
    make_thermal(tmp_path, ORIN_ZONES, ORIN_COOLING)
    sensor = ThermalSensor(str(tmp_path), every_ms=0)
    names = [f.name for f in sensor.fields()]
    assert names == ["temp_cpu_therm_mc", "temp_gpu_therm_mc", "temp_soc0_therm_mc", "temp_tj_therm_mc",
                     "cooling_gpu_balanced_state", "cooling_pwm_fan_state"]
    assert sensor.read() == [45500.0, 43000.0, 44000.0, 46000.0, 0.0, 1.0]
    assert sensor.fields()[0].scale == 1e-3 and sensor.fields()[4].note == "0 = not acting; up to 4"
    write_value(tmp_path / "sys/class/thermal/thermal_zone1/temp", 71000)  # the GPU heats up: the next read sees it
    write_value(tmp_path / "sys/class/thermal/cooling_device0/cur_state", 2)  # and the firmware throttles it
    assert sensor.read()[1] == 71000.0 and sensor.read()[4] == 2.0
    sensor.close()


def test_zones_are_read_every_every_ms_and_none_in_between(tmp_path):
    make_thermal(tmp_path, {"CPU-therm": 40000}, {})
    now = [10.0]
    sensor = ThermalSensor(str(tmp_path), every_ms=100, clock=lambda: now[0])
    assert sensor.read() == [40000.0]
    now[0] += 0.05
    assert sensor.read() == [None]  # not read: never the last value repeated
    now[0] += 0.06
    assert sensor.read() == [40000.0]


def test_two_zones_of_one_type_are_told_apart_and_an_unreadable_zone_left_out(tmp_path):
    make_thermal(tmp_path, {"acpitz": 30000, "acpitz ": 31000, "x86_pkg_temp": 52000}, {})
    (tmp_path / "sys/class/thermal/thermal_zone2/temp").write_text("\n")  # a zone whose sensor gives no number
    sensor = ThermalSensor(str(tmp_path), every_ms=0)
    assert [f.name for f in sensor.fields()] == ["temp_acpitz_mc", "temp_acpitz_1_mc"]
    assert sensor.skipped == ["thermal_zone2 (x86_pkg_temp): temp gives no number"]


def test_no_thermal_zone_is_unavailable_with_the_reason_and_auto_lists_it(tmp_path):
    with pytest.raises(SensorUnavailable, match="no readable thermal zone under .*thermal_zone"):
        ThermalSensor(str(tmp_path))
    opened, status = open_sensors(["auto"], {"thermal": {"sysfs_root": str(tmp_path)},
                                             "jetson": {"sysfs_root": str(tmp_path)},
                                             "rapl": {"sysfs_root": str(tmp_path)}})
    entry = [s for s in status if s["name"] == "thermal"][0]
    assert entry["available"] is False and "no readable thermal zone" in entry["reason"]


def test_step_columns_mean_temperature_highest_throttle_and_the_last_reading_for_a_short_step(tmp_path):
    make_thermal(tmp_path, {"GPU-therm": 40000}, {"gpu-balanced": (0, 4)})
    fields = ThermalSensor(str(tmp_path), every_ms=0).fields()
    # readings at 0.0, 0.1, 0.2 s; None between (not read)
    samples = Samples(fields, [0.0, 0.05, 0.1, 0.15, 0.2],
                      [[40000, 0], [None, None], [50000, 2], [None, None], [60000, 1]])
    marks = [StepMark(0, 0.0, 0.1, True), StepMark(1, 0.12, 0.18, False), StepMark(2, 0.15, 0.25, False)]
    header, rows = step_columns(samples, marks)
    assert header == ["temp_c_gpu_therm", "throttle_gpu_balanced"]
    assert rows == [[45.0, 2.0], [50.0, 2.0], [60.0, 1.0]]  # step 1 holds no reading: the one at 0.1 s


def test_a_job_writes_each_zones_temperature_per_step(run, tmp_path):
    make_thermal(tmp_path / "root", ORIN_ZONES, ORIN_COOLING)
    summary = run(["model=squeezenet", "batch=1", "steps=2", "sampler.sensors=[procfs,thermal]",
                   f"sampler.sysfs_root={tmp_path / 'root'}", "sampler.options.thermal.every_ms=0"])
    assert summary["success"], summary["failure"]
    thermal = [s for s in summary["sampler"]["sensors"] if s["name"] == "thermal"][0]
    assert thermal["available"] and "temp_gpu_therm_mc" in thermal["fields"]
    with open(tmp_path / "job" / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and [r["temp_c_gpu_therm"] for r in rows] == ["43", "43"]
    assert [r["throttle_gpu_balanced"] for r in rows] == ["0", "0"]
    with open(tmp_path / "job" / "samples.csv") as f:
        assert "temp_cpu_therm_mc" in f.readline()
