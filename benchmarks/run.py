r"""Run benchmark training jobs one after another and append one row per finished run to
results.csv.

Every row is what a real run printed to its TensorBoard log, never an estimate. Rerunning appends.

    python benchmarks/run.py --scripts ppo_continuous.py \
        --env-ids Hopper-v5 HalfCheetah-v5 --seeds 1 2
    python benchmarks/run.py --scripts ppo_ddp.py --nproc 2 --env-ids Hopper-v5
    python benchmarks/run.py --scripts ppo_spo.py --flags="--actor-layers 64 64"

Runs go one at a time (on a 2-core machine parallel runs would distort each other's speed).
Learning curves (return vs env steps) are appended to curves.csv beside results.csv for report.py.
"""

import csv
import datetime
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import tyro
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
COLUMNS = [
    "script",
    "env_id",
    "seed",
    "total_timesteps",
    "flags",
    "final_return",
    "eval_return",
    "max_eval_return",
    "sps",
    "wall_seconds",
    "date",
]


@dataclass
class Args:
    scripts: tuple[str, ...] = ("ppo_continuous.py",)
    """training scripts to run (file names in the repository root)"""
    env_ids: tuple[str, ...] = ("Hopper-v5",)
    """environments"""
    seeds: tuple[int, ...] = (1,)
    """seeds; every (script, env, seed) combination is one run"""
    total_timesteps: int = 1_000_000
    """env steps per run (over all envs and processes)"""
    flags: str = ""
    """extra flags passed to every script, written with "=": --flags="--num-envs 16" """
    eval_every: int = 25
    """--eval-every of every run: a deterministic evaluation every N iterations (25: every 51,200
    steps at the defaults), whose best is max_eval_return; it leaves training unchanged (0: off)"""
    nproc: int = 2
    """processes per run for ppo_ddp.py (started with torchrun)"""
    results: str = os.path.join(HERE, "results.csv")
    """CSV file the rows are appended to"""
    log_dir: str = os.path.join(HERE, "runs")
    """where the runs write their TensorBoard logs and checkpoints"""


def scalars(run_dir: str, tag: str) -> list[tuple[int, float]]:
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0}).Reload()
    if tag not in events.Tags()["scalars"]:
        return []
    return [(e.step, e.value) for e in events.Scalars(tag)]


def launcher(script: str, nproc: int) -> list[str]:
    """How a script starts: python, or torchrun with nproc ranks for ppo_ddp.py; then its path."""
    if script != "ppo_ddp.py":
        return [sys.executable, os.path.join(ROOT, script)]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*torchrun, f"--nproc_per_node={nproc}", os.path.join(ROOT, script)]


def command(args: Args, script: str, env_id: str, seed: int) -> list[str]:
    return [
        *launcher(script, args.nproc),
        "--env-id",
        env_id,
        "--seed",
        str(seed),
        "--total-timesteps",
        str(args.total_timesteps),
        "--log-dir",
        args.log_dir,
        "--exp-name",
        f"bench_{script[:-3]}",
        "--eval-every",
        str(args.eval_every),
        *shlex.split(args.flags),
    ]


def run_one(args: Args, script: str, env_id: str, seed: int) -> dict:
    before = set(os.listdir(args.log_dir)) if os.path.isdir(args.log_dir) else set()
    cmd = command(args, script, env_id, seed)
    print("$", shlex.join(cmd), flush=True)
    start = time.time()
    subprocess.run(cmd, check=True, cwd=ROOT)
    wall = time.time() - start
    (run_name,) = set(os.listdir(args.log_dir)) - before
    run_dir = os.path.join(args.log_dir, run_name)
    returns = scalars(run_dir, "charts/episodic_return")
    evals = scalars(run_dir, "eval/episodic_return")
    # The best deterministic evaluation over training, the final one included (Tianshou's metric).
    periodic = scalars(run_dir, "eval/periodic_return")
    best = max(v for _, v in periodic + evals) if periodic else ""
    sps = scalars(run_dir, "charts/SPS")
    flags = args.flags + (f" --nproc {args.nproc}" if script == "ppo_ddp.py" else "")
    row = {
        "script": script,
        "env_id": env_id,
        "seed": seed,
        "total_timesteps": args.total_timesteps,
        "flags": flags.strip(),
        "final_return": round(float(np.mean([v for _, v in returns[-10:]])), 2),
        "eval_return": round(evals[-1][1], 2) if evals else "",
        "max_eval_return": round(best, 2) if periodic else "",
        "sps": round(sps[-1][1]) if sps else "",
        "wall_seconds": round(wall),
        "date": datetime.date.today().isoformat(),
    }
    curves = os.path.join(os.path.dirname(args.results), "curves.csv")
    new_curves = not os.path.exists(curves)
    with open(curves, "a", newline="") as f:
        writer = csv.writer(f)
        if new_curves:
            writer.writerow(["script", "env_id", "seed", "flags", "step", "episodic_return"])
        # Downsampled to 100 points: the mean return of the episodes that ended in each 1 % of the
        # run.
        bins = np.linspace(0, args.total_timesteps, 101)
        steps, values = np.array([s for s, _ in returns]), np.array([v for _, v in returns])
        for lo, hi in zip(bins[:-1], bins[1:]):
            inside = (steps > lo) & (steps <= hi)
            if inside.any():
                writer.writerow(
                    [
                        script,
                        env_id,
                        seed,
                        row["flags"],
                        int(hi),
                        round(float(values[inside].mean()), 2),
                    ]
                )
    return row


def append_rows(path: str, rows: list[dict]):
    """Append rows to a CSV file, writing the header first if the file is new."""
    new_file = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new_file:
            writer.writeheader()
        writer.writerows(rows)


def main(args: Args):
    for script in args.scripts:
        if not os.path.isfile(os.path.join(ROOT, script)):
            raise SystemExit(f"error: no script {script} in {ROOT}")
    for script in args.scripts:
        for env_id in args.env_ids:
            for seed in args.seeds:
                row = run_one(args, script, env_id, seed)
                append_rows(args.results, [{key: row[key] for key in COLUMNS}])
                print("recorded:", row, flush=True)


if __name__ == "__main__":
    main(tyro.cli(Args))
