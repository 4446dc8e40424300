"""The robots' training options, on real Go1 pools and runs: --robot-reward builds the reward from
the env's own terms (the sum, or legged_gym's clip before the termination term),
--command-curriculum widens the linear command ranges as the robot tracks them and resumes where
it was, and evaluation runs the stock task whatever the training used. Also the robot measures
(tracking, falls, length) of the progress and evaluation lines."""

import dataclasses
import importlib
import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from conftest import (
    ALL_SCRIPTS,
    ROOT,
    allow_toy_env,
    flags,
    only_checkpoint,
    read_events,
    small_args,
)

envpool = pytest.importorskip("envpool")

GO1 = "Go1JoystickFlatTerrain-v1"
SCRIPTS = [importlib.import_module(name) for name in [*ALL_SCRIPTS, "ppo_teacher_student"]]
WITH_OPTIONS = [script.__name__ for script in SCRIPTS if hasattr(script.Args, "command_curriculum")]


def go1_args(script, log_dir, **overrides):
    """2 envs x 64 steps on Go1, 2 iterations, one evaluation episode."""
    return small_args(script, log_dir, env_id=GO1, env_backend="envpool", **overrides)


@pytest.fixture(scope="module")
def go1_teacher(tmp_path_factory) -> str:
    """A short Go1 teacher (its actor on [state | privileged_state]) for ppo_teacher_student's
    runs, trained once: its checkpoint."""
    teacher, folder = importlib.import_module("ppo_continuous"), tmp_path_factory.mktemp("teacher")
    teacher.train(go1_args(teacher, folder, privileged_actor=True))
    return only_checkpoint(folder)


def stock_terms(info: dict) -> dict:
    return {key: np.asarray(value, dtype=np.float64) for key, value in info.items()
            if key.startswith("reward_")}  # fmt: skip


@pytest.mark.parametrize("name", WITH_OPTIONS)
@pytest.mark.parametrize("mode", ["env", "unclipped", "legged-gym"])
def test_the_robot_reward_is_built_from_the_envs_own_terms(name, mode):
    """Step by step against the pool's own numbers, in every script's adapter: unclipped is 0.02 x
    the sum of the 16 terms (negative on most exploring steps), legged-gym clips the sum without
    the termination term at 0 and adds that term; where the env's reward was not clipped, both
    equal it."""
    script = importlib.import_module(name)
    envs = script.make_envs(GO1, 8, "envpool", **({} if mode == "env" else {"reward": mode}))
    envs.reset(seed=0)
    pool_step, raw = envs.pool.step, []
    envs.pool.step = lambda actions: raw.append(pool_step(actions)) or raw[-1]
    rng, negative, falls = np.random.default_rng(0), 0, 0
    for _ in range(120):
        _, reward, terminated, _, _ = envs.step(np.clip(rng.normal(0, 0.5, (8, 12)), -1, 1))
        _, env_reward, _, _, info = raw[-1]
        terms = stock_terms(info)
        assert len(terms) == 16
        total = 0.02 * sum(terms.values())
        expected = {"env": env_reward, "unclipped": total}.get(mode)
        if mode == "legged-gym":
            termination = 0.02 * terms["reward_termination"]
            expected = np.maximum(total - termination, 0) + termination
        np.testing.assert_allclose(reward, expected, rtol=1e-6, atol=1e-7)
        inside = env_reward > 0
        np.testing.assert_allclose(total[inside], env_reward[inside], rtol=1e-4, atol=1e-6)
        negative += int(np.sum(reward < 0))
        falls += int(terminated.sum())
    envs.close()
    assert falls > 0 and (negative > 0) == (mode != "env")


def test_a_reward_that_is_not_the_sum_of_its_terms_is_refused_in_one_line():
    script = importlib.import_module("ppo_continuous")
    with pytest.raises(SystemExit, match="this task's reward is not 0.02 x the sum of its"):
        script.robot_reward({"reward_a": np.array([1.0])}, np.array([0.5]), "unclipped", 0.02)


def episodes(tracking: list[float]) -> dict:
    return {"episodes": [{"terms": {"tracking_lin_vel": value}} for value in tracking]}


