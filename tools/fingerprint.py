"""Seeded short runs of every script, reduced to their logged numbers: a code change that should
not move the computation must leave them identical, one that moves it on purpose by rounding only
in the last digits.

    python tools/fingerprint.py --output /tmp/before.json          # record
    python tools/fingerprint.py --compare /tmp/before.json         # rerun, print what differs

Each script trains 3 iterations of 8 envs x 256 steps on Hopper-v5 (ppo_symaug.py on its default
Walker2d-v5) with seed 1, once as is and once with --eval-every 2; ppo_ddp.py also on 2 ranks
(torchrun, 4 envs each). Every TensorBoard scalar is kept but the clock's (SPS, waits).
appo_vtrace.py is timed by its actor: which policy a rollout was collected with can differ between
runs (it has not in the runs so far), so a difference there is checked against the policy lag.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ["ppo_continuous", "ppo_spo", "ppo_symaug", "ppo_ddp", "appo_vtrace"]
CLOCK = ("charts/SPS", "charts/learner_wait_time", "charts/actor_wait_time")
CLOCK += ("charts/actor_wait_frac",)


def scalars(run_dir: str) -> dict:
    """{tag: [values by step]} of the run's event file, the clock's tags left out."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(run_dir, size_guidance={"scalars": 0}).Reload()
    tags = [tag for tag in events.Tags()["scalars"] if tag not in CLOCK]
    return {tag: [event.value for event in events.Scalars(tag)] for tag in sorted(tags)}


def run(script: str, extra: list[str], nproc: int) -> dict:
    with tempfile.TemporaryDirectory() as log_dir:
        flags = ["--total-timesteps", "6144", "--seed", "1", "--eval-episodes", "2"]
        flags += ["--log-dir", log_dir, *extra]
        launch = [sys.executable]
        if nproc > 1:  # 4 envs a rank: the same global batch, 3 iterations
            launch += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
            flags += ["--num-envs", "4"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        result = subprocess.run([*launch, f"{script}.py", *flags], cwd=ROOT, env=env,
                                capture_output=True, text=True)  # fmt: skip
        if result.returncode:
            raise SystemExit(f"{script} {' '.join(extra)} failed:\n{result.stderr[-2000:]}")
        (name,) = os.listdir(log_dir)
        return scalars(os.path.join(log_dir, name))


def fingerprints(scripts: list[str]) -> dict:
    prints = {}
    for script in scripts:
        for nproc in (1, 2) if script == "ppo_ddp" else (1,):
            for extra in ([], ["--eval-every", "2"]):
                key = " ".join([script, *extra] + (["(2 ranks)"] if nproc > 1 else []))
                prints[key] = run(script, extra, nproc)
                print(f"{key}: {len(prints[key])} tags", flush=True)
    return prints


def compare(before: dict, after: dict) -> int:
    """Print each differing value with its relative difference; the number of differences."""
    count = 0
    for key in before:
        for tag, old in before[key].items():
            new = after.get(key, {}).get(tag)
            if new != old:
                count += 1
                pairs = list(zip(old, new or []))
                worst = max(
                    (abs(a - b) / max(abs(a), 1e-12) for a, b in pairs if math.isfinite(a)),
                    default=math.inf,
                )
                print(f"{key} | {tag}: {old} -> {new} (max relative difference {worst:.1e})")
    print(f"differences: {count}")
    return count


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", help="write the fingerprints here (JSON)")
    parser.add_argument("--compare", help="fingerprints recorded before, to compare with")
    parser.add_argument("--scripts", nargs="+", default=SCRIPTS)
    options = parser.parse_args()
    prints = fingerprints(options.scripts)
    if options.output:
        with open(options.output, "w") as file:
            json.dump(prints, file, indent=1)
    if options.compare:
        with open(options.compare) as file:
            compare(json.load(file), prints)
