"""jetson-stats' and Zeus's own Jetson readers read our fake trees: same rails, same watts as mtbench
(issue 27 item 13). A fake tree that they cannot read is not a real tree. Both come with the `test` extra;
without them the test skips and says so."""
from __future__ import annotations

import pathlib

import pytest

from mtbench.sampling.jetson import JetsonSensor
from tests.fake_sysfs import make_orin, make_tx2

TX2_POWER = {"VDD_IN": 9000, "VDD_SYS_GPU": 3500, "VDD_SYS_CPU": 1500, "VDD_SYS_SOC": 900, "VDD_SYS_DDR": 700,
             "VDD_4V0_WIFI": 100}
ORIN = {"VDD_IN": (5000, 1400), "VDD_CPU_GPU_CV": (5000, 600)}  # in3 is left unconnected: "NC"


def _trees(tmp_path):
    make_tx2(tmp_path / "tx2", TX2_POWER)
    make_orin(tmp_path / "orin", ORIN)
    return {"tx2": (tmp_path / "tx2", {k: v / 1000 for k, v in TX2_POWER.items()}),
            "orin": (tmp_path / "orin", {k: mv * ma / 1e6 for k, (mv, ma) in ORIN.items()})}


def _mtbench_watts(root):
    sensor = JetsonSensor(str(root))
    try:
        values = sensor.read()
        return {f.key: v * f.scale for f, v in zip(sensor.fields(), values) if f.group == "power"}
    finally:
        sensor.close()


@pytest.mark.parametrize("board", ["tx2", "orin"])
def test_mtbench_reads_the_real_layout(tmp_path, board):
    root, watts = _trees(tmp_path)[board]
    assert _mtbench_watts(root) == pytest.approx(watts)


@pytest.mark.parametrize("board", ["tx2", "orin"])
def test_jetson_stats_reads_the_same_rails_and_watts(tmp_path, board):
    power = pytest.importorskip("jtop.core.power", reason="jetson-stats is not installed (the `test` extra)")
    root, watts = _trees(tmp_path)[board]
    sensors = power.find_all_i2c_power_monitor(str(root / "sys/bus/i2c/devices"))
    theirs = {}
    for name, files in sensors.items():
        values = power.read_power_status(files)
        mw = values["power"] if "power" in values else values["volt"] * values["curr"] / 1000
        theirs[name] = mw / 1000
    assert theirs == pytest.approx(_mtbench_watts(root)) and set(theirs) == set(watts)


@pytest.mark.parametrize("board", ["tx2", "orin"])
def test_zeus_reads_the_same_watts(tmp_path, board, monkeypatch):
    zeus_jetson = pytest.importorskip("zeus.device.soc.jetson", reason="zeus is not installed (the `test` extra)")
    root, watts = _trees(tmp_path)[board]

    def rooted(p, *rest):  # Zeus hard-codes /sys: the same files under the fake root
        text = str(p)
        return pathlib.Path(str(root) + text if text.startswith("/sys/") else text, *rest)

    monkeypatch.setattr(zeus_jetson, "Path", rooted)
    found = zeus_jetson.Jetson._discover_available_metrics(None)
    theirs = {key: strategy.measure_power() / 1000 for key, strategy in found.items()}
    ours = _mtbench_watts(root)
    # Zeus keeps one rail per kind: the input rail as the total, a CPU rail and a GPU rail where named so
    assert theirs["total_power_mw"] == pytest.approx(ours["VDD_IN"])
    for key, word in (("cpu_power_mw", "CPU"), ("gpu_power_mw", "GPU")):
        if key in theirs:
            assert theirs[key] in [pytest.approx(w) for label, w in ours.items() if word in label]
    assert set(theirs) >= {"total_power_mw", "cpu_power_mw"}
