"""Training speed of each script beside the raw speed of the same vector env, measured in one run.

    python benchmarks/sps.py                       # every script on Hopper-v5
    python benchmarks/sps.py --scripts ppo_continuous.py --total-timesteps 200000

For each script: the env steps per second of its vector env (same env id, same --num-envs, sync,
random actions, no learning), then the SPS the script reports while training, and their ratio.
The two are measured back to back so that they see the same machine load. ppo_ddp.py is measured
with 1 and with 2 processes (torchrun), which also gives its scaling efficiency. Rows are appended
to benchmarks/sps.csv.
"""

import datetime
import importlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import gymnasium as gym
import tyro
from run import (  # benchmarks/run.py: this folder is on sys.path
    ROOT,
    append_rows,
    launcher,
    scalars,
)

sys.path.insert(0, ROOT)  # the scripts

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class Args:
    scripts: tuple[str, ...] = (
        "ppo_continuous.py",
        "ppo_spo.py",
        "ppo_symaug.py",
        "appo_vtrace.py",
        "ppo_ddp.py",
    )
    """scripts to measure (missing ones are skipped)"""
    env_id: str = "Hopper-v5"
    """environment"""
    total_timesteps: int = 100_000
    """env steps of each training run"""
    raw_seconds: float = 20.0
    """how long to step the raw vector env"""
    output: str = os.path.join(HERE, "sps.csv")
    """CSV file the rows are appended to"""


def raw_sps(env_id: str, num_envs: int, seconds: float) -> float:
    envs = gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )
    envs.reset(seed=0)
    envs.action_space.seed(0)
    steps, start = 0, time.time()
    while time.time() - start < seconds:
        envs.step(envs.action_space.sample())
        steps += num_envs
    envs.close()
    return steps / (time.time() - start)


def train_sps(script: str, env_id: str, total_timesteps: int, nproc: int) -> float:
    with tempfile.TemporaryDirectory() as log_dir:
        subprocess.run(
            [
                *launcher(script, nproc),
                "--env-id",
                env_id,
                "--total-timesteps",
                str(total_timesteps),
                "--log-dir",
                log_dir,
                "--eval-episodes",
                "1",
            ],
            check=True,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
        (run,) = os.listdir(log_dir)
        return scalars(os.path.join(log_dir, run), "charts/SPS")[-1][1]


def main(args: Args):
    rows = []
    for script in args.scripts:
        if not os.path.isfile(os.path.join(ROOT, script)):
            print(f"skip {script}: not found")
            continue
        defaults = importlib.import_module(script[:-3]).Args()
        # ppo_symaug.py needs a mirror map, which Hopper-v5 lacks: it is measured on its own default
        # env.
        env_id = defaults.env_id if script == "ppo_symaug.py" else args.env_id
        for nproc in (1, 2) if script == "ppo_ddp.py" else (1,):
            raw = raw_sps(env_id, defaults.num_envs, args.raw_seconds)
            trained = train_sps(script, env_id, args.total_timesteps, nproc)
            rows.append(
                {
                    "script": script,
                    "env_id": env_id,
                    "nproc": nproc,
                    "num_envs": defaults.num_envs,
                    "raw_env_sps": round(raw),
                    "train_sps": round(trained),
                    "ratio": round(trained / raw, 3),
                    "date": datetime.date.today().isoformat(),
                }
            )
            append_rows(args.output, rows[-1:])
            print(rows[-1], flush=True)
    print(
        "\n| script | env | processes | envs per process | raw vector-env SPS | training SPS "
        "| ratio |\n|---|---|---|---|---|---|---|"
    )
    for r in rows:
        print(
            f"| `{r['script']}` | {r['env_id']} | {r['nproc']} | {r['num_envs']} "
            f"| {r['raw_env_sps']} | {r['train_sps']} | {r['ratio']:.0%} |"
        )


if __name__ == "__main__":
    main(tyro.cli(Args))
