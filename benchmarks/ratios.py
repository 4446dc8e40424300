"""Probability-ratio statistics of finished runs (the SPO vs PPO comparison of README).

    python benchmarks/ratios.py --runs benchmarks/runs/HalfCheetah-v5__bench_ppo_*

For each run: the mean over all updates of mean |r - 1|, the mean and the largest of max |r - 1|,
and the mean fraction of samples outside the trust region, each measured over the last epoch of
an update (losses/ratio_dev_mean, losses/ratio_dev_max, losses/ratio_outside_frac), beside the
final return. Prints a markdown table.
"""

import glob
import os
from dataclasses import dataclass

import numpy as np
import tyro
from run import scalars  # benchmarks/run.py: this folder is on sys.path


@dataclass
class Args:
    runs: tuple[str, ...]
    """run directories (or glob patterns) written by benchmarks/run.py"""


def main(args: Args):
    print(
        "| run | mean \\|r−1\\| | max \\|r−1\\| (mean / largest) | outside trust region "
        "| final return |"
    )
    print("|---|---|---|---|---|")
    for run in sorted(d for pattern in args.runs for d in glob.glob(pattern)):
        values = {
            tag: np.array([v for _, v in scalars(run, f"losses/{tag}")])
            for tag in ("ratio_dev_mean", "ratio_dev_max", "ratio_outside_frac")
        }
        returns = [v for _, v in scalars(run, "charts/episodic_return")][-10:]
        print(
            f"| {os.path.basename(run)} | {values['ratio_dev_mean'].mean():.3f} "
            f"| {values['ratio_dev_max'].mean():.2f} / {values['ratio_dev_max'].max():.2f} "
            f"| {values['ratio_outside_frac'].mean():.1%} | {np.mean(returns):.0f} |"
        )


if __name__ == "__main__":
    main(tyro.cli(Args))
