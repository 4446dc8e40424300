"""Training speed of each script on both env backends, beside the raw speed of both vector envs,
measured in one run; with --baseline, the same against an earlier checkout, and a whole job.

    python benchmarks/sps.py                       # every script on Hopper-v5
    git worktree add /tmp/base 42b28c0 && python benchmarks/sps.py --baseline /tmp/base

For each script, back to back so that they see the same machine load:
- the raw env steps per second of its vector env with random actions and no learning: gymnasium's
  sync vector env, and EnvPool's pool as the scripts make it (one thread, sync);
- the SPS the script reports while training, with --env-backend gymnasium and envpool, and that
  of the --baseline checkout's copy of the script (which knows gymnasium only).
ppo_ddp.py is measured with 1 and with 2 processes (torchrun). Then the whole job (start-up and the
final evaluation included) of ppo_continuous.py on --job-timesteps steps, the baseline's and this
checkout's on both backends in turn, A B C A B C. Rows go to benchmarks/sps_backends.csv.
"""

import datetime
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import tyro
from run import ROOT, append_rows, scalars  # benchmarks/run.py: this folder is on sys.path

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
    raw_seconds: float = 10.0
    """how long to step each raw vector env"""
    baseline: str | None = None
    """a checkout of an earlier commit to compare with (training SPS, and the whole job)"""
    job_timesteps: int = 40_960
    """env steps of the whole job of ppo_continuous.py"""
    job_rounds: int = 3
    """rounds of the whole job (each runs the baseline, gymnasium, envpool in turn)"""
    output: str = os.path.join(HERE, "sps_backends.csv")
    """CSV file the rows are appended to"""


def has_envpool(env_id: str) -> bool:
    if importlib.util.find_spec("envpool") is None:
        return False
    return env_id in importlib.import_module("envpool").list_all_envs()


def raw_sps(env_id: str, num_envs: int, seconds: float, backend: str) -> float:
    """Random actions for `seconds`, SAME_STEP autoreset (gymnasium) or EnvPool's own (its reset
    of a finished env is one more step, counted as one)."""
    if backend == "gymnasium":
        envs = gym.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        )
        space = envs.single_action_space
        envs.reset(seed=0)
    else:
        envpool = importlib.import_module("envpool")
        envs = envpool.make_gymnasium(env_id, num_envs=num_envs, num_threads=1, seed=0)
        space = envs.action_space
        envs.reset()
    rng = np.random.default_rng(0)
    steps, start = 0, time.time()
    while time.time() - start < seconds:
        envs.step(rng.uniform(space.low, space.high, (num_envs, *space.shape)).astype(np.float32))
        steps += num_envs
    envs.close()
    return steps / (time.time() - start)


def launcher(root: str, script: str, nproc: int) -> list[str]:
    """python, or torchrun with nproc ranks for ppo_ddp.py; then the script of that checkout."""
    if script != "ppo_ddp.py":
        return [sys.executable, os.path.join(root, script)]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*torchrun, f"--nproc_per_node={nproc}", os.path.join(root, script)]


def train_sps(root: str, script: str, env_id: str, steps: int, nproc: int, flags=()) -> float:
    with tempfile.TemporaryDirectory() as log_dir:
        command = [*launcher(root, script, nproc), "--env-id", env_id, *flags]
        command += ["--total-timesteps", str(steps), "--log-dir", log_dir, "--eval-episodes", "1"]
        subprocess.run(command, check=True, cwd=root, stdout=subprocess.DEVNULL)
        (run,) = os.listdir(log_dir)
        return scalars(os.path.join(log_dir, run), "charts/SPS")[-1][1]


def job_seconds(root: str, env_id: str, steps: int, flags=()) -> float:
    """Wall time of a whole ppo_continuous.py run, start-up and the final evaluation included."""
    with tempfile.TemporaryDirectory() as log_dir:
        command = [sys.executable, os.path.join(root, "ppo_continuous.py"), "--env-id", env_id]
        command += list(flags)
        command += ["--total-timesteps", str(steps), "--log-dir", log_dir]
        start = time.time()
        subprocess.run(command, check=True, cwd=root, stdout=subprocess.DEVNULL)
        return time.time() - start


