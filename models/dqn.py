"""DQN (Mnih et al., "Human-level control through deep reinforcement learning", Nature 2015) on Atari.

Network: 3 convolutions (32 8x8/4, 64 4x4/2, 64 3x3/1) and 2 dense layers (512, one output per action)
on 4 stacked 84x84 grayscale frames. Before measurement (not timed) a replay buffer is filled with
`learning_starts` transitions of random play. One measured step = `env_steps` environment steps with
epsilon-greedy actions from the online network, then one gradient update (Huber loss against a target
network, synced every `target_update` updates) on `batch` transitions sampled from the buffer.

The workload reports its environment and update time separately (the issue asks for both); these two
sub-timings are taken inside the step, the step's own time is still the runner's.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mtbench.data.atari import AtariGame
from mtbench.device.peak import anon_rss_bytes
from mtbench.workload.base import SetupContext, StepLoss, Workload, optimizer_from

# what making a process's first emulator of a game added to its anonymous memory (ALE's machine, the ROM, gymnasium's
# and ale-py's modules on first import): measured once per process, as a job makes one; a later one reuses the
# modules, so the first figure stands for every trace of the game in a predictor's process
_EMULATOR_BYTES: Dict[str, int] = {}


class NatureQNetwork(nn.Module):
    def __init__(self, actions: int = 6) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, 512), nn.ReLU(),
            nn.Linear(512, actions),
        )

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.body(frames.float() / 255.0)  # uint8 frames are scaled on the device


class ReplayBuffer:
    """Transitions in preallocated uint8 arrays (pages are touched only as the buffer fills)."""

    def __init__(self, capacity: int) -> None:
        self.obs = np.empty((capacity, 4, 84, 84), dtype=np.uint8)
        self.next_obs = np.empty((capacity, 4, 84, 84), dtype=np.uint8)
        self.action = np.empty(capacity, dtype=np.int64)
        self.reward = np.empty(capacity, dtype=np.float32)
        self.done = np.empty(capacity, dtype=np.float32)
        self.capacity, self.size, self.pos = capacity, 0, 0

    def add(self, obs, action, reward, next_obs, done) -> None:
        i = self.pos
        self.obs[i], self.next_obs[i], self.action[i], self.reward[i], self.done[i] = obs, next_obs, action, reward, done
        self.pos = (self.pos + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, rng: np.random.Generator, n: int):
        idx = rng.integers(0, self.size, n)
        return self.obs[idx], self.action[idx], self.reward[idx], self.next_obs[idx], self.done[idx]


class DQN(Workload):
    def __init__(self, optimizer: Any, env_steps: int = 4, learning_starts: int = 1000, buffer_size: int = 10000,
                 target_update: int = 1000, gamma: float = 0.99, epsilon: float = 0.1, actions: int = 6) -> None:
        self.make_optimizer = optimizer
        self.env_steps, self.learning_starts = int(env_steps), int(learning_starts)
        self.buffer_size, self.target_update = int(buffer_size), int(target_update)
        self.gamma, self.epsilon = float(gamma), float(epsilon)
        self.q = NatureQNetwork(actions)  # resized to the game's action count in setup
        self.env_time: List[float] = []
        self.update_time: List[float] = []
        self.emulator_s = 0.0  # the emulator's own time (env.step and reset) in the current step

    def setup(self, ctx: SetupContext) -> None:
        self.device = ctx.device
        before = anon_rss_bytes()
        self.env = ctx.data.atari_env(ctx.seed)
        made = anon_rss_bytes()
        self.emulator_bytes = 0  # only an emulator's: synthetic frames hold a random generator
        if isinstance(self.env, AtariGame) and before is not None and made is not None:
            self.emulator_bytes = _EMULATOR_BYTES.setdefault(ctx.data.label, max(0, made - before))
        if self.env.n_actions != self.q.body[-1].out_features:
            self.q = NatureQNetwork(self.env.n_actions)
        self.q.to(ctx.device).train()
        self.target = NatureQNetwork(self.env.n_actions).to(ctx.device)
        self.target.load_state_dict(self.q.state_dict())
        self.optimizer = optimizer_from(self.make_optimizer, self.q.parameters())
        self.batch_size = ctx.batch_size
        self.rng = np.random.default_rng(ctx.seed)
        self.buffer = ReplayBuffer(max(self.buffer_size, self.learning_starts, ctx.batch_size))
        self.obs, _ = self.env.reset()
        for _ in range(max(self.learning_starts, ctx.batch_size)):  # random play fills the buffer, untimed
            self._env_step(int(self.rng.integers(self.env.n_actions)))
        self.updates = 0

    def _env_step(self, action: int) -> None:
        began = time.monotonic()
        next_obs, reward, terminated, truncated, _ = self.env.step(action)
        self.buffer.add(self.obs, action, np.sign(reward), next_obs, float(terminated))  # rewards clipped
        self.obs = self.env.reset()[0] if terminated or truncated else next_obs
        self.emulator_s += time.monotonic() - began

    def _act(self) -> int:
        if self.rng.random() < self.epsilon:
            return int(self.rng.integers(self.env.n_actions))
        with torch.no_grad():
            obs = torch.from_numpy(np.asarray(self.obs)).to(self.device).unsqueeze(0)
            q = self.q(obs)
            if q.device.type == "meta":  # a shape-only run (`mtbench models` counting FLOPs) has no value to act on
                return 0
            return int(q.argmax(1).item())  # .item() is a CPU-GPU sync point

    def step(self) -> StepLoss:
        t0, self.emulator_s = time.monotonic(), 0.0
        for _ in range(self.env_steps):
            self._env_step(self._act())
        t1 = time.monotonic()
        obs, action, reward, next_obs, done = (torch.from_numpy(a).to(self.device)
                                               for a in self.buffer.sample(self.rng, self.batch_size))
        with torch.no_grad():
            target = reward + self.gamma * (1.0 - done) * self.target(next_obs).max(1).values
        q = self.q(obs).gather(1, action.unsqueeze(1)).squeeze(1)
        loss = F.smooth_l1_loss(q, target)  # the paper's error clipping to [-1, 1] is the Huber loss
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.updates += 1
        if self.updates % self.target_update == 0:
            self.target.load_state_dict(self.q.state_dict())
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # so that the update's time is its own
        self.env_time.append(t1 - t0)
        self.update_time.append(time.monotonic() - t1)
        return loss.detach()  # the TD error's Huber loss over the sampled transitions, before the update

    def modules(self) -> List[nn.Module]:
        return [self.q]

    def close(self) -> None:
        if getattr(self, "env", None) is not None:
            self.env.close()

    def host_bytes(self, later_steps: int) -> int:
        """The replay buffer's touched pages (np.empty: a page is touched when a transition is first written) and
        the emulator's memory (ALE's, measured as it was made)."""
        buffer = getattr(self, "buffer", None)
        if buffer is None:
            return 0
        per = sum(a.nbytes // buffer.capacity for a in (buffer.obs, buffer.next_obs, buffer.action, buffer.reward,
                                                         buffer.done))
        written = min(buffer.capacity, buffer.size + later_steps * self.env_steps)
        return int(written * per) + int(getattr(self, "emulator_bytes", 0))

    def host_seconds(self) -> float:
        """The emulator's own time in its last step (env.step, a reset, the replay buffer's write; the action
        selection is torch's ops, which the trace counts)."""
        return float(self.emulator_s)

    def units_per_sample(self) -> Dict[str, float]:
        return {"env_steps": self.env_steps / self.batch_size} if hasattr(self, "batch_size") else {}

    def extra_metrics(self, measured_steps: int) -> Dict[str, Any]:
        if not measured_steps or len(self.env_time) < measured_steps:
            return {}
        env, update = self.env_time[-measured_steps:], self.update_time[-measured_steps:]
        return {"dqn": {
            "env_steps_per_step": self.env_steps,
            "env_time_s_mean": float(np.mean(env)),  # k environment steps with action selection
            "update_time_s_mean": float(np.mean(update)),  # sampling, forward, backward, optimizer
            "env_share": float(np.sum(env) / (np.sum(env) + np.sum(update))),
            "target_syncs": self.updates // self.target_update,
        }}