def test_the_curriculum_widens_by_a_quarter_once_the_last_episodes_track_and_stops_at_the_task():
    """Widens only with num_envs episodes at the current range, on the mean of the last num_envs
    of them (>= 0.75), by 0.25, to 1 (the task's own ranges) and never past it."""
    script = importlib.import_module("ppo_continuous")
    args = script.Args(num_envs=4, command_curriculum=True)
    assert script.CURRICULUM == (0.5, 0.25, 0.75)
    for tracking, widens in [
        ([0.9, 0.9, 0.9], False),  # 3 episodes, fewer than num_envs
        ([0.9, 0.9, 0.9, 0.74], True),  # mean 0.86
        ([0.1, 0.75, 0.75, 0.75, 0.75], True),  # the last 4: the first is older
        ([0.9, 0.74, 0.74, 0.74, 0.74], False),
    ]:
        progress = {"command_scale": 0.5}
        assert script.widen_commands(episodes(tracking), progress, args) == widens, tracking
        assert progress["command_scale"] == (0.75 if widens else 0.5)
    progress = {"command_scale": 0.5}
    for expected in (0.75, 1.0, 1.0):
        script.widen_commands(episodes([1.0] * 4), progress, args)
        assert progress["command_scale"] == expected
    assert not script.widen_commands(episodes([1.0] * 4), progress, args)


def test_the_command_ranges_are_the_tasks_times_the_scale():
    script = importlib.import_module("ppo_continuous")
    assert script.commands_at(GO1, 0.5) == {"command_a0": 0.75, "command_a1": 0.4}
    humanoid = script.commands_at("BerkeleyHumanoidJoystickFlatTerrain-v1", 0.75)
    assert humanoid == {"lin_vel_x_min": -0.75, "lin_vel_x_max": 0.75, "lin_vel_y_min": -0.75,
                        "lin_vel_y_max": 0.75}  # fmt: skip


def recording_pools(script, monkeypatch) -> list[dict]:
    """Every pool the adapter makes: who made it (evaluate or not), its make-time command ranges
    and its reward mode."""
    made, reset = [], script.EnvPoolVectorEnv.reset

    def recorded_reset(self, seed, options=None):
        result = reset(self, seed, options)
        config = self.pool.spec.config
        evaluating = any(frame.function == "evaluate" for frame in __import__("inspect").stack())
        made.append({"evaluate": evaluating, "a0": config.command_a0, "a1": config.command_a1,
                     "reward": self.reward, "seed": seed})  # fmt: skip
        return result

    monkeypatch.setattr(script.EnvPoolVectorEnv, "reset", recorded_reset)
    return made


@pytest.mark.parametrize("name", [name for name in WITH_OPTIONS if name != "appo_vtrace"])
def test_a_curriculum_run_widens_saves_and_resumes_at_its_range_and_evaluates_the_stock_task(
    name, tmp_path, monkeypatch, request
):
    """A real run with --command-curriculum (its threshold 0: it widens at every chance) and
    --robot-reward unclipped: its training pools go 0.75 -> 1.125 -> 1.5 m/s for vx (0.4 -> 0.6
    -> 0.8 for vy) and never past; the checkpoint saves the scale and a resume makes its pools
    there; every evaluation pool (periodic, final, --eval-checkpoint) is the stock task with the
    env's own reward."""
    script = importlib.import_module(name)
    allow_toy_env(script, monkeypatch)
    options = dict(command_curriculum=True, robot_reward="unclipped", eval_every=1)
    if name == "ppo_teacher_student":  # a student needs a Go1 teacher: a short one
        options.update(teacher=request.getfixturevalue("go1_teacher"), history=2)
    monkeypatch.setattr(script, "CURRICULUM", (0.5, 0.25, 0.0))
    made = recording_pools(script, monkeypatch)
    log_dir = tmp_path / "run"
    args = go1_args(script, log_dir, total_timesteps=512, num_steps=128, init_logstd=0.5, **options)
    script.train(args)
    training = [pool for pool in made if not pool["evaluate"]]
    ranges = [(pool["a0"], pool["a1"]) for pool in training]
    np.testing.assert_allclose(ranges[:2], [(0.75, 0.4), (1.125, 0.6)])
    assert max(ranges) <= (1.5, 0.8)
    assert all(pool["reward"] == "unclipped" for pool in training)
    evaluation = [pool for pool in made if pool["evaluate"]]
    teacher = name == "ppo_teacher_student"  # a student also evaluates its teacher first
    assert len(evaluation) == 3 + teacher  # after each iteration (--eval-every 1), the final one
    assert all((p["a0"], p["a1"], p["reward"]) == (1.5, 0.8, "env") for p in evaluation)
    checkpoint = only_checkpoint(log_dir)
    ckpt = script.load_checkpoint(checkpoint)
    scale = ckpt["command_scale"]
    assert scale in (0.75, 1.0) and 1.5 * scale == pytest.approx(training[-1]["a0"])
    events = read_events(os.path.dirname(checkpoint))
    logged = [point.value for point in events.Scalars("charts/command_scale")]
    np.testing.assert_allclose(logged, [a0 / 1.5 for a0, _ in ranges[:2]])  # each iteration's
    made.clear()
    resumed = dataclasses.replace(script.saved_args(ckpt), resume=checkpoint, total_timesteps=768)
    script.train(resumed)
    first = next(pool for pool in made if not pool["evaluate"])
    assert first["a0"] == pytest.approx(1.5 * scale) and first["seed"] == args.seed + 512
    made.clear()
    script.train(script.Args(eval_checkpoint=checkpoint, eval_episodes=1, env_id=GO1,
                             env_backend="envpool"))  # fmt: skip
    assert made and all((p["a0"], p["reward"]) == (1.5, "env") for p in made)


