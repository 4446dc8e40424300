"""How the batch shape (envs x steps per env) changes the training speed of the robot recipe, and
the update's share of an iteration: each shape trains in its own process, the shapes in turn,
A B C A B C, so that they see the same machine load.

    python benchmarks/batch_shape.py                       # the Go1 recipe, 4 shapes, 2 rounds

Each run trains --total-timesteps steps with the README's robot flags (--num-envs and --num-steps
set by the shape) and reports the SPS it logs (charts/SPS: the rollouts and the updates, without
start-up and evaluation) and the share of that time spent in ppo_update (timed around it). Rows go
to benchmarks/batch_shape.csv; the table prints each shape's median over the rounds.
"""

import datetime
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import tyro
from run import ROOT, append_rows, scalars  # benchmarks/run.py: this folder is on sys.path

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPE = ["--env-backend", "envpool", "--gamma", "0.97", "--update-epochs", "5"]
RECIPE += ["--actor-layers", "256", "128", "--critic-layers", "256", "128", "--init-logstd", "-1"]
RECIPE += ["--ent-coef", "0.01", "--bounds-loss-coef", "1.0", "--command-curriculum"]

# The script's own train(), with its ppo_update timed. The seconds of every update but the first go
# to the last line of stdout: charts/SPS, too, leaves out the first iteration (warm-up).
DRIVER = """
import importlib, sys, time
script = importlib.import_module(sys.argv[1])
update, spent = script.ppo_update, []
def timed_update(*args, **kwargs):
    start = time.perf_counter()
    try:
        return update(*args, **kwargs)
    finally:
        spent.append(time.perf_counter() - start)
script.ppo_update = timed_update
script.train(script.parse_args(sys.argv[2:]))
print(f"update seconds {sum(spent[1:])}")
"""


@dataclass
class Args:
    script: str = "ppo_continuous.py"
    """the script to time"""
    env_id: str = "Go1JoystickFlatTerrain-v1"
    """environment"""
    shapes: tuple[str, ...] = ("32x128", "128x32", "64x128", "128x128")
    """batch shapes, num_envs x num_steps (the first: the recipe's)"""
    total_timesteps: int = 131_072
    """env steps of each run (a multiple of every shape's batch keeps the runs equally long)"""
    rounds: int = 2
    """how many times each shape runs, in turn"""
    recipe: bool = True
    """train with the README's robot flags (off: the script's defaults, e.g. a gymnasium task)"""
    output: str = os.path.join(HERE, "batch_shape.csv")
    """CSV file the rows are appended to"""


def parse_shape(shape: str) -> tuple[int, int]:
    envs, _, steps = shape.partition("x")
    if not (envs.isdigit() and steps.isdigit() and int(envs) > 0 and int(steps) > 0):
        raise SystemExit(f"error: --shapes wants envs x steps such as 32x128, got {shape!r}")
    return int(envs), int(steps)


def measure(args: Args, num_envs: int, num_steps: int) -> tuple[float, float]:
    """One training run of this shape: (its SPS, the update's share of its training time)."""
    with tempfile.TemporaryDirectory() as log_dir:
        command = [sys.executable, "-c", DRIVER, args.script[:-3], "--env-id", args.env_id]
        command += [*(RECIPE if args.recipe else []), "--num-envs", str(num_envs)]
        command += ["--num-steps", str(num_steps), "--total-timesteps", str(args.total_timesteps)]
        command += ["--log-dir", log_dir, "--eval-episodes", "1"]
        env = {**os.environ, "PYTHONPATH": ROOT}
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"error: {num_envs}x{num_steps} failed: {done.stderr.strip()[-500:]}")
        update_seconds = float(done.stdout.strip().splitlines()[-1].split()[-1])
        (run,) = os.listdir(log_dir)
        step, sps = scalars(os.path.join(log_dir, run), "charts/SPS")[-1]
        return sps, update_seconds / ((step - num_envs * num_steps) / sps)  # after iteration 1


def main(args: Args):
    shapes = [parse_shape(shape) for shape in args.shapes]
    results = {shape: [] for shape in shapes}
    for round_ in range(1, args.rounds + 1):
        for num_envs, num_steps in shapes:
            sps, share = measure(args, num_envs, num_steps)
            results[(num_envs, num_steps)].append((sps, share))
            row = {"script": args.script, "env_id": args.env_id, "num_envs": num_envs}
            row.update(num_steps=num_steps, batch=num_envs * num_steps, round=round_)
            row.update(sps=round(sps), update_share=round(share, 3))
            append_rows(args.output, [{**row, "date": datetime.date.today().isoformat()}])
            print(row, flush=True)
    first = statistics.median(sps for sps, _ in results[shapes[0]])
    print(f"\n{args.script} on {args.env_id}, {args.total_timesteps:,} steps a run, medians of "
          f"{args.rounds} rounds\n\n| envs x steps | batch | SPS | SPS / first shape's "
          "| update's share |\n|---|---|---|---|---|")  # fmt: skip
    for (num_envs, num_steps), measured in results.items():
        sps = statistics.median(sps for sps, _ in measured)
        share = statistics.median(share for _, share in measured)
        print(f"| {num_envs} x {num_steps} | {num_envs * num_steps} | {sps:.0f} "
              f"| {sps / first:.2f} | {share:.0%} |")  # fmt: skip


if __name__ == "__main__":
    main(tyro.cli(Args))
