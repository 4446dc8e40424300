"""Turn results.csv into the README's results table and curves.csv into learning-curve plots.

    pip install -r benchmarks/requirements.txt
    python benchmarks/report.py             # print the tables, write benchmarks/plots/*.png
    python benchmarks/report.py --readme    # also replace the table in README.md

The tables have one row per (script, env, flags): mean ± std over seeds of the final training return
(mean of the last 10 episodes), of the deterministic evaluation of the final policy and of the best
deterministic evaluation over training (max_eval_return), and the mean SPS. Runs at the
scripts' default settings come first, beside the published PPO numbers of CleanRL, SB3 rl-zoo and
Tianshou for the task (PEERS: each measures its own way); runs with changed flags follow in a second
table.
"""

import csv
import os
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import tyro

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class Args:
    results: str = os.path.join(HERE, "results.csv")
    """rows written by run.py"""
    curves: str = os.path.join(HERE, "curves.csv")
    """learning curves written by run.py"""
    plots: str = os.path.join(HERE, "plots")
    """folder for the PNG plots"""
    readme: bool = False
    """replace the table between the results-table markers in README.md"""


def mean_std(values: list[float]) -> str:
    values = [v for v in values if v == v]  # drop NaN (a run without that number)
    if not values:
        return "–"
    return (
        f"{np.mean(values):.0f} ± {np.std(values):.0f}" if len(values) > 1 else f"{values[0]:.0f}"
    )


# Flags that leave a script at its default settings (ppo_ddp.py's --nproc 2 with --num-envs 4 does
# not: that is another number of envs per process).
DEFAULT_FLAGS = {""}
# The peers' published PPO numbers at 1M steps (Humanoid: the steps are said), each measured its own
# way: CleanRL's ppo_continuous_action.py, the mean training return at the end, 3 seeds, v4 tasks;
# SB3 rl-zoo's benchmark.md, one run with per-task tuned hyperparameters, deterministic, mean +- std
# over ~150 evaluation episodes, v3; Tianshou's examples/mujoco/README.md, the maximum over training
# of the mean test return (10 test episodes), mean +- std over 10 seeds, v3.
PEERS = {
    "CleanRL (v4; final return, 3 seeds)": {
        "HalfCheetah": "1442.64 ± 46.03",
        "Walker2d": "2287.95 ± 571.78",
        "Hopper": "2382.86 ± 271.74",
        "InvertedPendulum": "963.09 ± 22.20",
        "Humanoid": "716.11 ± 49.08 (at 1M steps)",
    },
    "SB3 rl-zoo (v3; tuned, eval, 1 run)": {
        "HalfCheetah": "5819.10 ± 663.53",
        "Walker2d": "3478.80 ± 821.71",
        "Hopper": "2410.44 ± 10.03",
        "Ant": "1327.16 ± 451.58",
    },
    "Tianshou (v3; max test return, 10 seeds)": {
        "HalfCheetah": "5783.9 ± 1244.0",
        "Walker2d": "3588.5 ± 756.6",
        "Hopper": "2609.3 ± 700.8",
        "Ant": "3258.4 ± 1079.3",
        "Humanoid": "1359.7 ± 572.7 (at 3M steps)",
    },
}


# Each of our return columns measures as one peer does: the final training return as CleanRL, the
# deterministic evaluation of the final policy as SB3 rl-zoo, the best periodic evaluation over
# training (benchmarks/run.py's --eval-every) as Tianshou.
HEADER = (
    "env | script | flags | steps | seeds | final return (as CleanRL) | eval return (as SB3) "
    "| max eval return (as Tianshou) | SPS"
)


def best_eval(values: list[float]) -> str:
    """mean ± std of max_eval_return, and how many of the row's runs had periodic evaluations
    (runs recorded before the column existed have none)."""
    found = sum(v == v for v in values)
    if 0 < found < len(values):
        return f"{mean_std(values)} ({found} of {len(values)} runs)"
    return mean_std(values)


def seed_list(runs: list[dict]) -> str:
    """The seeds of a row, each as often as it ran (appo_vtrace.py is not bit-reproducible)."""
    return ", ".join(str(seed) for seed in sorted(int(run["seed"]) for run in runs))


def table(rows: list[dict]) -> str:
    """Two tables: the scripts at their default settings beside the peers, then every run with
    changed flags."""
    groups = defaultdict(list)
    for row in rows:
        groups[(row["env_id"], row["script"], row["flags"], row["total_timesteps"])].append(row)
    defaults = [
        "**Default settings**",
        "",
        f"| {HEADER} | " + " | ".join(PEERS) + " |",
        "|---|---|---|---|---|---|---|---|---|" + "---|" * len(PEERS),
    ]
    experiments = []
    for (env_id, script, flags, steps), runs in sorted(groups.items()):
        number = lambda key, runs=runs: [  # noqa: E731
            float(r[key]) if r[key] != "" else float("nan") for r in runs
        ]
        sps = [v for v in number("sps") if v == v]  # a run without its SPS (paused, or older)
        sps = f"{np.mean(sps):.0f}" if sps else "–"
        line = (
            f"| {env_id} | `{script}` | {f'`{flags}`' if flags else ''} | {int(steps):,} "
            f"| {seed_list(runs)} | {mean_std(number('final_return'))} "
            f"| {mean_std(number('eval_return'))} | {best_eval(number('max_eval_return'))} "
            f"| {sps} |"
        )
        if flags in DEFAULT_FLAGS:
            task = env_id.split("-v")[0]
            peers = [numbers.get(task, "–") for numbers in PEERS.values()]
            defaults.append(line + " " + " | ".join(peers) + " |")
        else:
            experiments.append(line)
    if experiments:
        defaults += [
            "",
            "**Experiments** (flags changed: tuning, stress tests, the EnvPool backend)",
            "",
            f"| {HEADER} |",
            "|---|---|---|---|---|---|---|---|---|",
            *experiments,
        ]
    return "\n".join(defaults)


