"""`mtbench power`: the board's nvpmodel modes, one line on a machine without them."""
from __future__ import annotations

from mtbench.commands import power as power_cmd
from tests.fake_sysfs import make_power_board


def test_lists_the_boards_modes_and_the_current_one(tmp_path, capsys):
    make_power_board(tmp_path, "tx2", mode=3)
    assert power_cmd.main(["--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == ["    0  MAXN", "    1  MAXQ", "    3  MAXP_CORE_ARM   (current)"]


def test_no_modes_and_a_bad_argument_are_one_line_exit_2(tmp_path, capsys):
    assert power_cmd.main(["--root", str(tmp_path)]) == 2
    assert power_cmd.main(["--frobnicate"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("mtbench: error: power: ") for line in err)
