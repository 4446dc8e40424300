"""Distil teachers into students (ppo_teacher_student.py) and train PPO from scratch on the same
student observation; append one row per (teacher, seed) to distill.csv, and the learning curves
(deterministic eval return against env steps) to distill_curves.csv and plots/distill-<env>.png
beside it.

    python ppo_continuous.py --env-id Hopper-v5 --seed 1 --log-dir runs/teachers   # the teachers
    python benchmarks/distill.py --teachers runs/teachers/Hopper-v5__*/checkpoint.pt --seeds 1 2 3

Every number is what a real run returned, never an estimate. Rerunning appends.

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
import sys
import time
from dataclasses import dataclass

import tyro
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
import ppo_continuous  # noqa: E402
import ppo_teacher_student  # noqa: E402

COLUMNS = ["env_id", "seed", "teacher_eval_return", "student_eval_return", "action_mse"]
COLUMNS += ["distill_steps", "scratch_eval_return", "scratch_steps"]
CURVE_COLUMNS = ["method", "env_id", "seed", "step", "eval_return"]


@dataclass
class Args:
    teachers: tuple[str, ...]
    """checkpoints of ppo_continuous.py or ppo_symaug.py (one env each; the env is the teacher's)"""
    seeds: tuple[int, ...] = (1, 2, 3)
    """seeds of the student's (and the scratch run's) training"""
    distill_steps: int = 300_000
    """env steps of each distillation (--total-timesteps of ppo_teacher_student.py)"""
    history: int = 3
    """--history of the student (and of the scratch run's observation)"""
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


def student_envs(env_id, num_envs, backend="gymnasium", history=3, **kwargs):
    """ppo_continuous.py's make_envs for the scratch run: the student's observation."""
    return ppo_teacher_student.make_student_envs(env_id, num_envs, backend, history, **kwargs)


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
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    new = not os.path.exists(path)
    with open(path, "a", newline="") as file:
        writer = csv.DictWriter(file, columns, extrasaction="ignore")
        if new:
            writer.writeheader()
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
    metrics = ts.train(ts.Args(**fields))
    row = {"env_id": ckpt["env_id"], "seed": seed, "distill_steps": metrics["global_step"]}
    row["teacher_steps"] = ckpt["global_step"]  # not a column: the curves' offset
    row["teacher_eval_return"] = round(metrics["eval/teacher_return"], 2)
    row["student_eval_return"] = round(metrics["eval/episodic_return"], 2)
    row["action_mse"] = f"{metrics['distill/action_mse']:.6f}"
    if args.scratch:  # the same total env steps as the teacher's and the distillation's
        steps = ckpt["global_step"] + metrics["global_step"]
        pc = ppo_continuous
        fields = dict(recipe(ckpt), env_id=ckpt["env_id"], seed=seed, total_timesteps=steps)
        fields.update(eval_every=args.eval_every, eval_episodes=args.eval_episodes)
        fields.update(log_dir=os.path.join(run_dir, "scratch"))
        original = pc.make_envs
        pc.make_envs = functools.partial(student_envs, history=args.history)
        try:
            scratch = pc.train(pc.Args(**fields))
        finally:
            pc.make_envs = original
        row["scratch_eval_return"] = round(scratch["eval/episodic_return"], 2)
        row["scratch_steps"] = scratch["global_step"]
    return row


def plot(curves_csv: str, env_id: str):  # into plots/ beside the CSV
    """Students' and scratch runs' eval return against env steps (the scratch run's own)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: no matplotlib (pip install -r benchmarks/requirements.txt): no plot")
        return
    with open(curves_csv) as file:
        rows = [row for row in csv.DictReader(file) if row["env_id"] == env_id]
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
    ax.set_title(f"{env_id}: distilled student vs PPO from scratch")
    ax.legend()
    folder = os.path.join(os.path.dirname(curves_csv), "plots")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"distill-{env_id}.png")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    print(f"wrote {path}")


def main(args: Args):
    curves_csv = os.path.join(os.path.dirname(os.path.abspath(args.output)), "distill_curves.csv")
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
                                   "step": step, "eval_return": round(value, 2)})  # fmt: skip
            append(curves_csv, CURVE_COLUMNS, points)
            print(f"appended {row} to {args.output}", flush=True)
            plot(curves_csv, row["env_id"])


if __name__ == "__main__":
    main(tyro.cli(Args))
