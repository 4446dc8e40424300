"""EnvPool's num_threads on the robot tasks (#43): does a second thread pay where the physics is
heavier than Hopper's? Measured in one run, A B A B, so that both settings see the same load:

    python benchmarks/envpool_threads.py

For each env and round, for each --threads value in turn:
- raw: the pool's env steps per second with random actions and no learning (--num-envs envs);
- train: the SPS that ppo_continuous.py reports for --iterations iterations of the robot recipe
  (32 envs x 128 steps, 5 epochs, 256-128 networks), its pool made with that many threads (the
  scripts make theirs with two since this measurement; a child process patches
  envpool.make_gymnasium).
Rows go to benchmarks/sps_threads.csv.
"""

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import tyro
from run import ROOT, append_rows  # benchmarks/run.py: this folder is on sys.path

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPE = dict(gamma=0.97, num_envs=32, num_steps=128, update_epochs=5, ent_coef=0.01)
RECIPE.update(actor_layers=(256, 128), critic_layers=(256, 128), init_logstd=-1.0)

# The child: ppo_continuous.train with the pool's num_threads forced; prints its metrics as JSON.
CHILD = """
import json, sys, envpool
import ppo_continuous as pc
threads, env_id, iterations, log_dir, recipe = json.loads(sys.argv[1])
make = envpool.make_gymnasium
def make_with_threads(*args, **kwargs):  # overrides the script's own num_threads
    return make(*args, **{**kwargs, "num_threads": threads})
envpool.make_gymnasium = make_with_threads
batch = recipe["num_envs"] * recipe["num_steps"]
args = pc.Args(env_id=env_id, env_backend="envpool", total_timesteps=iterations * batch,
               eval_episodes=1, checkpoint_every=0, log_dir=log_dir, **recipe)
print(json.dumps(pc.train(args)["charts/SPS"]))
"""


@dataclass
class Args:
    env_ids: tuple[str, ...] = (
        "Go1JoystickFlatTerrain-v1",
        "BerkeleyHumanoidJoystickFlatTerrain-v1",
    )
    """robot tasks to measure"""
    threads: tuple[int, ...] = (1, 2)
    """EnvPool num_threads values, measured in turn"""
    rounds: int = 2
    """A B A B: each setting this many times"""
    num_envs: int = 32
    """envs of the raw measurement (the recipe's)"""
    raw_steps: int = 20_000
    """env steps of each raw measurement"""
    iterations: int = 10
    """training iterations of each training measurement (4096 steps each)"""
    output: str = os.path.join(HERE, "sps_threads.csv")
    """CSV file the rows are appended to"""


def raw_sps(env_id: str, num_envs: int, threads: int, steps: int) -> int:
    import envpool

    pool = envpool.make_gymnasium(env_id, num_envs=num_envs, num_threads=threads, seed=0)
    pool.reset()
    rng = np.random.default_rng(0)
    shape = (num_envs, *pool.action_space.shape)
    start = time.perf_counter()
    for _ in range(steps // num_envs):
        pool.step(rng.uniform(-1.0, 1.0, shape).astype(np.float32))
    seconds = time.perf_counter() - start
    pool.close()
    return int(steps // num_envs * num_envs / seconds)


def train_sps(env_id: str, threads: int, iterations: int, log_dir: str) -> int:
    recipe = json.dumps([threads, env_id, iterations, log_dir, RECIPE])
    out = subprocess.run(
        [sys.executable, "-c", CHILD, recipe], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    return int(json.loads(out.strip().splitlines()[-1]))


def main(args: Args):
    rows = []
    with tempfile.TemporaryDirectory() as log_dir:
        for env_id in args.env_ids:
            for round_ in range(1, args.rounds + 1):
                for threads in args.threads:
                    row = {"env_id": env_id, "num_envs": args.num_envs, "num_threads": threads}
                    row["round"] = round_
                    row["raw_sps"] = raw_sps(env_id, args.num_envs, threads, args.raw_steps)
                    row["train_sps"] = train_sps(env_id, threads, args.iterations, log_dir)
                    row["date"] = datetime.date.today().isoformat()
                    print(row, flush=True)
                    rows.append(row)
    append_rows(args.output, rows)


if __name__ == "__main__":
    main(tyro.cli(Args))
