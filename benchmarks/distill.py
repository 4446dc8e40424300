"""Distil teachers into students (ppo_teacher_student.py) and train PPO from scratch on the same
student observation; append one row per (teacher, seed) to distill.csv, and the learning curves
(deterministic eval return against env steps) to distill_curves.csv and plots/distill-<env>.png
beside it.

    python ppo_continuous.py --env-id Hopper-v5 --seed 1 --log-dir runs/teachers   # the teachers
    python benchmarks/distill.py --teachers runs/teachers/Hopper-v5__*/checkpoint.pt --seeds 1 2 3
    python benchmarks/distill.py --teachers <...> --variant="--student-obs full --history 0"
    python benchmarks/distill.py --compare runs/distill/<...>/student/<run>/checkpoint.pt

Every number is what a real run returned, never an estimate. Rerunning appends.

* --variant: a candidate, the student's extra flags (the scratch run takes its --history and
  --student-obs); the rows' variant column, curves and plot are the candidate's. student_obs:
  hidden (the student reads what a robot senses), full (the control: the env's whole obs).
* --compare: no training; each student and its teacher on the evaluation's episodes: return,
  length, falls, return per step, and the action error between the two by tenth of the episode.

* student_eval_return: the student's deterministic return over --eval-episodes episodes, and
  teacher_eval_return the teacher's on the same episodes (the same seeds); action_mse: the last
  iteration's mean squared error between the acting student's mean and the teacher's labels.
* scratch: ppo_continuous.py trained from scratch on the student's observation (the positions and
  their history, HistoryVectorEnv of ppo_teacher_student.py; its critic reads the whole obs, as the
  student's fine-tuning critic does) for the teacher's steps plus the distillation's, the same
  total env steps. ppo_continuous.py has no option for that observation, so its make_envs is
  wrapped here, in this process only (evaluation included). It trains with its teacher's flags
  (`recipe`: a robot teacher's recipe and backend), less those that name a run; the student with
  the teacher's backend and actor layers and the script's defaults otherwise.
"""

import csv
import dataclasses
import functools
import glob
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import tyro
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
import ppo_continuous  # noqa: E402
import ppo_teacher_student  # noqa: E402

COLUMNS = ["env_id", "seed", "teacher_eval_return", "student_eval_return", "action_mse"]
COLUMNS += ["distill_steps", "scratch_eval_return", "scratch_steps", "student_obs", "variant"]
CURVE_COLUMNS = ["method", "env_id", "seed", "step", "eval_return", "variant"]


@dataclass
class Args:
    teachers: tuple[str, ...] = ()
    """checkpoints of ppo_continuous.py or ppo_symaug.py (one env each; the env is the teacher's)"""
    compare: tuple[str, ...] = ()
    """students' checkpoints: where each loses its teacher's return, on the same evaluation
    episodes (lengths, falls, return per step, the action error by tenth of the episode); no
    training"""
    seeds: tuple[int, ...] = (1, 2, 3)
    """seeds of the student's (and the scratch run's) training"""
    distill_steps: int = 300_000
    """env steps of each distillation (--total-timesteps of ppo_teacher_student.py)"""
    history: int = 3
    """--history of the student (and of the scratch run's observation)"""
    variant: str = ""
    """a candidate: more flags of the student, e.g. --variant="--dagger-rollouts 16 --student-obs
    full" (the scratch run reads the student's observation: its --history and --student-obs)"""
    eval_every: int = 10
    """--eval-every of every run, for the learning curves (0: none)"""
    eval_episodes: int = 10
    """--eval-episodes of every evaluation"""
    scratch: bool = True
    """also train PPO from scratch on the student's observation (--no-scratch: distil only)"""
    log_dir: str = "runs/distill"
    """where the runs are written"""
    output: str = os.path.join(HERE, "distill.csv")
    """the CSV the rows are appended to (distill_curves.csv beside it)"""


def student_envs(env_id, num_envs, backend="gymnasium", history=3, student_obs="hidden", **kwargs):
    """ppo_continuous.py's make_envs for the scratch run: the student's observation."""
    return ppo_teacher_student.make_student_envs(
        env_id, num_envs, backend, history, student_obs, **kwargs
    )


def student_args(fields: dict, variant: str):
    """The student's Args: the fields, then the candidate's flags (parsed as the script parses
    its command line: a misspelled flag stops here, before any run)."""
    return tyro.cli(ppo_teacher_student.Args, args=shlex.split(variant),
                    default=ppo_teacher_student.Args(**fields))  # fmt: skip


def curve(log_dir: str) -> list[tuple[int, float]]:
    """(step, deterministic return) of the run's periodic evaluations and its final one."""
    (run_dir,) = glob.glob(os.path.join(log_dir, "*"))
    (events,) = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    acc = EventAccumulator(events, size_guidance={"scalars": 0}).Reload()
    points = {}  # by step: the final evaluation's, where a periodic one was at the same step
    for tag in ("eval/periodic_return", "eval/episodic_return"):
        if tag in acc.Tags()["scalars"]:
            points.update({e.step: e.value for e in acc.Scalars(tag)})
    return sorted(points.items())


