"""The defaults selection of benchmarks/README.md, from results.csv: the selection table (seeds 1
and 2 of each candidate) and the held-out table (the winner on seeds 11-13, beside today's
defaults on the seeds they ran outside the selection).

    python benchmarks/selection.py            # print both tables
    python benchmarks/selection.py --readme   # also replace them in benchmarks/README.md

The rule, fixed before the runs: per task, the mean deterministic eval return over the two seeds
divided by the best peer's number; the score is the mean of the four ratios; a candidate is
eligible only if no task's mean is more than 10 % below today's defaults on the same seeds.
"""

import csv
import os
from dataclasses import dataclass

import numpy as np
import tyro
from report import replace_between  # benchmarks/report.py

HERE = os.path.dirname(os.path.abspath(__file__))
TASKS = ["Hopper-v5", "Walker2d-v5", "HalfCheetah-v5", "Ant-v5"]
PEER = {"Hopper-v5": 2609, "Walker2d-v5": 3588, "HalfCheetah-v5": 5819, "Ant-v5": 3258}
CANDIDATES = {
    "defaults": "",
    "A": "--critic-learning-rate 0.001",
    "B": "--critic-learning-rate 0.001 --critic-layers 256 256",
    "C": "--critic-learning-rate 0.001 --num-minibatches 32",
}
WINNER = "B"
SELECTION_SEEDS, HELD_OUT_SEEDS = [1, 2], [11, 12, 13]
OTHER_SEEDS = [3, 4, 5, 11, 12, 13]  # today's defaults outside the selection
MARKERS = {"selection": "selection-table", "held_out": "held-out-table"}


@dataclass
class Args:
    results: str = os.path.join(HERE, "results.csv")
    """rows written by run.py"""
    readme: bool = False
    """replace the tables between their markers in benchmarks/README.md"""


def evals(rows: list[dict], env_id: str, flags: str, seeds: list[int]) -> dict[int, float]:
    """seed -> eval return of ppo_continuous.py's 1M-step runs (the last run of a seed wins)."""
    found = {}
    for row in rows:
        if row["script"] != "ppo_continuous.py" or row["total_timesteps"] != "1000000":
            continue
        if row["env_id"] == env_id and row["flags"] == flags and int(row["seed"]) in seeds:
            found[int(row["seed"])] = float(row["eval_return"])
    return found


def selection_table(rows: list[dict]) -> str:
    today = {env: evals(rows, env, "", SELECTION_SEEDS) for env in TASKS}
    lines = [
        "| candidate | "
        + " | ".join(f"{env} eval (seeds 1, 2)" for env in TASKS)
        + " | mean eval / peer | eligible |",
        "|---|" + "---|" * (len(TASKS) + 2),
    ]
    for name, flags in CANDIDATES.items():
        cells, ratios, eligible = [], [], "yes"
        for env in TASKS:
            found = evals(rows, env, flags, SELECTION_SEEDS)
            values = ", ".join(f"{found[seed]:.0f}" for seed in sorted(found)) or "not run"
            if len(found) < len(SELECTION_SEEDS):
                cells.append(values)
                eligible = "–" if eligible == "yes" else eligible
                continue
            mean = np.mean(list(found.values()))
            ratios.append(mean / PEER[env])
            if mean < 0.9 * np.mean(list(today[env].values())):
                eligible = "no"
            cells.append(f"{values} → {mean:.0f} ({mean / PEER[env]:.2f})")
        score = f"{np.mean(ratios):.3f}" if len(ratios) == len(TASKS) else "–"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {score} | {eligible} |")
    return "\n".join(lines)


def held_out_table(rows: list[dict]) -> str:
    """The winner on the held-out seeds, beside today's defaults on every seed they ran outside
    the selection (both are free of the selection's luck)."""
    lines = [
        "| task | winner's eval (seeds 11, 12, 13) | mean | best peer | mean / peer "
        "| today's defaults off seeds 1-2 | mean | winner / today |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for env in TASKS:
        found = evals(rows, env, CANDIDATES[WINNER], HELD_OUT_SEEDS)
        today = evals(rows, env, "", OTHER_SEEDS)
        values = ", ".join(f"{found[seed]:.0f}" for seed in sorted(found)) or "not run yet"
        cells, mean = [env, values, "–", str(PEER[env]), "–"], None
        if len(found) == len(HELD_OUT_SEEDS):
            mean = np.mean(list(found.values()))
            cells[2], cells[4] = f"{mean:.0f}", f"{mean / PEER[env]:.2f}"
        if today:
            listed = ", ".join(f"{today[seed]:.0f} (seed {seed})" for seed in sorted(today))
            today_mean = np.mean(list(today.values()))
            ratio = f"{mean / today_mean:.2f}" if mean is not None else "–"
            cells += [listed, f"{today_mean:.0f}", ratio]
        else:
            cells += ["not run", "–", "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(args: Args):
    with open(args.results) as f:
        rows = list(csv.DictReader(f))
    tables = {"selection": selection_table(rows), "held_out": held_out_table(rows)}
    print(tables["selection"] + "\n\n" + tables["held_out"])
    if args.readme:
        path = os.path.join(HERE, "README.md")
        text = open(path).read()
        for name, table in tables.items():
            text = replace_between(text, MARKERS[name], table, "benchmarks/README.md")
        open(path, "w").write(text)
        print("updated benchmarks/README.md")


if __name__ == "__main__":
    main(tyro.cli(Args))
