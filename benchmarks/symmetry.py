"""Symmetry of trained policies, over the states the deterministic policy visits:

* symmetry_error: mean squared difference between the actor mean at mirrored states and the
  mirrored actor mean (0 for an exactly symmetric policy);
* clipped_symmetry_error: the same of the actions the env applies, the means clipped to [-1, 1]
  first (a mean drifted past the bound moves nothing: its asymmetry out there is not the gait's);
* state_asymmetry: how far the visited states are from their own mirror images (0 when the robot
  moves on the mirror-invariant subspace, e.g. a Walker2d whose two legs move as one).

    python benchmarks/symmetry.py --checkpoints benchmarks/runs/Walker2d-v5__*/checkpoint.pt

Works for checkpoints of ppo_continuous.py and ppo_symaug.py (any script whose checkpoint names
it), on gymnasium and on EnvPool's robots (Go1JoystickFlatTerrain-v1: the flat [state |
privileged_state] is mirrored part by part); the mirror maps come from ppo_symaug.make_mirror_fns.
Rows are appended to symmetry.csv.
"""

import dataclasses
import datetime
import importlib
import os
import pickle
import sys
from dataclasses import dataclass

import numpy as np
import torch
import tyro

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the scripts (this folder is on sys.path already)
from run import append_rows  # noqa: E402  (benchmarks/run.py)

import ppo_symaug  # noqa: E402


@dataclass
class Args:
    checkpoints: tuple[str, ...]
    """checkpoint.pt files of finished runs"""
    steps: int = 5000
    """env steps of the deterministic policy whose visited states are measured"""
    output: str = os.path.join(HERE, "symmetry.csv")
    """CSV file the rows are appended to"""


@torch.no_grad()
def visited_states(agent, script, env_id: str, steps: int, backend: str, seed: int = 0):
    """The raw observations the deterministic policy visits in one env, and the parts of the flat
    observation (a robot's {"state": size, "privileged_state": size}; {} for a vector)."""
    envs = script.make_envs(env_id, 1, backend)
    obs, _ = envs.reset(seed=seed)
    states = []
    for _ in range(steps):
        states.append(obs[0].copy())
        mean = agent.mean_action(torch.as_tensor(obs, dtype=torch.float32))
        obs, *_ = envs.step(script.scale_action(mean.numpy(), envs.single_action_space))
    parts = {}
    if getattr(envs, "keys", None):  # EnvPoolVectorEnv of a robot: state first
        size = envs.single_observation_space.shape[0]
        parts = {"state": envs.actor_dim, "privileged_state": size - envs.actor_dim}
    envs.close()
    return torch.as_tensor(np.stack(states), dtype=torch.float32), parts


def state_asymmetry(states: torch.Tensor, mirror_obs) -> float:
    """mean ||M s - s||^2 / (2 mean ||s - mean(s)||^2) over raw observations: 0 when every state is
    its own mirror image, growing with the distance from the mirror-invariant subspace relative to
    the spread of the visited states (i.i.d. dims would give the share of dims the mirror moves).

    A symmetric policy started in a mirror-invariant state (Walker2d resets with both legs together,
    up to small noise) gives mirror-symmetric actions there, so without noise it never leaves the
    invariant subspace; this measures whether the learned gait did."""
    spread = 2.0 * ((states - states.mean(0)) ** 2).sum(-1).mean()
    return (((mirror_obs(states) - states) ** 2).sum(-1).mean() / spread).item()


@torch.no_grad()
def clipped_symmetry_error(agent, states: torch.Tensor, mirror_obs, mirror_act) -> float:
    """symmetry_mse of the clipped means. The mirror only permutes actions and flips their signs,
    so it commutes with the clip to the symmetric [-1, 1]: clipping before or after it agrees."""
    mean = agent.mean_action(states).clamp(-1.0, 1.0)
    mirrored_mean = agent.mean_action(mirror_obs(states)).clamp(-1.0, 1.0)
    return ppo_symaug.symmetry_mse(mean, mirrored_mean, mirror_act).item()


def flags_of(script, saved: dict) -> str:
    """The checkpoint's training settings that differ from the script's defaults today, written as
    flags (results.csv's flags column). env_id and the steps have their own columns; the fields
    from exp_name on (seed, logging, checkpoints, evaluation) do not change the policy."""
    defaults = script.Args()
    flags = []
    for field in dataclasses.fields(defaults):
        if field.name == "exp_name":
            break
        default = getattr(defaults, field.name)
        value = saved.get(field.name, default)
        if isinstance(value, list):
            value = tuple(value)
        if field.name in ("env_id", "total_timesteps") or value == default:
            continue
        flag = "--" + field.name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, tuple):
            flags.append(" ".join([flag] + [str(size) for size in value]))
        else:
            flags.append(f"{flag} {value}")
    return " ".join(flags)


def main(args: Args):
    rows = []
    for path in args.checkpoints:
        try:  # a checkpoint is data: weights_only never runs code from the file
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            raise SystemExit(f"error: refusing {path}: it holds more than tensors and plain values")
        script = importlib.import_module(ckpt["script"])
        actor_dim = ckpt["agent"]["actor_mean.0.weight"].shape[1]  # a robot's: state only
        agent = script.Agent(ckpt["obs_dim"], ckpt["act_dim"], script.saved_args(ckpt), actor_dim)
        agent.load_state_dict(ckpt["agent"])
        mirror_obs, mirror_act = ppo_symaug.make_mirror_fns(ckpt["env_id"])
        backend = ckpt["args"].get("env_backend", "gymnasium")
        states, parts = visited_states(agent, script, ckpt["env_id"], args.steps, backend)
        mirror_obs = ppo_symaug.flat_mirror(mirror_obs, parts)
        error = ppo_symaug.symmetry_error(agent, states, mirror_obs, mirror_act)
        clipped = clipped_symmetry_error(agent, states, mirror_obs, mirror_act)
        rows.append(
            {
                "script": f"{ckpt['script']}.py",
                "env_id": ckpt["env_id"],
                "seed": ckpt["args"]["seed"],
                "flags": flags_of(script, ckpt["args"]),
                "global_step": ckpt["global_step"],
                "symmetry_error": f"{error:.3g}",
                "clipped_symmetry_error": f"{clipped:.3g}",
                "state_asymmetry": f"{state_asymmetry(states, mirror_obs):.3g}",
                "checkpoint": path,
                "date": datetime.date.today().isoformat(),
            }
        )
        print(rows[-1], flush=True)
    append_rows(args.output, rows)


if __name__ == "__main__":
    main(tyro.cli(Args))