def measure_script(args: Args, script: str, nproc: int) -> dict:
    defaults = importlib.import_module(script[:-3]).Args()
    # ppo_symaug.py needs a mirror map, which Hopper-v5 lacks: it runs on its own default env.
    env_id = defaults.env_id if script == "ppo_symaug.py" else args.env_id
    envpool = has_envpool(env_id)
    row = {"script": script, "env_id": env_id, "nproc": nproc, "num_envs": defaults.num_envs}
    row["raw_gym_sps"] = raw_sps(env_id, defaults.num_envs, args.raw_seconds, "gymnasium")
    row["raw_envpool_sps"] = None
    if envpool:
        row["raw_envpool_sps"] = raw_sps(env_id, defaults.num_envs, args.raw_seconds, "envpool")
    row["baseline_sps"] = None
    if args.baseline and os.path.isfile(os.path.join(args.baseline, script)):
        row["baseline_sps"] = train_sps(args.baseline, script, env_id, args.total_timesteps, nproc)
    row["gym_sps"] = train_sps(ROOT, script, env_id, args.total_timesteps, nproc)
    row["envpool_sps"] = None
    if envpool:
        flags = ("--env-backend", "envpool")
        row["envpool_sps"] = train_sps(ROOT, script, env_id, args.total_timesteps, nproc, flags)
    return row


def share(a, b) -> str:
    return "-" if a is None or b is None else f"{a / b:.0%}"


def main(args: Args):
    rows = []
    for script in args.scripts:
        if not os.path.isfile(os.path.join(ROOT, script)):
            print(f"skip {script}: not found")
            continue
        for nproc in (1, 2) if script == "ppo_ddp.py" else (1,):
            row = measure_script(args, script, nproc)
            row = {k: round(v) if isinstance(v, float) else v for k, v in row.items()}
            rows.append({**row, "date": datetime.date.today().isoformat()})
            append_rows(args.output, rows[-1:])
            print(rows[-1], flush=True)
    print(
        "\n| script | env | processes | raw gymnasium SPS | raw EnvPool SPS | baseline SPS "
        "| gymnasium SPS | EnvPool SPS | gymnasium / raw gymnasium | EnvPool / raw gymnasium "
        "| gymnasium / baseline | EnvPool / baseline |\n" + "|---" * 12 + "|"
    )
    for r in rows:
        print(
            f"| `{r['script']}` | {r['env_id']} | {r['nproc']} | {r['raw_gym_sps']} "
            f"| {r['raw_envpool_sps'] or '-'} | {r['baseline_sps'] or '-'} | {r['gym_sps']} "
            f"| {r['envpool_sps'] or '-'} | {share(r['gym_sps'], r['raw_gym_sps'])} "
            f"| {share(r['envpool_sps'], r['raw_gym_sps'])} "
            f"| {share(r['gym_sps'], r['baseline_sps'])} "
            f"| {share(r['envpool_sps'], r['baseline_sps'])} |"
        )
    if args.baseline:
        sides = {"baseline": (args.baseline, ()), "gymnasium": (ROOT, ())}
        if has_envpool(args.env_id):
            sides["envpool"] = (ROOT, ("--env-backend", "envpool"))
        times = {side: [] for side in sides}
        for _ in range(args.job_rounds):
            for side, (root, flags) in sides.items():
                times[side].append(job_seconds(root, args.env_id, args.job_timesteps, flags))
        print(f"\nwhole job, ppo_continuous.py on {args.job_timesteps} steps of {args.env_id}:")
        base = statistics.median(times["baseline"])
        for side, seconds in times.items():
            median = statistics.median(seconds)
            runs = ", ".join(f"{s:.1f}" for s in seconds)
            print(f"- {side}: median {median:.1f} s ({runs}); baseline / this: {base / median:.2f}")


if __name__ == "__main__":
    main(tyro.cli(Args))
