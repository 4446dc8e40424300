"""Evaluate robot checkpoints (EnvPool's MuJoCo Playground joystick tasks) on the stock task and
print a table of what each robot can do; --record appends the rows to robots.csv (and results.csv).

    python benchmarks/robots.py --checkpoints benchmarks/robots/ppo_symaug-Go1*.pt --plot
    python benchmarks/robots.py --checkpoints runs/<run>/checkpoint.pt --wall-seconds 5400 --record

For each checkpoint (a ppo_teacher_student.py student's too, on its observation and history):
--episodes deterministic episodes (the mean action; 50, enough to count falls) with sensor noise
as in training, episode i on seed --seed + 10000 + i as the scripts' evaluation, on the stock task
(the env's own reward and command ranges, whatever the run trained on). Each episode's reward
terms are averaged per step (EnvPool's info, as the scripts' reward_terms/<name> tags); a fall is
an episode that terminated before its time limit. For Go1 it also gives the forward tracking (the
linear tracking on the steps whose commanded vx > 0.25 m/s) and prints the linear tracking per
bin of commanded speed and of commanded forward velocity vx (with the mean vx commanded and
measured), recomputed step by step from the obs (the env's own term).

--plot drives the first checkpoint's robot with the commands you choose (--commands: vx vy yaw
rate triples, --command-seconds each; by default forward 0.8 m/s, backward 0.8 m/s, then a left
turn at 1 rad/s) by writing them into the command slots of its observation, and draws commanded
against measured base velocity (privileged_state's local linear velocity and gyro, not noised):
benchmarks/plots/<script>-<env>-velocity.png (Go1's slots).

--curves draws the runs' training curves of the two tracking terms (the per-episode
reward_terms/tracking_* tags, averaged over bins of --bin-steps) against the goal:

    python benchmarks/robots.py --curves runs/A runs/B --labels "R, seed 1" "RB, seed 1"

--drift-stds prints Go1's mean base velocity under random actions of each std (16 envs, 300
steps): the direction exploration alone pushes the robot, before any gait is learned; and the
share of those steps whose reward the env's clip at 0 leaves exactly 0 (no signal to learn from).

    python benchmarks/robots.py --drift-stds 0.1 0.2 0.37 1.0

--gif VIDEO GIF turns 5 s of a video that a script filmed (--eval-checkpoint X --capture-video,
with --eval-command to choose what the robot does) into a small GIF, as the README's:

    python ppo_continuous.py --eval-checkpoint benchmarks/robots/ppo_continuous-Go1*.pt \
        --capture-video --eval-command 0.8 0 0 --eval-episodes 1 --video-dir videos
    python benchmarks/robots.py --gif videos/robots/eval_checkpoint_step19996672_<time>.mp4 \
        benchmarks/plots/ppo_continuous-Go1JoystickFlatTerrain-v1-forward.gif
"""

import csv
import datetime
import importlib
import os
import sys
from dataclasses import dataclass

import imageio.v3
import numpy as np
import torch
import tyro

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the scripts
COLUMNS = ["script", "env_id", "seed", "total_timesteps", "flags", "eval_return"]
COLUMNS += ["eval_tracking_lin_vel", "eval_tracking_ang_vel", "eval_length", "eval_falls"]
COLUMNS += ["wall_seconds", "eval_episodes", "eval_tracking_forward"]
FORWARD = 0.25  # commanded vx (m/s) above which a step counts as a forward command
DEFAULTS_SKIPPED = {"resume", "log_dir", "init_from", "eval_checkpoint", "exp_name", "seed"}
DEFAULTS_SKIPPED |= {"env_id", "env_backend", "total_timesteps"}


