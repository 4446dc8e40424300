r"""Videos and a side-by-side frame strip of trained policies (e.g. PPO vs symmetry augmentation).

    python benchmarks/gaits.py --output benchmarks/plots/humanoid-gaits.png \
        --checkpoints benchmarks/runs/Humanoid-v5__bench_ppo_{continuous,symaug}__2__*/checkpoint.pt

For each checkpoint: one episode of the deterministic policy (the script's own evaluate(), seed
--seed), recorded as videos/gaits/<run>.mp4, and --frames frames of it, evenly spaced over the
first --seconds seconds, as one row of the PNG (labelled with the script and seed). Rendering is
MuJoCo's offscreen renderer (without a screen set MUJOCO_GL=egl). EnvPool's robots too (their
run's backend; a software-rendered frame of a Go1 takes about 0.5 s, a whole episode minutes).
"""

import dataclasses
import importlib
import os
import sys
from dataclasses import dataclass

import imageio.v3 as iio
import matplotlib
import numpy as np
import torch
import tyro

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


@dataclass
class Args:
    checkpoints: tuple[str, ...]
    """checkpoint.pt files of finished runs (one row each)"""
    labels: tuple[str, ...] = ()
    """row titles, one per checkpoint (default: the script and its seed)"""
    output: str = os.path.join(HERE, "plots", "gaits.png")
    """the PNG with one row of frames per checkpoint"""
    video_dir: str = os.path.join(os.path.dirname(HERE), "videos", "gaits")
    """where the MP4 of each episode is written"""
    frames: int = 8
    """frames per row"""
    seconds: float = 4.0
    """the frames are spread evenly over the first this many seconds of the episode"""
    seed: int = 10_000
    """seed of the episode (the scripts' final evaluation uses seed + 10000 too)"""
    zoom: float = 1.5
    """show the central 1/zoom of each frame's width and height (the camera tracks the body)"""


def main(args: Args):
    os.environ.setdefault("MUJOCO_GL", "egl")
    if args.labels and len(args.labels) != len(args.checkpoints):
        raise SystemExit("error: give one --labels entry per checkpoint")
    rows = []
    for row, path in enumerate(args.checkpoints):
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        script = importlib.import_module(ckpt["script"])
        settings = script.saved_args(ckpt)  # a robot's actor reads its state columns only
        agent = script.Agent(ckpt["obs_dim"], ckpt["act_dim"], settings, ckpt.get("actor_dim"))
        agent.load_state_dict(ckpt["agent"])
        run = os.path.basename(os.path.dirname(os.path.abspath(path)))
        seed = args.seed - script.EVAL_SEED_OFFSET  # evaluate() adds it
        settings = dataclasses.replace(settings, eval_episodes=1, seed=seed)
        (episode,), video = script.evaluate(agent, settings, args.video_dir, run)
        episode_return = episode["return"]
        frames = iio.imread(video)
        fps = iio.immeta(video).get("fps", 30)
        last = min(len(frames) - 1, int(args.seconds * fps))
        picks = np.linspace(0, last, args.frames).round().astype(int)
        name = f"{ckpt['script']}.py, seed {ckpt['args']['seed']}"
        if args.labels:
            name = args.labels[row]
        label = f"{name}: return {episode_return:.0f}"
        height, width = frames.shape[1:3]
        top, left = int(height * (1 - 1 / args.zoom) / 2), int(width * (1 - 1 / args.zoom) / 2)
        crops = [frames[i][top : height - top, left : width - left] for i in picks]
        rows.append((label, crops, picks / fps))
        print(f"{video}: {len(frames)} frames, return {episode_return:.1f}")
    fig, axes = plt.subplots(len(rows), args.frames, figsize=(2.2 * args.frames, 2.4 * len(rows)))
    axes = np.atleast_2d(axes)
    for r, (label, frames, times) in enumerate(rows):
        for c, frame in enumerate(frames):
            axes[r, c].imshow(frame)
            axes[r, c].set_xticks([])
            axes[r, c].set_yticks([])
            axes[r, c].set_xlabel(f"{times[c]:.1f} s", fontsize=8)
        axes[r, 0].set_title(label, fontsize=10, loc="left")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    fig.savefig(args.output, dpi=90)
    print("wrote", args.output)


if __name__ == "__main__":
    main(tyro.cli(Args))
