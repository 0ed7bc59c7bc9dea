"""`mtbench power`: the board's nvpmodel modes, one line on a machine without them."""
from __future__ import annotations

from mtbench.commands import registry
from tests.conftest import mtbench_cli
from tests.fake_sysfs import make_power_board


def test_lists_the_boards_modes_and_the_current_one(tmp_path, capsys):
    make_power_board(tmp_path, "tx2", mode=3)
    assert registry.call("power", ["--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == ["    0  MAXN", "    1  MAXQ", "    3  MAXP_CORE_ARM   (current)"]


def test_no_modes_and_a_bad_argument_are_one_line_exit_2(tmp_path, capsys):
    assert registry.call("power", ["--root", str(tmp_path)]) == 2
    assert registry.call("power", ["--frobnicate"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("mtbench: error: ") for line in err), err
    assert "power: no nvpmodel modes in" in err[0] and "--frobnicate" in err[1]


def test_power_has_help_and_is_listed():
    proc = mtbench_cli("power", "--help")
    assert proc.returncode == 0 and "--root DIR" in proc.stdout, proc.stderr
    assert "power" in mtbench_cli("--help").stdout