def append(path: str, columns: list[str], rows: list[dict]):
    """Rows onto the CSV; a CSV of fewer columns (an older one) is rewritten with them all first,
    its rows' new columns empty."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    old = []
    if os.path.exists(path):
        with open(path, newline="") as file:
            reader = csv.DictReader(file)
            old = list(reader) if reader.fieldnames != columns else None
    with open(path, "w" if old is not None else "a", newline="") as file:
        writer = csv.DictWriter(file, columns, extrasaction="ignore")
        if old is not None:
            writer.writeheader()
            writer.writerows(old)
        writer.writerows(rows)


# What names a run, not how it learns: a scratch run's own. The rest of its teacher's flags is
# the scratch run's recipe (a robot teacher's: the robot recipe, its EnvPool backend).
OWN = {"seed", "total_timesteps", "privileged_actor", "resume", "init_from", "eval_checkpoint"}
OWN |= {"eval_every", "eval_episodes", "log_dir", "exp_name", "capture_video", "track"}


def recipe(ckpt: dict) -> dict:
    """The teacher's training flags that ppo_continuous.py has, less those that name a run."""
    fields = {field.name for field in dataclasses.fields(ppo_continuous.Args)}
    return {k: v for k, v in ckpt["args"].items() if k in fields and k not in OWN}


def distil(teacher: str, seed: int, args: Args, run_dir: str) -> dict:
    ts = ppo_teacher_student
    ckpt = ts.load_checkpoint(teacher, ts.TEACHER_SCRIPTS)
    fields = dict(env_id=ckpt["env_id"], teacher=teacher, seed=seed, history=args.history)
    fields.update(env_backend=ckpt["args"].get("env_backend", "gymnasium"))
    fields.update(actor_layers=ckpt["args"]["actor_layers"])  # a student as wide as its teacher
    fields.update(total_timesteps=args.distill_steps, eval_every=args.eval_every)
    fields.update(eval_episodes=args.eval_episodes, log_dir=os.path.join(run_dir, "student"))
    student = student_args(fields, args.variant)
    metrics = ts.train(student)
    row = {"env_id": ckpt["env_id"], "seed": seed, "distill_steps": metrics["global_step"]}
    row["teacher_steps"] = ckpt["global_step"]  # not a column: the curves' offset
    row["teacher_eval_return"] = round(metrics["eval/teacher_return"], 2)
    row["student_eval_return"] = round(metrics["eval/episodic_return"], 2)
    row["action_mse"] = f"{metrics['distill/action_mse']:.6f}"
    row.update(student_obs=student.student_obs, variant=args.variant)
    if args.scratch:  # the same total env steps as the teacher's and the distillation's
        steps = ckpt["global_step"] + metrics["global_step"]
        pc = ppo_continuous
        fields = dict(recipe(ckpt), env_id=ckpt["env_id"], seed=seed, total_timesteps=steps)
        fields.update(eval_every=args.eval_every, eval_episodes=args.eval_episodes)
        fields.update(log_dir=os.path.join(run_dir, "scratch"))
        original = pc.make_envs
        pc.make_envs = functools.partial(
            student_envs, history=student.history, student_obs=student.student_obs
        )
        try:
            scratch = pc.train(pc.Args(**fields))
        finally:
            pc.make_envs = original
        row["scratch_eval_return"] = round(scratch["eval/episodic_return"], 2)
        row["scratch_steps"] = scratch["global_step"]
    return row


