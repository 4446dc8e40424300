"""Tiny environments for tests. Importing this module registers them with gymnasium, so spawned
processes (appo_vtrace.py's actors) can make them by the id "toy_envs:AlwaysTruncates-v0"."""

import contextlib
import multiprocessing
import os
import subprocess
import sys
import time

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


def wait_for(path: str, at_least: int, timeout: float = 120.0):
    """Until the number in the file reaches at_least (written by another process)."""
    deadline = time.time() + timeout
    while True:
        with contextlib.suppress(FileNotFoundError, ValueError):
            with open(path) as f:
                if int(f.read()) >= at_least:
                    return
        if time.time() > deadline:
            raise TimeoutError(f"{path} never reached {at_least}")
        time.sleep(0.001)


def write_number(path: str, number: int):
    with open(f"{path}.tmp", "w") as f:
        f.write(str(number))
    os.replace(f"{path}.tmp", path)  # a reader never sees it half written


class LockstepCountsSteps(CountsSteps):
    """CountsSteps for one appo_vtrace actor of 2 envs x 32 steps, run in a fixed order with its
    learner through files in $LOCKSTEP: rollout j acts with version j - 1 when j is odd (lag 1)
    and with version j when j is even (lag 0). The first step of rollout j writes "started" = j
    (the actor has read its version: the learner waits for it before updating on rollout j - 1);
    the last step of an odd rollout j waits for "locked" = j, written once the learner holds the
    weights' lock, so that the actor reads the version after update j."""

    def step(self, action):
        result = super().step(action)
        if multiprocessing.parent_process() is None:  # the learner's evaluation: no actor here
            return result
        rollout, t = divmod(len(CountsSteps.log) - 1, 64)  # this step's rollout, its index in it
        if t == 0 and rollout >= 1:
            write_number(os.path.join(os.environ["LOCKSTEP"], "started"), rollout)
        if t == 63 and rollout % 2 == 1:
            wait_for(os.path.join(os.environ["LOCKSTEP"], "locked"), rollout)
        return result


if "LockstepCountsSteps-v0" not in gym.registry:
    gym.register("LockstepCountsSteps-v0", entry_point=LockstepCountsSteps)


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


class UnboundedActions(AlwaysTruncates):
    """AlwaysTruncates whose action Box has no bounds: (-inf, inf)."""

    action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)


class ReshapesObservation(AlwaysTruncates):
    """AlwaysTruncates whose observation, at step 3, has the shape (2,), not the (1,) it declares: a
    custom env's bug."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        obs = np.zeros(2, np.float32) if self.t == 3 else obs
        return obs, reward, terminated, truncated, info


for name, entry_point in [
    ("UnboundedActions-v0", UnboundedActions),
    ("ReshapesObservation-v0", ReshapesObservation),
]:
    if name not in gym.registry:
        gym.register(name, entry_point=entry_point)


class RecordsSeeds(AlwaysTruncates):
    """AlwaysTruncates that, in a child process (appo_vtrace.py's actor), appends "pid seed" to the
    file $SEED_LOG for each seed it is reset with; the last of a process's $SEED_ENVS envs then
    waits (up to 60 s) until $SEED_PROCESSES processes have written as many: every actor has seeded
    all its envs before the learner can finish. (Waiting for the processes alone let a loaded actor
    be stopped between its first env's seed and its second's.)"""

    def reset(self, seed=None, options=None):
        path = os.environ.get("SEED_LOG")
        if seed is not None and path and multiprocessing.parent_process() is not None:
            with open(path, "a") as file:
                file.write(f"{os.getpid()} {seed}\n")
            envs, processes = int(os.environ["SEED_ENVS"]), int(os.environ["SEED_PROCESSES"])
            last = len(seeding_processes(path)[os.getpid()]) == envs  # this process's last env
            deadline = time.time() + 60
            while last and time.time() < deadline and fully_seeded(path, envs) < processes:
                time.sleep(0.05)
        return super().reset(seed=seed, options=options)


def fully_seeded(path: str, envs: int) -> int:
    """How many processes of a RecordsSeeds log have seeded all their envs."""
    return sum(len(seeds) >= envs for seeds in seeding_processes(path).values())


def seeding_processes(path: str) -> dict[int, list[int]]:
    """The seeds each process wrote to a RecordsSeeds log, by pid."""
    seeds = {}
    with open(path) as file:
        for line in file.read().splitlines():
            pid, seed = map(int, line.split())
            seeds.setdefault(pid, []).append(seed)
    return seeds


if "RecordsSeeds-v0" not in gym.registry:
    gym.register("RecordsSeeds-v0", entry_point=RecordsSeeds)
