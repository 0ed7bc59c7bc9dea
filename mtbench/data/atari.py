"""Atari 2600 games through gymnasium + ale-py (the ROMs ship in the ale-py wheel), preprocessed as in
the Nature DQN: 4-frame skip, 84x84 grayscale, 4 stacked frames, up to 30 no-ops at reset. And a
synthetic stand-in with the same observation and action shapes for machines without ALE.
"""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from mtbench.data.base import DataSource
from mtbench.errors import DataError, UsageError


class SyntheticFrames:
    """Random 4x84x84 uint8 observations, `actions` actions, episodes of `episode_len` steps."""

    def __init__(self, seed: int = 0, actions: int = 6, episode_len: int = 1000) -> None:
        self.rng = np.random.default_rng(seed)
        self.n_actions = actions
        self.episode_len = episode_len
        self.t = 0

    def _obs(self) -> np.ndarray:
        return self.rng.integers(0, 256, (4, 84, 84), dtype=np.uint8)

    def reset(self, seed: Any = None) -> Tuple[np.ndarray, dict]:
        self.t = 0
        return self._obs(), {}

    def step(self, action: int):
        self.t += 1
        return self._obs(), float(self.rng.random() < 0.05), self.t >= self.episode_len, False, {}

    def close(self) -> None:
        pass


class AtariGame:
    """A gymnasium Atari env with DQN preprocessing; `n_actions` for the network's head."""

    def __init__(self, game: str, seed: int) -> None:
        try:
            import ale_py
            import gymnasium as gym
            from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation
        except ImportError as exc:
            raise UsageError(f"data=atari needs gymnasium, ale-py and opencv-python-headless ({exc}); "
                             "or use data=synthetic") from None
        # ALE writes its banner ("A.L.E: Arcade Learning Environment ...", "[Powered by Stella]") to stderr
        # for every env it makes: keep its errors only, so that a job's console shows mtbench's lines
        if hasattr(ale_py, "LoggerMode"):  # ale-py >= 0.7
            ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
        gym.register_envs(ale_py)
        try:
            # frameskip=1 here: AtariPreprocessing does the 4-frame skip (with max-pooling of the last two)
            env = gym.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=0.0)
        except gym.error.Error as exc:
            games = sorted(env_id.split("/")[1].rsplit("-", 1)[0] for env_id in gym.registry
                           if env_id.startswith("ALE/") and env_id.endswith("-v5"))
            raise DataError(f"data.game={game!r} is not an ALE game ({type(exc).__name__}); allowed: "
                            f"{', '.join(games)}") from None
        env = AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=30)
        self.env = FrameStackObservation(env, 4)
        self.n_actions = int(self.env.action_space.n)
        self.seed = seed
        self._first = True

    def reset(self, seed: Any = None):
        obs, info = self.env.reset(seed=self.seed if self._first else None)
        self._first = False
        return np.asarray(obs), info

    def step(self, action: int):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return np.asarray(obs), float(reward), terminated, truncated, info

    def close(self) -> None:
        self.env.close()


class Atari(DataSource):
    name = "atari"
    gives = "an Atari environment"
    traced_as_is = True  # ALE's steps and memory are the job's; the ROMs ship with ale-py

    def __init__(self, game: str = "Pong", **loader) -> None:
        self.set_loader(loader)
        self.game = str(game)

    @property
    def label(self) -> str:
        return f"atari:{self.game}"

    def atari_env(self, seed):
        return AtariGame(self.game, seed)
