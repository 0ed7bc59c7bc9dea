"""DQN's emulator in a prediction: the trace runs the job's own Atari game (its steps' time and its memory are the
job's), and falls back to synthetic frames, saying so, where ALE cannot run."""
from __future__ import annotations

import sys

import pytest

from mtbench.predict import calibration
from mtbench.predict.predictor import Predictor

SMALL = ("model.workload.learning_starts=40", "model.workload.buffer_size=100", "warmup=1", "steps=3")


def test_dqn_is_traced_on_its_own_game_and_counts_the_emulators_memory(tmp_path, monkeypatch):
    pytest.importorskip("ale_py", reason="the emulator is ale-py's")
    monkeypatch.setenv(calibration.ENV_DIR, str(tmp_path))
    from models.dqn import _EMULATOR_BYTES

    game, traced = Predictor(target_name="none", device="cpu", overrides=SMALL).trace("dqn", 2)
    frames, synthetic = Predictor(target_name="none", device="cpu", overrides=(*SMALL, "data=synthetic")).trace(
        "dqn", 2)
    assert "on the job's own data (atari:Pong" in traced and "own data" not in synthetic
    # ALE's machine and gymnasium's modules: some MiB of anonymous memory, which synthetic frames do not hold
    assert _EMULATOR_BYTES["atari:Pong"] > 1 << 20
    assert game.host_bytes - frames.host_bytes == _EMULATOR_BYTES["atari:Pong"]


def test_without_ale_the_trace_says_it_ran_on_synthetic_frames(tmp_path, monkeypatch):
    monkeypatch.setenv(calibration.ENV_DIR, str(tmp_path))
    monkeypatch.setitem(sys.modules, "ale_py", None)  # `import ale_py` raises ImportError, as where it is missing
    trace, traced = Predictor(target_name="none", device="cpu", overrides=SMALL).trace("dqn", 2)
    assert "on synthetic data, not the job's: data=atari needs gymnasium, ale-py" in traced, traced
    assert trace.flops > 0 and trace.host_bytes > 0  # the replay buffer's pages still count


def test_the_emulators_time_is_its_median_step_so_a_slow_moment_does_not_move_it(tmp_path, monkeypatch):
    """A step's emulator time is `env_steps` times the median of the emulator's recent steps (setup's random play
    among them): a third of them slowed by a busy machine (on a clock the emulator's steps move) leaves it at the
    others' time, where the last step's own sum would hold a slow one."""
    monkeypatch.setenv(calibration.ENV_DIR, str(tmp_path))
    import models.dqn
    from mtbench.data.atari import SyntheticFrames

    clock = {"now": 100.0, "steps": 0}

    class Clock:
        @staticmethod
        def monotonic() -> float:
            return clock["now"]

    real_step = SyntheticFrames.step

    def step(self, action):
        clock["steps"] += 1
        clock["now"] += 1.0 if clock["steps"] % 3 == 0 else 0.001  # one step in three: a slow moment
        return real_step(self, action)

    monkeypatch.setattr(models.dqn, "time", Clock)
    monkeypatch.setattr(SyntheticFrames, "step", step)
    trace, traced = Predictor(target_name="none", device="cpu", overrides=(*SMALL, "data=synthetic")).trace("dqn", 2)
    assert "own data" not in traced and clock["steps"] >= 48  # setup's 40 and the trace's two steps of four
    assert trace.host_s == pytest.approx(4 * 0.001)
