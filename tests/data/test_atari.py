"""DQN on a real ALE game (the ROMs ship in the ale-py wheel) and on synthetic frames."""
from __future__ import annotations

import pytest

from mtbench.data.atari import Atari, SyntheticFrames
from mtbench.errors import DataError

SMALL = ["model=dqn", "batch=4", "model.workload.learning_starts=32", "model.workload.buffer_size=64",
         "model.workload.target_update=2", "steps=2"]


def test_dqn_on_breakout(run):
    s = run(SMALL + ["data=atari", "data.game=Breakout"])
    assert s["success"], s["failure"]
    assert s["data"] == "atari:Breakout"
    assert s["parameters"] == 1_686_180  # Nature DQN with Breakout's 4 actions
    dqn = s["dqn"]
    assert dqn["env_steps_per_step"] == 4 and dqn["target_syncs"] == 1
    assert dqn["env_time_s_mean"] > 0 and dqn["update_time_s_mean"] > 0
    assert dqn["env_time_s_mean"] + dqn["update_time_s_mean"] <= s["step_time_s"]["max"] * 1.01


def test_dqn_defaults_to_pong():
    from tests.conftest import compose_cfg

    cfg = compose_cfg(["model=dqn"])
    assert cfg.data.game == "Pong" and cfg.data._target_.endswith("Atari")


def test_dqn_on_synthetic_frames(run):
    s = run(SMALL + ["data=synthetic"])
    assert s["success"], s["failure"]
    assert s["data"] == "synthetic"


def test_env_shapes():
    env = Atari("Pong").atari_env(seed=0)
    obs, _ = env.reset()
    assert obs.shape == (4, 84, 84) and env.n_actions == 6
    env.close()
    fake = SyntheticFrames(seed=0)
    assert fake.reset()[0].shape == (4, 84, 84)


def test_unknown_game_names_the_choices():
    with pytest.raises(DataError, match="'Nope' is not an ALE game.*Breakout"):
        Atari("Nope").atari_env(seed=0)


@pytest.mark.slow
def test_ale_banner_is_silenced():
    # ALE writes "[Powered by Stella]" from C++ straight to fd 2: only a child process can catch it
    import subprocess
    import sys

    from tests.conftest import REPO

    code = "from mtbench.data.atari import Atari; env = Atari('Pong').atari_env(seed=0); env.reset(); env.close()"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Stella" not in done.stderr and "Arcade Learning Environment" not in done.stderr, done.stderr