@dataclass
class Args:
    checkpoints: tuple[str, ...] = ()
    """checkpoint.pt (or best.pt) files of robot runs: one row each"""
    episodes: int = 50
    """deterministic episodes per checkpoint (50 at least to count falls)"""
    wall_seconds: tuple[int, ...] = ()
    """each run's training wall time, as its log printed (same order as --checkpoints)"""
    output: str = os.path.join(HERE, "robots.csv")
    """the table the README shows; results.csv gets the return too"""
    plot: bool = False
    """commanded vs measured base velocity of the first checkpoint under --commands"""
    commands: tuple[float, ...] = (0.8, 0.0, 0.0, -0.8, 0.0, 0.0, 0.0, 0.0, 1.0)
    """--plot's commands: vx (m/s) vy (m/s) yaw rate (rad/s) triples, one after the other"""
    command_seconds: float = 5.0
    """how long --plot holds each command"""
    record: bool = False
    """append the rows to robots.csv and results.csv (the README's tables); off: print only"""
    curves: tuple[str, ...] = ()
    """run directories (their TensorBoard logs) whose training tracking curves to plot"""
    labels: tuple[str, ...] = ()
    """one legend label per --curves directory"""
    bin_steps: int = 500_000
    """env steps per point of --curves"""
    curves_plot: str = os.path.join(HERE, "plots", "Go1JoystickFlatTerrain-v1-tracking.png")
    """where --curves draws"""
    drift_stds: tuple[float, ...] = ()
    """Go1's mean base velocity under random actions of these stds: what exploration alone does"""
    gif: tuple[str, ...] = ()
    """VIDEO GIF: 5 s of a robot's MP4 that a script filmed, from its 2nd second, as a small GIF"""


def load(path: str):
    """(the script's module, its checkpoint, its agent), by the script's own loader."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    script = importlib.import_module(ckpt["script"])
    ckpt = script.load_checkpoint(path)
    ckpt["actor_dim"] = ckpt["agent"]["actor_mean.0.weight"].shape[1]  # the actor's columns
    agent = script.Agent(
        ckpt["obs_dim"], ckpt["act_dim"], script.saved_args(ckpt), ckpt["actor_dim"]
    )
    agent.load_state_dict(ckpt["agent"])
    return script, ckpt, agent


def flags_of(ckpt: dict, script) -> str:
    """The flags the run typed: its saved settings that differ from the script's defaults."""
    defaults = vars(script.Args())
    changed = []
    for name, value in ckpt["args"].items():
        if name in DEFAULTS_SKIPPED or defaults.get(name) == value:
            continue
        shown = " ".join(map(str, value)) if isinstance(value, (tuple, list)) else value
        changed.append(f"--{name.replace('_', '-')} {shown}".replace(" True", ""))
    return " ".join(changed)


def make(script, ckpt: dict, num_envs: int):
    """The stock task's envs, as the script's evaluation makes them (a student's: its history)."""
    if hasattr(script, "make_student_envs"):  # a student: its observation and history
        return script.make_student_envs(
            ckpt["env_id"], num_envs, "envpool", ckpt["args"]["history"],
            ckpt["args"].get("student_obs", "hidden"),  # an older student's: hidden
        )  # fmt: skip
    return script.make_envs(ckpt["env_id"], num_envs, "envpool")


