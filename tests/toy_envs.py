"""Tiny environments for tests. Importing this module registers them with gymnasium, so spawned
processes (appo_vtrace.py's actors) can make them by the id "toy_envs:AlwaysTruncates-v0"."""

import multiprocessing
import subprocess
import sys

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


class SignedRewards(AlwaysTruncates):
    """Rewards -2, 2, -2, 2, -2, then truncated: an episode's return is -2."""

    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), 2.0 * (-1) ** self.t, False, self.t >= 5, {}


if "SignedRewards-v0" not in gym.registry:
    gym.register("SignedRewards-v0", entry_point=SignedRewards)


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


class DictObservations(AlwaysTruncates):
    """AlwaysTruncates with a Dict observation that holds a Tuple: 2 + 1 + 2 (one-hot) = 5 numbers
    once flattened. Its step count is one of them, so the flat vector changes."""

    observation_space = gym.spaces.Dict(
        position=gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        extra=gym.spaces.Tuple(
            (gym.spaces.Box(0.0, 5.0, (1,), np.float32), gym.spaces.Discrete(2))
        ),
    )

    def observation(self):
        return {"position": np.zeros(2, np.float32), "extra": (np.full(1, self.t, np.float32), 1)}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation(), {}

    def step(self, action):
        _, reward, terminated, truncated, info = super().step(action)
        return self.observation(), reward, terminated, truncated, info


class GraphObservations(AlwaysTruncates):
    """A Dict observation with a Graph inside: no flat vector can hold it."""

    observation_space = gym.spaces.Dict(
        graph=gym.spaces.Graph(gym.spaces.Box(0.0, 1.0, (2,)), None)
    )


class BecomesNonFinite(AlwaysTruncates):
    """AlwaysTruncates whose observation (what="observation") or reward (what="reward") is NaN at
    step 3: a custom env's bug."""

    def __init__(self, what: str):
        self.what = what

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.t == 3 and self.what == "observation":
            obs = np.full(1, np.nan, np.float32)
        if self.t == 3 and self.what == "reward":
            reward = float("inf")
        return obs, reward, terminated, truncated, info


class StartsAChild(AlwaysTruncates):
    """AlwaysTruncates that, made in a child process (appo_vtrace.py's actor), starts a child of its
    own that waits for a line on its stdin, as glfw's library probe does while MuJoCo loads: an
    actor ended then leaves it waiting, and at EOF it prints an EOFError traceback. Its command
    line holds CHILD_MARK, by which a test finds it."""

    CHILD_MARK = "toy_envs child waiting for a line"

    def __init__(self):
        if multiprocessing.parent_process() is not None:
            code = f"input()  # {self.CHILD_MARK}"
            self.child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)


for name, entry_point, kwargs in [
    ("DictObservations-v0", DictObservations, {}),
    ("GraphObservations-v0", GraphObservations, {}),
    ("NonFiniteObservation-v0", BecomesNonFinite, {"what": "observation"}),
    ("NonFiniteReward-v0", BecomesNonFinite, {"what": "reward"}),
    ("StartsAChild-v0", StartsAChild, {}),
]:
    if name not in gym.registry:
        gym.register(name, entry_point=entry_point, kwargs=kwargs)
