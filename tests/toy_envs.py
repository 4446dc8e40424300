"""Tiny environments for tests. Importing this module registers them with gymnasium, so spawned
processes (appo_vtrace.py's actors) can make them by the id "toy_envs:AlwaysTruncates-v0"."""

import gymnasium as gym
import numpy as np


class AlwaysTruncates(gym.Env):
    """Reward 1 every step, never terminates, truncated after 5 steps: the true value is
    1 / (1 - gamma)."""

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


class TerminatesAtTimeLimit(AlwaysTruncates):
    """Reward 1 every step, terminates after 5 steps, registered with a time limit of 5 steps:
    gymnasium's TimeLimit then also reports truncated=True on that terminal step."""

    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), 1.0, self.t >= 5, False, {}


if "TerminatesAtTimeLimit-v0" not in gym.registry:
    gym.register("TerminatesAtTimeLimit-v0", entry_point=TerminatesAtTimeLimit, max_episode_steps=5)


class CountsSteps(AlwaysTruncates):
    """Reward 1 every step, truncated after 5 steps, like AlwaysTruncates, but the observation is
    the step count: the final observation (5) differs from the reset one (0), so a test can tell
    which one a value was taken of. Every (observation, action) the env gets is appended to
    `log`."""

    observation_space = gym.spaces.Box(0.0, 5.0, (1,), np.float32)
    log: list = []

    def step(self, action):
        CountsSteps.log.append((float(self.t), np.array(action, np.float32)))
        self.t += 1
        return np.full(1, self.t, np.float32), 1.0, False, self.t >= 5, {}


if "CountsSteps-v0" not in gym.registry:
    gym.register("CountsSteps-v0", entry_point=CountsSteps)