def plot(curves_csv: str, env_id: str, variant: str = ""):  # into plots/ beside the CSV
    """Students' and scratch runs' eval return against env steps (the scratch run's own), of one
    variant (a candidate's flags; earlier rows: the default)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: no matplotlib (pip install -r benchmarks/requirements.txt): no plot")
        return
    with open(curves_csv) as file:
        rows = [row for row in csv.DictReader(file)
                if row["env_id"] == env_id and (row.get("variant") or "") == variant]  # fmt: skip
    latest = {}  # (method, seed): its last run's points (a rerun, e.g. longer, starts over)
    for row in rows:
        points = latest.setdefault((row["method"], row["seed"]), [])
        if points and int(row["step"]) <= int(points[-1]["step"]):
            points.clear()
        points.append(row)
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, color in (("student", "tab:blue"), ("scratch", "tab:orange")):
        seeds = sorted({row["seed"] for row in rows if row["method"] == method})
        for seed in seeds:
            points = latest[(method, seed)]
            steps = [int(r["step"]) for r in points]
            returns = [float(r["eval_return"]) for r in points]
            label = method if seed == seeds[0] else None  # one legend entry per method
            ax.plot(steps, returns, color=color, marker=".", label=label)
    ax.set(xlabel="env steps (a student's: after its teacher's)", ylabel="eval return")
    ax.set_title(f"{env_id}: distilled student vs PPO from scratch {variant}".strip())
    ax.legend()
    folder = os.path.join(os.path.dirname(curves_csv), "plots")
    os.makedirs(folder, exist_ok=True)
    suffix = re.sub(r"[^A-Za-z0-9.]+", "-", variant).strip("-")  # "dagger-rollouts-16"
    path = os.path.join(folder, f"distill-{env_id}{'-' * bool(suffix)}{suffix}.png")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    print(f"wrote {path}")


def walk(agent, other, args, episodes: int) -> list[dict]:
    """agent's deterministic episodes as the script's evaluate runs them (the same seeds, in waves
    of 16): each step's reward and the squared error between agent's action and other's on the
    same state (both clipped to [-1, 1], as the env clips them)."""
    ts, seed, walked = ppo_teacher_student, args.seed + ppo_teacher_student.EVAL_SEED_OFFSET, []
    for first in range(0, episodes, 16):
        n = min(16, episodes - first)
        envs = ts.make_student_envs(args.env_id, n, args.env_backend, args.history,
                                    args.student_obs, **ts.eval_options(args))  # fmt: skip
        obs, _ = envs.reset(seed=seed + first)
        wave = [{"rewards": [], "errors": [], "fell": False} for _ in range(n)]
        finished = np.zeros(n, dtype=bool)
        while not finished.all():
            x = ts.to_tensor(obs, "cpu")
            with torch.no_grad():
                mean, others = agent.mean_action(x), other.mean_action(x)
            errors = ((mean.clamp(-1, 1) - others.clamp(-1, 1)) ** 2).mean(-1)
            obs, reward, terminated, truncated, _ = envs.step(
                ts.scale_action(mean.numpy(), envs.single_action_space)
            )
            for i in np.flatnonzero(~finished):
                wave[i]["rewards"].append(float(reward[i]))
                wave[i]["errors"].append(float(errors[i]))
                wave[i]["fell"] = bool(terminated[i])
            finished |= terminated | truncated
        envs.close()
        walked += wave
    return walked


def compare(path: str, episodes: int) -> dict:
    """The student of `path` and its teacher, each on the evaluation's episodes: return, length,
    falls, return per step, and the action error between the two along the episode (by tenth of
    its length) on the states each visits."""
    ts = ppo_teacher_student
    ckpt = ts.load_checkpoint(path)
    args = ts.saved_args(ckpt)
    torch.set_num_threads(args.threads)  # the run's: other threads, other float sums
    student = ts.Agent(ckpt["obs_dim"], ckpt["act_dim"], args, ckpt["actor_dim"])
    student.load_state_dict(ckpt["agent"])
    teacher = ts.Teacher(ts.load_checkpoint(args.teacher, ts.TEACHER_SCRIPTS), student, args)
    rows = {}
    print(
        f"{ckpt['env_id']}, {episodes} episodes: return | length | falls | return per step | "
        f"action error by tenth of the episode (student vs teacher, on the states it visits)"
    )
    for name, agent, other in (("student", student, teacher), ("teacher", teacher, student)):
        walked = walk(agent, other, args, episodes)
        tenths = [[] for _ in range(10)]
        for episode in walked:
            length = len(episode["errors"])
            for t, error in enumerate(episode["errors"]):
                tenths[10 * t // length].append(error)
        row = {"return": np.mean([sum(e["rewards"]) for e in walked]),
               "length": np.mean([len(e["rewards"]) for e in walked]),
               "falls": sum(e["fell"] for e in walked),
               "per_step": np.mean([np.mean(e["rewards"]) for e in walked])}  # fmt: skip
        row["error_by_tenth"] = [float(np.mean(t)) if t else float("nan") for t in tenths]
        rows[name] = row
        errors = " ".join(f"{e:.3g}" for e in row["error_by_tenth"])
        print(f"{name}: {row['return']:.1f} | {row['length']:.0f} | {row['falls']} of {episodes} "
              f"| {row['per_step']:.3f} | {errors}")  # fmt: skip
    return rows


def main(args: Args):
    if not args.teachers and not args.compare:
        raise SystemExit("error: give --teachers (distil them) or --compare (students' episodes)")
    for path in args.compare:
        compare(path, args.eval_episodes)
    curves_csv = os.path.join(os.path.dirname(os.path.abspath(args.output)), "distill_curves.csv")
    student_args({}, args.variant)  # its flags checked before the first run
    for teacher in args.teachers:
        for seed in args.seeds:
            run_dir = os.path.join(args.log_dir, f"{os.getpid()}-{int(time.time())}")
            row = distil(teacher, seed, args, run_dir)
            append(args.output, COLUMNS, [row])
            points = []
            for method in ("student", "scratch") if args.scratch else ("student",):
                offset = row["teacher_steps"] if method == "student" else 0
                for step, value in curve(os.path.join(run_dir, method)):
                    step += offset  # a student's steps come after its teacher's
                    points.append({"method": method, "env_id": row["env_id"], "seed": seed,
                                   "step": step, "eval_return": round(value, 2),
                                   "variant": args.variant})  # fmt: skip
            append(curves_csv, CURVE_COLUMNS, points)
            print(f"appended {row} to {args.output}", flush=True)
            plot(curves_csv, row["env_id"], args.variant)


if __name__ == "__main__":
    main(tyro.cli(Args))
