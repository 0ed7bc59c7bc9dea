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
