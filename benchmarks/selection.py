"""The selections of benchmarks/README.md, from results.csv: per selection, the selection table
(each candidate on the selection seeds) and the held-out table (the winner on the held-out seeds,
beside today's defaults on the seeds they ran outside the selection).

    python benchmarks/selection.py            # print the tables
    python benchmarks/selection.py --readme   # also replace them in benchmarks/README.md

The rule, fixed before the runs: per task, the mean deterministic eval return over the selection
seeds divided by the best peer's number; the score is the mean of the four ratios; a candidate is
eligible only if no task's mean is more than 10 % below today's defaults on the same seeds; the
winner is the eligible candidate with the best score, if that beats today's defaults' score by
the selection's margin.
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
SELECTIONS = {
    "defaults": {  # defaults that beat the best published PPO (candidates A, B, C)
        "candidates": {
            "defaults": "",
            "A": "--critic-learning-rate 0.001",
            "B": "--critic-learning-rate 0.001 --critic-layers 256 256",
            "C": "--critic-learning-rate 0.001 --num-minibatches 32",
        },
        "seeds": [1, 2],
        "held_out": [11, 12, 13],
        "winner": "B",
        "margin": 0.0,
        "today_seeds": [3, 4, 5, 11, 12, 13],  # today's defaults outside the selection
        "markers": ("selection-table", "held-out-table"),
        "frozen": True,  # decided: --readme leaves its tables as they were when it was
    },
    "levers": {  # issue #32: recompute the advantages (R), normalize the value targets (V)
        "candidates": {
            "defaults": "",
            "R": "--recompute-advantages",
            "V": "--norm-value",
            "R+V": "--recompute-advantages --norm-value",
        },
        "seeds": [1, 2, 3],
        "held_out": [11, 12, 13, 14, 15],
        "winner": "",  # by the rule: none ("": decided, no winner; None: not yet decided)
        "margin": 0.05,
        "today_seeds": [11, 12, 13, 14, 15],  # the winner against today on the same seeds
        "markers": ("levers-table", "levers-held-out-table"),
        "frozen": False,
        "confirm": True,  # holds: mean winner / today above 1, no task more than 10 % below
    },
}


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


def selection_table(rows: list[dict], selection: dict) -> str:
    seeds = selection["seeds"]
    today = {env: evals(rows, env, "", seeds) for env in TASKS}
    listed = ", ".join(map(str, seeds))
    lines = [
        "| candidate | "
        + " | ".join(f"{env} eval (seeds {listed})" for env in TASKS)
        + " | mean eval / peer | eligible |",
        "|---|" + "---|" * (len(TASKS) + 2),
    ]
    scores = {}
    for name, flags in selection["candidates"].items():
        cells, ratios, eligible = [], [], "yes"
        for env in TASKS:
            found = evals(rows, env, flags, seeds)
            values = ", ".join(f"{found[seed]:.0f}" for seed in sorted(found)) or "not run"
            if len(found) < len(seeds) or len(today[env]) < len(seeds):
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
        scores[name] = (np.mean(ratios) if len(ratios) == len(TASKS) else None, eligible)
    return "\n".join(lines) + "\n\n" + verdict(scores, selection["margin"])


def verdict(scores: dict, margin: float) -> str:
    """The rule's winner: the eligible candidate of the best score, if it beats today's defaults'
    score by the margin; no verdict while a run is missing that could still decide it (a
    candidate already more than 10 % below today on a task cannot win, whatever its other runs)."""
    if any(ok == "–" for _, ok in scores.values()):
        return "By the rule: no verdict until every selection run is in."
    today = scores.pop("defaults")[0]
    eligible = {name: score for name, (score, ok) in scores.items() if ok == "yes"}
    if not eligible:
        return "By the rule: no candidate is eligible; the defaults stay."
    best = max(eligible, key=eligible.get)
    if eligible[best] < (1.0 + margin) * today:
        best_score = f"{best} ({eligible[best]:.3f})"
        return (f"By the rule: the best eligible candidate, {best_score}, is not {margin:.0%} "
                f"above today's defaults ({today:.3f}); the defaults stay.")  # fmt: skip
    return f"By the rule: {best} wins ({eligible[best]:.3f} against today's {today:.3f})."


def held_out_table(rows: list[dict], selection: dict) -> str:
    """The winner on the held-out seeds, beside today's defaults on every seed they ran outside
    the selection (both are free of the selection's luck)."""
    if selection["winner"] is None:
        return "No winner yet: the selection runs are not all in."
    if not selection["winner"]:
        return "No winner by the rule: the defaults stay, and there is nothing to hold out."
    held_out, others = selection["held_out"], selection["today_seeds"]
    lines = [
        f"| task | winner's eval (seeds {', '.join(map(str, held_out))}) | mean | best peer "
        f"| mean / peer | today's defaults (seeds {', '.join(map(str, others))}) | mean "
        "| winner / today |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for env in TASKS:
        flags = selection["candidates"][selection["winner"]]
        found = evals(rows, env, flags, held_out)
        today = evals(rows, env, "", others)
        values = ", ".join(f"{found[seed]:.0f}" for seed in sorted(found)) or "not run yet"
        cells, mean = [env, values, "–", str(PEER[env]), "–"], None
        if len(found) == len(held_out):
            mean = np.mean(list(found.values()))
            cells[2], cells[4] = f"{mean:.0f}", f"{mean / PEER[env]:.2f}"
        if today:
            listed = ", ".join(f"{today[seed]:.0f} (seed {seed})" for seed in sorted(today))
            today_mean = np.mean(list(today.values()))
            ratio = f"{mean / today_mean:.2f}" if mean is not None else "–"
            cells += [listed, f"{today_mean:.0f}", ratio]
            if mean is not None and len(today) == len(others):
                ratios.append(mean / today_mean)
        else:
            cells += ["not run", "–", "–"]
        lines.append("| " + " | ".join(cells) + " |")
    if selection.get("confirm"):
        lines += ["", confirmation(selection["winner"], ratios)]
    return "\n".join(lines)


def confirmation(winner: str, ratios: list[float]) -> str:
    """The held-out rule: the winner holds if its mean ratio to today's defaults over the four
    tasks is above 1 and no task's ratio is below 0.9; no verdict while a run is missing."""
    if len(ratios) < len(TASKS):
        return "By the rule: no verdict until every held-out run is in."
    mean, lowest = np.mean(ratios), min(ratios)
    holds = mean > 1.0 and lowest >= 0.9
    word = "holds" if holds else "does not hold"
    return f"By the rule: {winner} {word} (winner / today: mean {mean:.2f}, lowest {lowest:.2f})."


def main(args: Args):
    with open(args.results) as f:
        rows = list(csv.DictReader(f))
    tables = {}
    for name, selection in SELECTIONS.items():
        first, second = selection_table(rows, selection), held_out_table(rows, selection)
        print(f"{name}:\n{first}\n\n{second}\n")
        if not selection["frozen"]:
            tables[selection["markers"][0]], tables[selection["markers"][1]] = first, second
    if args.readme:
        path = os.path.join(HERE, "README.md")
        text = open(path).read()
        for marker, table in tables.items():
            text = replace_between(text, marker, table, "benchmarks/README.md")
        open(path, "w").write(text)
        print("updated benchmarks/README.md")


if __name__ == "__main__":
    main(tyro.cli(Args))