def plot(curves: list[dict], folder: str):
    """{env}.png: the runs at default settings; {env}-all.png: every run, experiments included."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # env -> (script, flags) -> seed -> [(step, ret)]
    by_env = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for row in curves:
        by_env[row["env_id"]][row["script"], row["flags"]][row["seed"]].append(
            (int(row["step"]), float(row["episodic_return"]))
        )
    os.makedirs(folder, exist_ok=True)
    for env_id, lines in sorted(by_env.items()):
        for suffix, keep in (
            ("", lambda flags: flags in DEFAULT_FLAGS),
            ("-all", lambda flags: True),
        ):
            fig, ax = plt.subplots(figsize=(7, 4.5))
            for (script, flags), seeds in sorted(lines.items()):
                if not keep(flags):
                    continue
                grid = np.linspace(0, max(s for points in seeds.values() for s, _ in points), 100)
                interpolated = np.array(
                    [np.interp(grid, *zip(*sorted(points))) for points in seeds.values()]
                )
                label = (
                    f"{script}{' ' + flags if flags else ''} "
                    f"({len(seeds)} seed{'s' if len(seeds) > 1 else ''})"
                )
                (line,) = ax.plot(grid, interpolated.mean(0), label=label)
                if len(seeds) > 1:  # shaded: the range over the seeds
                    ax.fill_between(
                        grid,
                        interpolated.min(0),
                        interpolated.max(0),
                        color=line.get_color(),
                        alpha=0.2,
                    )
            ax.set(
                title=env_id + (" (all runs)" if suffix else ""),
                xlabel="environment steps",
                ylabel="episodic return (training)",
            )
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
            fig.tight_layout()
            fig.savefig(os.path.join(folder, f"{env_id}{suffix}.png"), dpi=100)
            plt.close(fig)
            print("wrote", os.path.join(folder, f"{env_id}{suffix}.png"))


# Which of our columns is like-for-like with which peer, and at how many steps each peer measured.
LIKE_FOR_LIKE = [
    ("final_return", "CleanRL (v4; final return, 3 seeds)", "final return vs CleanRL"),
    ("eval_return", "SB3 rl-zoo (v3; tuned, eval, 1 run)", "eval return vs SB3 rl-zoo"),
    ("max_eval_return", "Tianshou (v3; max test return, 10 seeds)", "max eval return vs Tianshou"),
]
PEER_STEPS = {"CleanRL (v4; final return, 3 seeds)": {"Humanoid": 1_000_000}}


def standing_cell(runs: list[dict], key: str, peer: str, task: str, steps: int) -> str:
    """Our mean on the peer's own metric against the peer's number: ahead or behind, and the
    ratio. Where a run has no max_eval_return (recorded before periodic evaluation), its final
    eval bounds it from below (the last evaluation is the final one): if the mean of these bounds
    is above the peer, so is the mean max; otherwise only the runs that have it are compared."""
    published = PEERS[peer].get(task)
    if published is None or PEER_STEPS.get(peer, {}).get(task, steps) != steps:
        return "–"
    theirs = float(published.split()[0])
    values = [float(r[key]) for r in runs if r[key] != ""]
    note = ""
    if key == "max_eval_return" and len(values) < len(runs):
        bounds = [float(r[key] or r["eval_return"]) for r in runs]
        if np.mean(bounds) > theirs:
            values, note = bounds, " (a lower bound)"
        elif values:
            note = f" ({len(values)} of {len(runs)} runs)"
        else:
            return "not measured"
    ours = float(np.mean(values))
    word = "ahead" if ours > theirs else "behind"
    return f"{word}: {ours:.0f}{note} vs {theirs:.0f} ({ours / theirs:.2f}x)"


def standing(rows: list[dict], script: str = "ppo_continuous.py") -> str:
    """Per task, the script's default runs on each peer's own metric against that peer."""
    lines = [
        "| task | steps | " + " | ".join(name for _, _, name in LIKE_FOR_LIKE) + " |",
        "|---|---|" + "---|" * len(LIKE_FOR_LIKE),
    ]
    groups = defaultdict(list)
    for row in rows:
        if row["script"] == script and row["flags"] in DEFAULT_FLAGS:
            groups[(row["env_id"], int(row["total_timesteps"]))].append(row)
    for (env_id, steps), runs in sorted(groups.items()):
        task = env_id.split("-v")[0]
        cells = [standing_cell(runs, key, peer, task, steps) for key, peer, _ in LIKE_FOR_LIKE]
        lines.append(f"| {env_id} | {steps:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def replace_between(text: str, marker: str, table: str, file: str) -> str:
    """text with the table between <!-- marker:begin --> and <!-- marker:end --> replaced."""
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    if begin not in text or end not in text:
        raise SystemExit(f"error: {file} has no {begin} ... {end} markers")
    head, rest = text.split(begin, 1)
    return head + begin + "\n" + table + "\n" + end + rest.split(end, 1)[1]


def main(args: Args):
    with open(args.results) as f:
        rows = list(csv.DictReader(f))
    text, ahead = table(rows), standing(rows)
    print(text + "\n\n" + ahead)
    if os.path.exists(args.curves):
        with open(args.curves) as f:
            plot(list(csv.DictReader(f)), args.plots)
    if args.readme:
        path = os.path.join(os.path.dirname(HERE), "README.md")
        readme = replace_between(open(path).read(), "results-table", text, "README.md")
        readme = replace_between(readme, "standing-table", ahead, "README.md")
        open(path, "w").write(readme)
        print("updated README.md")


if __name__ == "__main__":
    main(tyro.cli(Args))
