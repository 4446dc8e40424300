"""Are two sets of recorded runs level? Per task, the mean of each, their ratio and the exact
two-sided permutation p-value of the difference in means (every split of the pooled runs into
groups of the same sizes; no normal assumption, which 3 seeds could not support).

    python benchmarks/level.py --b-flags="--env-backend envpool"              # EnvPool vs gymnasium
    python benchmarks/level.py --b-csv benchmarks/lean/results.csv --a-seeds 1 2 3   # a rerun

A p-value at or above 0.05 says the runs do not tell the two apart at that level: with 3 seeds a
side only a large difference could show, so the ratio is printed beside it.
"""

import csv
import itertools
import os
from dataclasses import dataclass

import numpy as np
import tyro

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class Args:
    a_csv: str = os.path.join(HERE, "results.csv")
    """the first set's CSV (results.csv's columns)"""
    a_flags: str = ""
    """the first set's flags ("": the defaults)"""
    a_seeds: tuple[int, ...] = ()
    """only these seeds of the first set (none: all)"""
    b_csv: str = os.path.join(HERE, "results.csv")
    """the second set's CSV"""
    b_flags: str = ""
    """the second set's flags"""
    script: str = "ppo_continuous.py"
    total_timesteps: int = 1_000_000
    env_ids: tuple[str, ...] = ("Hopper-v5", "Walker2d-v5", "HalfCheetah-v5", "Ant-v5")
    metrics: tuple[str, ...] = ("final_return", "eval_return")


def runs(path: str, flags: str, script: str, steps: int, env_id: str, seeds=()) -> list[dict]:
    with open(path) as f:
        rows = list(csv.DictReader(f))
    chosen = [
        row
        for row in rows
        if (row["script"], row["flags"], int(row["total_timesteps"]), row["env_id"])
        == (script, flags, steps, env_id)
        and (not seeds or int(row["seed"]) in seeds)
    ]
    return sorted(chosen, key=lambda row: int(row["seed"]))


def permutation_p(a: list[float], b: list[float]) -> float:
    """The share of all splits of a + b into groups of len(a) and len(b) whose difference in
    means is at least as large (in size) as the observed one."""
    pooled, observed = np.array(a + b), abs(np.mean(a) - np.mean(b))
    total, extreme = 0, 0
    for chosen in itertools.combinations(range(len(pooled)), len(a)):
        mask = np.zeros(len(pooled), dtype=bool)
        mask[list(chosen)] = True
        total += 1
        extreme += abs(pooled[mask].mean() - pooled[~mask].mean()) >= observed - 1e-9
    return extreme / total


def main(args: Args):
    print(f"A: {args.a_csv} flags '{args.a_flags}'; B: {args.b_csv} flags '{args.b_flags}'")
    print("\n| task | metric | A (seeds) | B (seeds) | B / A | p (permutation) |")
    print("|---|---|---|---|---|---|")
    for env_id in args.env_ids:
        a_runs = runs(
            args.a_csv, args.a_flags, args.script, args.total_timesteps, env_id, args.a_seeds
        )
        b_runs = runs(args.b_csv, args.b_flags, args.script, args.total_timesteps, env_id)
        if not a_runs or not b_runs:
            continue
        for metric in args.metrics:
            a = [float(row[metric]) for row in a_runs]
            b = [float(row[metric]) for row in b_runs]
            a_seeds = ", ".join(row["seed"] for row in a_runs)
            b_seeds = ", ".join(row["seed"] for row in b_runs)
            print(
                f"| {env_id} | {metric} | {np.mean(a):.0f} ± {np.std(a):.0f} ({a_seeds}) "
                f"| {np.mean(b):.0f} ± {np.std(b):.0f} ({b_seeds}) | {np.mean(b) / np.mean(a):.2f} "
                f"| {permutation_p(a, b):.2f} |"
            )


if __name__ == "__main__":
    main(tyro.cli(Args))