@torch.no_grad()
def evaluate(script, ckpt: dict, agent, episodes: int, trace: bool) -> dict:
    """The episodes' returns, lengths, falls and per-step reward terms; with trace, the first
    episode's commanded and measured (vx, vy, yaw rate) per step."""
    args = script.saved_args(ckpt)
    torch.set_num_threads(args.threads)  # the run's: other threads sum floats in another order
    envs = make(script, ckpt, episodes)
    obs, _ = envs.reset(seed=args.seed + script.EVAL_SEED_OFFSET)
    returns, lengths = np.zeros(episodes), np.zeros(episodes, dtype=int)
    finished, fell = np.zeros(episodes, dtype=bool), np.zeros(episodes, dtype=bool)
    terms, steps, commands, velocities, tracking = {}, [], [], [], []
    go1 = ckpt["env_id"].startswith("Go1Joystick")  # its slots: state[45:48], privileged[57:59]
    while not finished.all():
        if trace and not finished[0]:  # Go1: state's command, privileged_state's vx, vy, gyro z
            privileged = obs[0, -123:]  # the env's obs ends with it (a student's starts with state)
            steps.append([*obs[0, 45:48], privileged[57], privileged[58], privileged[50]])
        command = obs[:, 45:47].copy()  # in effect during the step: EnvPool resamples it after
        mean = agent.mean_action(torch.as_tensor(obs, dtype=torch.float32))
        action = script.scale_action(mean.numpy(), envs.single_action_space)
        obs, reward, terminated, truncated, info = envs.step(action)
        live = ~finished
        returns += reward * live
        lengths += live
        done = (terminated | truncated) & live
        fell |= terminated & live
        if go1:  # the step's tracking_lin_vel: its command, the local velocity after it
            after = obs.copy()
            for i in np.flatnonzero(terminated | truncated):  # the episode's last, not the reset's
                after[i] = info["final_obs"][i]
            velocity = after[:, -123:][:, 57:59]
            commands.append(command[live])
            velocities.append(velocity[live])
            tracking.append(np.exp(-((command - velocity) ** 2).sum(-1) / 0.25)[live])
        for name, means in info.get("reward_terms", {}).items():
            terms.setdefault(name, np.zeros(episodes))[done] = means[done]
        finished |= done
    envs.close()
    result = {"returns": returns, "lengths": lengths, "falls": fell, "terms": terms, "trace": steps}
    if go1:
        result["commands"], result["tracking"] = np.concatenate(commands), np.concatenate(tracking)
        result["velocities"] = np.concatenate(velocities)
    return result


def by_bin(keys: np.ndarray, values: np.ndarray, edges: list[float]) -> dict:
    """Per bin [low, high) of keys (a commanded quantity): (its share of the steps, the mean of
    values there). The tracking term exp(-|v - v_cmd|^2 / 0.25) pays 0.018 for a 1 m/s error: a
    command gives almost nothing until the robot nearly walks at its velocity."""
    shares = {}
    for low, high in zip(edges[:-1], edges[1:]):
        chosen = (keys >= low) & (keys < high)
        shares[(low, high)] = (chosen.mean(), values[chosen].mean() if chosen.any() else np.nan)
    return shares


def breakdown(result: dict) -> list[str]:
    """Go1's linear tracking per bin of commanded speed, then of commanded forward velocity vx
    with the mean vx commanded and measured there: which commands the robot does not follow."""
    commands, measured, tracking = result["commands"], result["velocities"], result["tracking"]
    lines = []
    speeds = np.linalg.norm(commands, axis=-1)
    for (low, high), (share, mean) in by_bin(speeds, tracking, SPEED_BINS).items():
        lines.append(f"linear tracking at commanded speed {low}-{high} m/s: {mean:.3f} "
                     f"({share:.0%} of the steps)")  # fmt: skip
    vx = commands[:, 0]
    walked = by_bin(vx, measured[:, 0], VX_BINS)  # the mean measured vx in each bin
    asked = by_bin(vx, vx, VX_BINS)
    for (low, high), (share, mean) in by_bin(vx, tracking, VX_BINS).items():
        lines.append(f"linear tracking at commanded vx {low} to {high} m/s: {mean:.3f} ({share:.0%}"
                     f" of the steps; vx {asked[(low, high)][1]:+.2f} commanded, "
                     f"{walked[(low, high)][1]:+.2f} measured)")  # fmt: skip
    return lines


