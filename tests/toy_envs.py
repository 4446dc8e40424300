"""Tiny environments for tests. Importing this module registers them with gymnasium, so spawned
processes (appo_vtrace.py's actors) can make them by the id "toy_envs:AlwaysTruncates-v0"."""

import gymnasium as gym
import numpy as np


class AlwaysTruncates(gym.Env):
    """Reward 1 every step, never terminates, truncated after 5 steps: the true value is 1 / (1 - gamma)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), 1.0, False, self.t >= 5, {}


if "AlwaysTruncates-v0" not in gym.registry:
    gym.register("AlwaysTruncates-v0", entry_point=AlwaysTruncates)