NO_COMMANDS = [  # the options on tasks without commands: gymnasium's Hopper, and EnvPool's
    dict(command_curriculum=True),
    dict(robot_reward="unclipped"),
    dict(robot_reward="legged-gym", env_backend="envpool", env_id="Hopper-v5"),
]


@pytest.mark.parametrize("name", WITH_OPTIONS)
def test_the_robot_options_on_a_task_without_commands_are_one_line(name):
    """Each option on a task without commands is refused before anything runs; on the command
    line (one case per script, each case in two scripts) in one line of stderr, exit code 1."""
    script = importlib.import_module(name)
    refusal = "error: --robot-reward and --command-curriculum train EnvPool"
    for fields in NO_COMMANDS:
        with pytest.raises(SystemExit, match=f"^{refusal}"):
            script.train(script.Args(**fields))
    words = flags(**NO_COMMANDS[WITH_OPTIONS.index(name) % len(NO_COMMANDS)])
    result = subprocess.run([sys.executable, f"{name}.py", *words], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(refusal)
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", WITH_OPTIONS)
def test_the_progress_and_evaluation_lines_say_what_the_robot_does(name, tmp_path, capsys, request):
    """Go1, in every script: the progress line, the final evaluation and --eval-checkpoint give the
    tracking, the falls and the mean length of their episodes, recomputed here from the
    TensorBoard points (the progress line: the last 10 training episodes)."""
    script, options = importlib.import_module(name), {}
    if name == "ppo_teacher_student":  # a student needs a Go1 teacher: a short one
        options.update(teacher=request.getfixturevalue("go1_teacher"), history=2)
    fields = dict(num_envs=4, num_steps=128, total_timesteps=1024, eval_episodes=2)
    capsys.readouterr()
    script.train(go1_args(script, tmp_path / "run", init_logstd=0.5, **fields, **options))
    lines = capsys.readouterr().out.splitlines()
    events = read_events(os.path.dirname(only_checkpoint(tmp_path / "run")))
    lin = [p.value for p in events.Scalars("reward_terms/tracking_lin_vel")][-10:]
    yaw = [p.value for p in events.Scalars("reward_terms/tracking_ang_vel")][-10:]
    lengths = [p.value for p in events.Scalars("charts/episodic_length")][-10:]
    falls = sum(length < 1000 for length in lengths)  # a Go1 episode ends early by a fall only
    expected = f"| tracking lin {np.mean(lin):.3f} yaw {np.mean(yaw):.3f} | falls {falls} of "
    expected += f"{len(lin)} | length {np.mean(lengths):.0f}"
    progress = [line for line in lines if line.startswith("iter ")][-1]
    assert progress.startswith("iter 2/2 | step 1024 | return ") and expected in progress
    final = lines[-1]
    assert final.startswith("deterministic eval over 2 episodes: ") and "| falls " in final
    checkpoint = only_checkpoint(tmp_path / "run")
    script.train(script.Args(eval_checkpoint=checkpoint, eval_episodes=2, env_id=GO1,
                             env_backend="envpool"))  # fmt: skip
    measures = final.split(": ", 1)[1].split("; checkpoint")[0].split(" | ", 1)[1]
    measures = measures.split(" | teacher ")[0]  # a student's run also says its teacher's return
    assert capsys.readouterr().out.splitlines()[-1].endswith(measures)  # "tracking ... length N"


def test_a_task_without_commands_keeps_its_progress_line(tmp_path):
    hopper = subprocess.run(
        [sys.executable, "ppo_continuous.py", "--total-timesteps", "2048", "--num-envs", "1",
         "--eval-episodes", "1", "--log-dir", str(tmp_path / "h")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert hopper.returncode == 0 and "return" in hopper.stdout
    assert "tracking" not in hopper.stdout and "falls" not in hopper.stdout


class RecordingConn:
    """An actor's pipe, as the learner reads it, keeping every rollout that came through."""

    def __init__(self, conn, received: list):
        self.conn, self.received = conn, received

    def fileno(self):  # multiprocessing.connection.wait
        return self.conn.fileno()

    def recv(self):
        self.received.append(self.conn.recv())
        return self.received[-1]

    def close(self):
        self.conn.close()


def test_appo_actors_make_their_envs_at_the_scale_the_learner_publishes(tmp_path, monkeypatch):
    """appo_vtrace.py: the learner decides (its threshold 0 here: at every chance) and publishes
    the scale; each actor's rollouts say at which scale they ran, and every command they observed
    (Go1's state[45:47]) lies in that scale's ranges; the actors' rewards are the unclipped sum
    (negative where exploring costs more than it pays); the checkpoint and a resume keep it."""
    appo = importlib.import_module("appo_vtrace")
    monkeypatch.setattr(appo, "CURRICULUM", (0.5, 0.25, 0.0))
    received, start_actors = [], appo.start_actors

    def recording_start_actors(*args):
        actors = start_actors(*args)
        actors["conns"] = [RecordingConn(conn, received) for conn in actors["conns"]]
        return actors

    monkeypatch.setattr(appo, "start_actors", recording_start_actors)
    options = dict(command_curriculum=True, robot_reward="unclipped", init_logstd=0.5)
    args = go1_args(appo, tmp_path, total_timesteps=768, num_steps=128, **options)
    appo.train(args)
    scales = [rollout["command_scale"] for rollout in received]
    assert scales == sorted(scales) and scales[0] == 0.5 and max(scales) >= 0.75
    for rollout in received:
        commands, scale = rollout["obs"][..., 45:47].reshape(-1, 2), rollout["command_scale"]
        assert (np.abs(commands) <= [1.5 * scale, 0.8 * scale]).all()
    assert min(rollout["rewards"].min() for rollout in received) < 0
    ckpt = appo.load_checkpoint(only_checkpoint(tmp_path))
    assert ckpt["command_scale"] == 1.0  # 0.5, 0.75, 1.0: a widening after each update
    received.clear()
    resumed = dataclasses.replace(appo.saved_args(ckpt), resume=only_checkpoint(tmp_path),
                                  total_timesteps=1024)  # fmt: skip
    appo.train(resumed)
    assert received and all(rollout["command_scale"] == 1.0 for rollout in received)


class FallsInEnv0:
    """A policy for evaluate(): env 0 has every joint at +1 (the Go1 falls), the others stand."""

    actor_logstd = torch.zeros(12)

    def mean_action(self, obs):
        action = torch.zeros(obs.shape[0], 12)
        action[0] = 1.0
        return action


@pytest.mark.parametrize("name", WITH_OPTIONS)
def test_evaluation_records_each_env_s_first_episode_even_when_it_ends_twice(name, monkeypatch):
    """evaluate()'s records against the pool's own flags and terms, with a time limit of 100
    steps: env 0 falls (and falls again) before the others reach the limit; its record is its
    first episode's (return, length, fell, reward terms), the others' are not falls."""
    script = importlib.import_module(name)
    make_envs, seen, step = script.make_envs, [], script.EnvPoolVectorEnv.step
    monkeypatch.setattr(
        script, "make_envs", lambda *a, **kw: make_envs(*a, max_episode_steps=100, **kw)
    )

    def recorded_step(self, actions):
        seen.append(step(self, actions))
        return seen[-1]

    monkeypatch.setattr(script.EnvPoolVectorEnv, "step", recorded_step)
    args = script.Args(env_id=GO1, env_backend="envpool", eval_episodes=3)
    episodes, _ = script.evaluate(FallsInEnv0(), args, None, "unused")
    ends = [[t for t, result in enumerate(seen) if result[2][i] or result[3][i]] for i in range(3)]
    assert len(ends[0]) >= 2 and ends[0][1] < ends[1][0] == ends[2][0] == 99
    for i, record in enumerate(episodes):
        first = ends[i][0]
        assert record["length"] == first + 1 and record["fell"] == (i == 0)
        assert record["return"] == pytest.approx(sum(r[1][i] for r in seen[: first + 1]))
        terms = seen[first][4]["reward_terms"]
        assert record["terms"] == {key: value[i] for key, value in terms.items()}


@pytest.mark.parametrize("name", WITH_OPTIONS)
def test_a_checkpoint_from_before_the_curriculum_resumes_at_the_task_s_ranges(
    name, tmp_path, request
):
    """A checkpoint saved before command_scale existed (the key removed here) resumed with
    --command-curriculum goes on at the task's full ranges (scale 1): its resumed iterations log
    1.0 and its checkpoint saves it."""
    script, options = importlib.import_module(name), {}
    if name == "ppo_teacher_student":  # a student needs a Go1 teacher: a short one
        options.update(teacher=request.getfixturevalue("go1_teacher"), history=2)
    script.train(go1_args(script, tmp_path / "run", **options))
    checkpoint = only_checkpoint(tmp_path / "run")
    old = torch.load(checkpoint, weights_only=True)
    del old["command_scale"]
    torch.save(old, checkpoint)
    ckpt = script.load_checkpoint(checkpoint)
    resumed = dataclasses.replace(script.saved_args(ckpt), resume=checkpoint, total_timesteps=512,
                                  command_curriculum=True)  # fmt: skip
    script.train(resumed)
    events = read_events(os.path.dirname(checkpoint))
    assert [point.value for point in events.Scalars("charts/command_scale")] == [1.0, 1.0]
    assert script.load_checkpoint(checkpoint)["command_scale"] == 1.0


CURRICULUM_OF_EACH_RANK = """
import os, sys, torch.distributed as dist, ppo_ddp
widen, reset = ppo_ddp.widen_commands, ppo_ddp.EnvPoolVectorEnv.reset

def say(line):  # one write of the whole line: the ranks share torchrun's stdout
    os.write(sys.__stdout__.fileno(), f"{line}\\n".encode())

def widen_commands(carry, progress, args):
    for episode in carry["episodes"]:  # rank 1 tracks perfectly, rank 0 not at all
        episode["terms"]["tracking_lin_vel"] = float(ppo_ddp.rank() == 1)
    ppo_ddp.CURRICULUM = (0.5, 0.25, 0.75 if progress["iteration"] == 1 else 0.4)
    widened = widen(carry, progress, args)
    scale = progress["command_scale"]
    say(f"rank {ppo_ddp.rank()} iteration {progress['iteration']} scale {scale}")
    return widened

def recorded_reset(self, seed, options=None):
    result = reset(self, seed, options)
    if seed < 10000:  # not an evaluation's
        say(f"rank {ppo_ddp.rank()} pool {seed} {self.pool.spec.config.command_a0}")
    return result

ppo_ddp.widen_commands, ppo_ddp.EnvPoolVectorEnv.reset = widen_commands, recorded_reset
try:
    ppo_ddp.train(ppo_ddp.parse_args(sys.argv[1:]))
finally:
    dist.destroy_process_group()
"""


def test_ddp_ranks_widen_together_on_their_mean_tracking(tmp_path):
    """ppo_ddp.py, 2 ranks on Go1 with --command-curriculum: rank 1's episodes track perfectly,
    rank 0's not at all (set here). On their mean (0.5) both ranks keep their ranges below the
    first iteration's threshold of 0.75 (rank 1 alone would widen), and both widen above the
    second's of 0.4; each rank's pools start at its own seeds and are remade at the new ranges."""
    from conftest import torchrun

    driver = tmp_path / "curriculum_of_each_rank.py"
    driver.write_text(CURRICULUM_OF_EACH_RANK)
    fields = dict(env_id=GO1, env_backend="envpool", num_envs=2, num_steps=64, total_timesteps=512)
    fields.update(num_minibatches=2, update_epochs=1, eval_episodes=1, init_logstd=0.5)
    fields.update(command_curriculum=True, log_dir=str(tmp_path / "runs"))
    proc = torchrun(str(driver), *flags(**fields))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    decided = sorted(re.findall(r"rank (\d) iteration (\d) scale (\S+)", out))
    assert decided == [("0", "1", "0.5"), ("0", "2", "0.75"), ("1", "1", "0.5"), ("1", "2", "0.75")]
    pools = sorted(re.findall(r"rank (\d) pool (\d+) (\S+)", out))
    first = {rank: seed for rank, seed, _ in pools if seed in ("1", "3")}
    assert first == {"0": "1", "1": "3"}  # seed + rank * num_envs: their own episodes
    remade = [(rank, float(a)) for rank, seed, a in pools if seed not in ("1", "3")]
    assert sorted(remade) == [("0", 1.125), ("1", 1.125)]  # once, after the second iteration


def test_appo_rollouts_carry_the_scale_they_ran_at_and_the_learner_keeps_the_current_ones(
    tmp_path, monkeypatch
):
    """appo_vtrace.py's two sides of the curriculum. An actor (run here, in this process) whose
    learner publishes a wider scale while a rollout is under way tags that rollout with the scale
    its envs ran at, and makes new envs for the next; the learner keeps, for the next decision,
    only the episodes of rollouts run at its current scale."""
    import multiprocessing

    from conftest import RecordingWriter

    appo = importlib.import_module("appo_vtrace")
    monkeypatch.setattr(appo.os, "setpgid", lambda *args: None)  # the actor's own group
    ctx = multiprocessing.get_context("spawn")
    scale, version, lock = ctx.RawValue("d", 0.5), ctx.RawValue("q", 0), ctx.Lock()
    args = go1_args(appo, tmp_path, command_curriculum=True, num_steps=16, init_logstd=0.5)
    agent = appo.Agent(171, 12, args, 48)
    weights = {key: value.clone() for key, value in agent.state_dict().items()}
    collect, made = appo.collect_rollout, []

    def collect_while_widening(*rest):  # the learner widens during the actor's first rollout
        rollout = collect(*rest)
        scale.value = 0.75
        return rollout

    monkeypatch.setattr(appo, "collect_rollout", collect_while_widening)
    reset = appo.EnvPoolVectorEnv.reset
    monkeypatch.setattr(appo.EnvPoolVectorEnv, "reset", lambda self, seed, options=None: (
        made.append(options["command_a0"]), reset(self, seed, options))[1])  # fmt: skip
    sent = []

    class Pipe:  # the learner's end: gone after two rollouts
        def send(self, rollout):
            sent.append(rollout)
            if len(sent) == 2:
                raise BrokenPipeError

    appo.actor_process(0, args, weights, lock, version, Pipe(), 0, scale)
    assert [rollout["command_scale"] for rollout in sent] == [0.5, 0.75]
    assert made == [0.75, 1.125]  # new envs at the published scale, before the second rollout
    # The learner, at scale 0.75, receives a rollout of each scale.
    reader, writer = ctx.Pipe(duplex=False)
    episodes = [{"return": 1.0, "length": 5, "fell": True, "terms": {"tracking_lin_vel": k}}
                for k in range(2)]  # fmt: skip
    messages = [{**ro, "episodes": [e], "rollout_time": 0.1, "send_wait": 0.0}
                for ro, e in zip(sent, episodes)]  # fmt: skip
    threading.Thread(target=lambda: [writer.send(message) for message in messages]).start()
    actors = {"conns": [reader], "procs": [], "version": version, "command_scale": scale}
    actors["episodes"] = []
    args = dataclasses.replace(args, num_rollouts=2)
    appo.receive_rollouts(agent, agent, appo.RunningMeanStd(), actors, 0, RecordingWriter(), args)
    assert [e["terms"]["tracking_lin_vel"] for e in actors["episodes"]] == [1]