def drift(std: float, num_envs: int = 16, steps: int = 300, seed: int = 1):
    """Go1's mean base velocity (vx, vy) over num_envs envs and steps steps of random actions
    N(0, std^2) clipped to [-1, 1] (a policy's exploration around the default pose), and the
    share of those steps whose reward is exactly 0 (the env clips each step's reward at 0)."""
    script = importlib.import_module("ppo_continuous")
    envs = script.make_envs("Go1JoystickFlatTerrain-v1", num_envs, "envpool")
    obs, _ = envs.reset(seed=seed)
    rng, velocities, shape = np.random.default_rng(seed), [], (num_envs, 12)  # Go1's 12 joints
    zeros = 0
    for _ in range(steps):
        actions = np.clip(rng.normal(0.0, std, shape), -1.0, 1.0)
        obs, reward, _, _, info = envs.step(actions)
        zeros += int(np.sum(reward == 0.0))
        after = info.get("final_obs", obs)  # a fallen robot's last obs, not the next episode's
        velocities.append(after[:, -123:][:, 57:59])  # privileged_state's local vx, vy
    envs.close()
    vx, vy = np.mean(velocities, axis=(0, 1))
    return vx, vy, zeros / (steps * num_envs)


@torch.no_grad()
def follow(script, ckpt: dict, agent, commands: np.ndarray, seconds: float) -> list:
    """One robot (the evaluation's first seed) driven by these commands, each held `seconds`: each
    is written into the command slots of the observations it gets (Go1's state[45:48], which
    privileged_state repeats), before any history is made of them; per step until the episode
    ends: the command (vx, vy, yaw rate), then the measured vx, vy, yaw rate (not noised)."""
    args = script.saved_args(ckpt)
    torch.set_num_threads(args.threads)  # as evaluate()
    envs = make(script, ckpt, 1)
    pool = getattr(envs, "inner", envs)  # a student's history is made of what the pool gave
    now = {"command": commands[0]}

    def commanded(obs):
        for key in ("state", "privileged_state"):
            obs[key][:, 45:48] = now["command"]
        return type(pool).flat(pool, obs)

    pool.flat = commanded
    obs, _ = envs.reset(seed=args.seed + script.EVAL_SEED_OFFSET)
    steps_each, trace = max(1, round(seconds / 0.02)), []
    for t in range(len(commands) * steps_each):
        command = now["command"]
        mean = agent.mean_action(torch.as_tensor(obs, dtype=torch.float32))
        now["command"] = commands[min((t + 1) // steps_each, len(commands) - 1)]  # the next obs's
        action = script.scale_action(mean.numpy(), envs.single_action_space)
        obs, _, terminated, truncated, info = envs.step(action)
        after = info["final_obs"][0] if terminated[0] or truncated[0] else obs[0]
        privileged = after[-123:]  # privileged_state: local vx, vy at 57, 58; gyro z at 50
        trace.append([*command, privileged[57], privileged[58], privileged[50]])
        if terminated[0] or truncated[0]:
            break
    envs.close()
    return trace


def followed(trace: list) -> list[str]:
    """Per command of follow()'s trace: the mean measured velocities and the linear tracking."""
    trace, lines = np.array(trace), []
    changes = np.flatnonzero(np.any(np.diff(trace[:, :3], axis=0) != 0, axis=1)) + 1
    for part in np.split(trace, changes):
        vx, vy, yaw = part[0, :3]
        tracking = np.exp(-((part[:, :2] - part[:, 3:5]) ** 2).sum(-1) / 0.25).mean()
        lines.append(f"commanded vx {vx:+.2f} vy {vy:+.2f} yaw {yaw:+.2f}: measured vx "
                     f"{part[:, 3].mean():+.2f} vy {part[:, 4].mean():+.2f} yaw "
                     f"{part[:, 5].mean():+.2f} over {len(part) * 0.02:.1f} s (linear tracking "
                     f"{tracking:.3f})")  # fmt: skip
    return lines


def plot(trace: list, path: str, title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trace = np.array(trace)
    seconds = np.arange(len(trace)) * 0.02
    figure, axes = plt.subplots(3, 1, figsize=(8, 6), sharex=True)
    labels = ["forward velocity vx (m/s)", "lateral velocity vy (m/s)", "yaw rate (rad/s)"]
    for k, (axis, label) in enumerate(zip(axes, labels)):
        axis.plot(seconds, trace[:, k], label="commanded", color="black", linestyle="--")
        axis.plot(seconds, trace[:, 3 + k], label="measured", alpha=0.8)
        axis.set_ylabel(label, fontsize=8)
    axes[0].legend(fontsize=8)
    axes[0].set_title(title, fontsize=9)
    axes[-1].set_xlabel("time (s)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    print(f"wrote {path}")


SPEED_BINS = [0.0, 0.5, 1.0, np.inf]  # commanded |(vx, vy)|, m/s (Go1's reach 1.7)
VX_BINS = [-np.inf, -0.25, 0.25, np.inf]  # commanded vx: backward, in place or sideways, forward
GOALS = {"tracking_lin_vel": 0.75, "tracking_ang_vel": 0.4}  # issue #43's, per step


def binned(points: list[tuple[int, float]], bin_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(each bin's middle step, the mean of the values logged in it), bins with values only."""
    steps, values = np.array(points, dtype=float).reshape(-1, 2).T
    bins = (steps // bin_steps).astype(int)
    filled = np.unique(bins)
    means = np.array([values[bins == b].mean() for b in filled])
    return (filled + 0.5) * bin_steps, means


def plot_curves(run_dirs: tuple[str, ...], labels: tuple[str, ...], bin_steps: int, path: str):
    """Each run's training tracking terms, binned, against the goal; returns what it drew."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from run import scalars

    drawn = {}
    figure, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for axis, (term, goal) in zip(axes, GOALS.items()):
        for run_dir, label in zip(run_dirs, labels):
            steps, means = binned(scalars(run_dir, f"reward_terms/{term}"), bin_steps)
            drawn[(label, term)] = (steps, means)
            axis.plot(steps / 1e6, means, label=label)
        axis.axhline(goal, color="black", linestyle="--", label="goal")
        axis.set_title(f"{term} per step, training episodes", fontsize=9)
        axis.set_xlabel("env steps (M)")
    axes[0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    print(f"wrote {path}")
    return drawn


def main(args: Args):
    if len(args.labels) != len(args.curves):
        raise SystemExit("error: --labels needs one label per --curves directory")
    if len(args.commands) % 3 or not args.commands:
        raise SystemExit("error: --commands takes vx vy yaw-rate triples, e.g. 0.8 0 0 0 0 1")
    if len(args.gif) not in (0, 2):
        raise SystemExit("error: --gif takes a video and the GIF to write: --gif VIDEO GIF")
    if args.gif:
        write_gif(*args.gif)
    if args.curves:
        plot_curves(args.curves, args.labels, args.bin_steps, args.curves_plot)
    for std in args.drift_stds:
        vx, vy, zero = drift(std)
        print(f"Go1JoystickFlatTerrain-v1, random actions of std {std}: mean base velocity "
              f"vx {vx:+.3f} m/s, vy {vy:+.3f} m/s; reward exactly 0 in {zero:.0%} of the "
              "steps")  # fmt: skip
    rows, notes = [], []
    for k, path in enumerate(args.checkpoints):
        script, ckpt, agent = load(path)
        result = evaluate(script, ckpt, agent, args.episodes, trace=False)
        rows.append(row_of(ckpt, script, result, args.wall_seconds[k : k + 1]))
        notes += (
            [f"{path}:"] + [f"  {line}" for line in breakdown(result)]
            if "commands" in result
            else []
        )
        if args.plot and k == 0 and ckpt["env_id"].startswith("Go1Joystick"):  # its slots
            commands = np.array(args.commands).reshape(-1, 3)
            trace = follow(script, ckpt, agent, commands, args.command_seconds)
            notes += [f"{path}, driven by --commands:"] + [f"  {line}" for line in followed(trace)]
            name = f"{ckpt['script']}-{ckpt['env_id']}-velocity.png"
            title = f"{ckpt['script']}.py, {ckpt['env_id']}, step {ckpt['global_step']}"
            plot(trace, os.path.join(HERE, "plots", name), title)
    if rows:
        print(table(rows))
    print("\n".join(notes))
    if args.record and rows:
        record(rows, args.output)


def write_gif(video: str, path: str):
    """Steps 100-349 of a filmed episode (5 s at the robots' 50 steps a second), every 5th frame
    shown for 0.1 s: real time, 200 px and 64 colours, small enough for a README."""
    from PIL import Image

    frames = [Image.fromarray(frame).resize((200, 200), Image.LANCZOS).quantize(64)
              for frame in imageio.v3.imread(video)[100:350:5]]  # fmt: skip
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=100, loop=0)
    print(f"wrote {path}: {len(frames)} frames of {video}")


def row_of(ckpt: dict, script, result: dict, wall_seconds: tuple) -> dict:
    """A checkpoint's row: the run's settings, then what its robot did on the stock task."""
    terms = result["terms"]
    forward = ""
    if "commands" in result:  # Go1: the linear tracking of the steps sent forward
        forward = round(float(result["tracking"][result["commands"][:, 0] > FORWARD].mean()), 3)
    return {
        "script": f"{ckpt['script']}.py",
        "env_id": ckpt["env_id"],
        "seed": ckpt["args"]["seed"],
        "total_timesteps": ckpt["global_step"],
        "flags": flags_of(ckpt, script),
        "eval_return": round(float(result["returns"].mean()), 2),
        "eval_tracking_lin_vel": round(float(terms["tracking_lin_vel"].mean()), 3),
        "eval_tracking_ang_vel": round(float(terms["tracking_ang_vel"].mean()), 3),
        "eval_length": round(float(result["lengths"].mean()), 1),
        "eval_falls": int(result["falls"].sum()),
        "wall_seconds": wall_seconds[0] if wall_seconds else "",
        "eval_episodes": len(result["returns"]),
        "eval_tracking_forward": forward,
    }


def table(rows: list[dict]) -> str:
    """The rows as an aligned table with a header: what each robot did (the flags: --record)."""
    shown = {"script": "script", "env_id": "task", "seed": "seed", "total_timesteps": "steps",
             "eval_return": "return", "eval_tracking_lin_vel": "linear tracking",
             "eval_tracking_forward": "forward tracking", "eval_tracking_ang_vel": "yaw tracking",
             "eval_length": "length", "eval_falls": "falls"}  # fmt: skip
    cells = [list(shown.values())]
    for row in rows:
        cells.append([str(row[key]) for key in shown])
        cells[-1][-1] = f"{row['eval_falls']} of {row['eval_episodes']}"
    widths = [max(len(line[i]) for line in cells) for i in range(len(shown))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)) for line in cells)


def record(rows: list[dict], output: str):
    """Append the rows to output (robots.csv) and their returns to results.csv beside it."""
    new = not os.path.exists(output)
    with open(output, "a", newline="") as file:
        writer = csv.DictWriter(file, COLUMNS)
        if new:
            writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(os.path.dirname(output), "results.csv"), "a", newline="") as file:
        for row in rows:  # results.csv's columns: no final_return or SPS for these rows
            values = [row["script"], row["env_id"], row["seed"], row["total_timesteps"]]
            values += [row["flags"], "", row["eval_return"], "", "", row["wall_seconds"]]
            csv.writer(file).writerow([*values, datetime.date.today().isoformat()])
    print(f"appended {len(rows)} row{'s' * (len(rows) != 1)} to {output} and the results.csv "
          "beside it")  # fmt: skip


if __name__ == "__main__":
    main(tyro.cli(Args))
