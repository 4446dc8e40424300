"""How trained policies move: forward speed and how often the torso is upside down, per episode of
the deterministic policy (does a low return come from a fall, a flip or a slow gait?).

    python benchmarks/posture.py --checkpoints benchmarks/runs/HalfCheetah-v5__*/checkpoint.pt

For each checkpoint: --episodes episodes from seed --seed on (the scripts' final evaluation uses
seed + 10000 too), with the script's own env setup, normalizer and action scaling. Prints one
Markdown row per checkpoint: the return, the episode length, the mean forward speed (m/s, of the
torso) and the fraction of steps with the torso's up axis pointing down.
"""

import importlib
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch
import tyro

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the scripts (this folder is on sys.path already)
from symmetry import flags_of  # noqa: E402  (benchmarks/symmetry.py)


@dataclass
class Args:
    checkpoints: tuple[str, ...]
    """checkpoint.pt files of finished runs (one row each)"""
    episodes: int = 3
    """episodes per checkpoint"""
    seed: int = 10_000
    """seed of the first episode; the others follow it"""


def is_upside_down(data, body: int) -> bool:
    """Whether the body's up axis points down: the z component of its z axis (xmat is its
    rotation matrix, row-major) below 0."""
    return bool(data.xmat[body][8] < 0)


@torch.no_grad()
def episode_posture(script, agent, env_id: str, seed: int) -> dict:
    """One deterministic episode: its return, length, the torso's mean forward speed and the
    fraction of steps it is upside down."""
    envs = script.make_envs(env_id, 1)
    env = envs.envs[0].unwrapped
    torso = env.model.body("torso").id
    obs, _ = envs.reset(seed=seed)
    episode_return, length, speeds, upside_down = 0.0, 0, [], []
    while True:
        x_before = env.data.xpos[torso][0]
        mean = agent.actor_mean(agent.normalize(torch.as_tensor(obs, dtype=torch.float32)))
        obs, reward, terminated, truncated, _ = envs.step(
            script.scale_action(mean.numpy(), envs.single_action_space)
        )
        episode_return += float(reward[0])
        length += 1
        if terminated[0] or truncated[0]:  # the env has reset itself: its state is the next one's
            break
        speeds.append((env.data.xpos[torso][0] - x_before) / env.dt)
        upside_down.append(is_upside_down(env.data, torso))
    envs.close()
    return {"return": episode_return, "length": length, "speed": float(np.mean(speeds)),
            "upside_down": float(np.mean(upside_down))}  # fmt: skip


def main(args: Args):
    print("| run | flags | return | length | forward speed (m/s) | upside down |")
    print("|---|---|---|---|---|---|")
    for path in args.checkpoints:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        script = importlib.import_module(ckpt["script"])
        saved = script.saved_args(ckpt)
        agent = script.Agent(ckpt["obs_dim"], ckpt["act_dim"], saved)
        agent.load_state_dict(ckpt["agent"])
        seeds = range(args.seed, args.seed + args.episodes)
        episodes = [episode_posture(script, agent, ckpt["env_id"], seed) for seed in seeds]
        flags = flags_of(script, ckpt["args"]) or "defaults"
        cells = [f"{ckpt['env_id']} seed {saved.seed}", flags]
        cells.append(f"{np.mean([e['return'] for e in episodes]):.0f}")
        cells.append(f"{np.mean([e['length'] for e in episodes]):.0f}")
        cells.append(f"{np.mean([e['speed'] for e in episodes]):.2f}")
        cells.append(f"{np.mean([e['upside_down'] for e in episodes]):.0%}")
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main(tyro.cli(Args))
