"""Robots (EnvPool's MuJoCo Playground tasks): a Dict observation of what the robot senses (`state`)
and what only the simulator knows (`privileged_state`). The scripts lay it flat as [state |
privileged_state]; the actor reads state, the critic privileged_state (--asymmetric-critic), each
column normalized by its own statistics; the export takes state only. Checked on real short runs
of Go1JoystickFlatTerrain-v1."""

import dataclasses
import importlib
import json
import os
import re
import shutil
import subprocess
import sys

import imageio.v3
import numpy as np
import pytest
import torch
from conftest import ALL_SCRIPTS, ROOT, allow_toy_env, only_checkpoint, read_events, small_args

pytest.importorskip("envpool")

GO1 = "Go1JoystickFlatTerrain-v1"
STATE, PRIVILEGED = 48, 123  # Go1's sizes (privileged_state starts with state)


def go1_args(script, log_dir, **overrides):
    """small_args on Go1: 2 envs x 64 steps, 2 iterations, one evaluation episode."""
    return small_args(script, log_dir, env_id=GO1, env_backend="envpool", **overrides)


def recording(script, monkeypatch):
    """Records what the env gives (each Dict obs, before it is laid flat) and what the actor's
    and the critic's first layers receive, in every call of a run."""
    seen = {"state": [], "privileged_state": [], "actor": [], "critic": []}
    flat = script.EnvPoolVectorEnv.flat

    def recorded_flat(self, obs):
        for key in ("state", "privileged_state"):
            seen[key].append(np.asarray(obs[key], dtype=np.float32).copy())
        return flat(self, obs)

    class RecordingAgent(script.Agent):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            for name in ("actor", "critic"):
                layer = (self.actor_mean if name == "actor" else self.critic)[0]
                layer.register_forward_pre_hook(
                    lambda module, inputs, name=name: seen[name].append(inputs[0].detach().clone())
                )

    monkeypatch.setattr(script.EnvPoolVectorEnv, "flat", recorded_flat)
    monkeypatch.setattr(script, "Agent", RecordingAgent)
    return seen


def rows(arrays) -> set:
    return {row.tobytes() for array in arrays for row in np.asarray(array, dtype=np.float32)}


@pytest.mark.parametrize(
    "name, asymmetric",
    [("ppo_continuous", True), ("ppo_spo", True), ("ppo_symaug", True), ("ppo_ddp", True)]
    + [("ppo_continuous", False)],
)
def test_the_actor_reads_state_and_the_critic_privileged_state_on_a_real_run(
    name, asymmetric, tmp_path, monkeypatch
):
    """Every input the actor got in rollout, update and evaluation is a state the env gave; every
    input of the critic a privileged_state (a state with --no-asymmetric-critic). No normalizer,
    so that the inputs are the env's numbers."""
    script = importlib.import_module(name)
    allow_toy_env(script, monkeypatch)  # ppo_symaug: the identity is a symmetry of every env
    seen = recording(script, monkeypatch)
    script.train(go1_args(script, tmp_path, norm_obs=False, asymmetric_critic=asymmetric))
    states, privileged = rows(seen["state"]), rows(seen["privileged_state"])
    actor, critic = (torch.cat([x.flatten(0, -2) for x in seen[k]]) for k in ("actor", "critic"))
    actor, critic = actor.numpy(), critic.numpy()
    assert actor.shape[1] == STATE and len(actor) > 256  # rollout, update and evaluation
    assert rows([actor]) <= states
    assert critic.shape[1] == (PRIVILEGED if asymmetric else STATE)
    unused = rows([np.zeros_like(critic[:1])])  # V(final_obs) is computed for every row, and used
    assert rows([critic]) <= (privileged if asymmetric else states) | unused  # where truncated


@pytest.mark.parametrize("name", [*ALL_SCRIPTS, "ppo_symaug:network"])
def test_a_privileged_actor_reads_state_and_privileged_state_and_keeps_it_on_resume(
    name, tmp_path, monkeypatch
):
    """--privileged-actor (a teacher for ppo_teacher_student.py), in every script: every input the
    actor got is a whole [state | privileged_state] the env gave (ppo_symaug.py's: or its mirror
    image, by Go1's own map, with --symmetry network too); the checkpoint says so, a resume keeps
    it. appo_vtrace.py's rollouts are its actor processes': its learner's inputs are as wide."""
    name, _, symmetry = name.partition(":")
    script = importlib.import_module(name)
    seen = recording(script, monkeypatch)
    options = dict(symmetry=symmetry) if symmetry else {}
    script.train(
        go1_args(script, tmp_path / "run", norm_obs=False, privileged_actor=True, **options)
    )
    pairs = zip(seen["state"], seen["privileged_state"])
    whole = np.concatenate([np.concatenate(pair, -1) for pair in pairs])
    actor = torch.cat([x.flatten(0, -2) for x in seen["actor"]]).numpy()
    assert actor.shape[1] == STATE + PRIVILEGED and len(actor) > 256
    if name == "ppo_symaug":  # the augmented minibatches, the symmetric network's second pass
        mirror_obs = script.make_mirror_fns(GO1)[0]
        parts = {"state": STATE, "privileged_state": PRIVILEGED}
        mirrored = script.flat_mirror(mirror_obs, parts)(torch.as_tensor(whole)).numpy()
        assert rows([actor]) <= rows([whole, mirrored])
        assert not rows([actor]) <= rows([whole])  # the mirror images are there
    elif name != "appo_vtrace":
        assert rows([actor]) <= rows([whole])
    checkpoint = only_checkpoint(tmp_path / "run")
    ckpt = script.load_checkpoint(checkpoint)
    assert ckpt["actor_dim"] == STATE + PRIVILEGED and ckpt["args"]["privileged_actor"]
    assert ckpt["agent"]["actor_mean.0.weight"].shape[1] == STATE + PRIVILEGED
    args = dataclasses.replace(script.saved_args(ckpt), resume=checkpoint, total_timesteps=512)
    with pytest.raises(SystemExit, match="--privileged-actor cannot change on resume"):
        script.train(dataclasses.replace(args, privileged_actor=False))


def test_the_adapter_lays_the_dict_flat_and_averages_each_reward_term_over_its_episode():
    """EnvPoolVectorEnv against the pool's own numbers: obs is [state | privileged_state]
    (final_obs too), and at an episode's end info["reward_terms"][name] is the mean of that
    term over the episode's steps, as the pool reported them step by step."""
    script = importlib.import_module("ppo_continuous")
    envs = script.make_envs(GO1, 3, "envpool")
    assert (envs.actor_dim, envs.single_observation_space.shape) == (STATE, (STATE + PRIVILEGED,))
    obs, _ = envs.reset(seed=0)
    raw, step = [], envs.pool.step  # the pool that reset made

    def recorded_step(actions):
        result = step(actions)
        raw.append(result)
        return result

    envs.pool.step = recorded_step
    sums, lengths, ended = np.zeros((3,)), np.zeros(3), 0
    rng = np.random.default_rng(0)
    for _ in range(150):
        obs, _, terminated, truncated, info = envs.step(rng.uniform(-1, 1, (3, 12)))
        pool_obs, _, _, _, pool_info = raw[-1]
        sums += pool_info["reward_tracking_ang_vel"]
        lengths += 1
        done = np.flatnonzero(terminated | truncated)
        last = np.concatenate([pool_obs["state"], pool_obs["privileged_state"]], -1)
        if done.size:
            np.testing.assert_array_equal(info["final_obs"][done], last[done])
            expected = sums[done] / lengths[done]
            np.testing.assert_allclose(info["reward_terms"]["tracking_ang_vel"][done], expected)
            sums[done], lengths[done], ended = 0, 0, ended + done.size
        live = np.setdiff1d(np.arange(3), done)
        np.testing.assert_array_equal(obs[live], last[live])
    envs.close()
    assert ended >= 3  # random actions fall within 150 steps


def test_every_script_trains_a_robot_and_saves_each_inputs_normalizer(script, tmp_path):
    """Two iterations of each script on Go1: finite losses; each reward term logged per episode
    (reward_terms/<name>: its mean per step); a checkpoint whose normalizer covers both inputs,
    each column with its own statistics: privileged_state starts with state, so its first columns
    have learned the same means as state's."""
    metrics = script.train(go1_args(script, tmp_path))
    assert all(np.isfinite(v) for k, v in metrics.items() if k.startswith("losses/"))
    ckpt = script.load_checkpoint(only_checkpoint(tmp_path))
    assert (ckpt["obs_dim"], ckpt["actor_dim"], ckpt["act_dim"]) == (STATE + PRIVILEGED, STATE, 12)
    mean = ckpt["agent"]["obs_rms.mean"]
    assert mean[:STATE].abs().sum() > 0
    torch.testing.assert_close(mean[STATE : 2 * STATE], mean[:STATE])
    assert ckpt["agent"]["actor_mean.0.weight"].shape[1] == STATE
    assert ckpt["agent"]["critic.0.weight"].shape[1] == PRIVILEGED
    events = read_events(os.path.dirname(only_checkpoint(tmp_path)))
    episodes = len(events.Scalars("charts/episodic_return"))  # random actions: falls, early on
    for name in ("tracking_lin_vel", "tracking_ang_vel", "pose", "feet_clearance"):
        assert len(events.Scalars(f"reward_terms/{name}")) == episodes > 0
    tracking = [point.value for point in events.Scalars("reward_terms/tracking_lin_vel")]
    assert 0 <= min(tracking) and max(tracking) <= 1  # exp(-error): 1 is perfect tracking


@pytest.fixture(scope="module")
def go1_run(tmp_path_factory):
    """Two iterations of ppo_continuous.py on Go1."""
    script = importlib.import_module("ppo_continuous")
    log_dir = tmp_path_factory.mktemp("go1")
    script.train(go1_args(script, log_dir))
    return script, log_dir, only_checkpoint(log_dir)


def test_a_go1_run_resumes_and_its_critic_flag_cannot_change(go1_run, tmp_path):
    script, _, checkpoint = go1_run
    run_dir = shutil.copytree(os.path.dirname(checkpoint), tmp_path / "run")  # the fixture's stays
    checkpoint = str(run_dir / "checkpoint.pt")
    saved = script.saved_args(script.load_checkpoint(checkpoint))
    args = dataclasses.replace(saved, resume=checkpoint, total_timesteps=384)
    metrics = script.train(args)
    assert metrics["global_step"] == 384
    resumed = script.load_checkpoint(checkpoint)
    assert resumed["actor_dim"] == STATE and resumed["global_step"] == 384
    with pytest.raises(SystemExit, match="--asymmetric-critic cannot change on resume"):
        script.train(dataclasses.replace(args, asymmetric_critic=False, total_timesteps=512))


def test_the_export_takes_state_only_and_acts_as_evaluation(go1_run, tmp_path):
    """The ONNX policy's input is the 48 numbers of state; its actions are the script's mean
    action on [state | privileged_state], to float rounding (onnxruntime sums in another order);
    --check's return is --eval-checkpoint's on this barely trained policy's episode (a trained
    robot's episodes can turn that rounding into other falls: tools/export_onnx.py, check)."""
    onnxruntime = pytest.importorskip("onnxruntime")
    script, _, checkpoint = go1_run
    output = tmp_path / "policy.onnx"
    command = [sys.executable, "tools/export_onnx.py", checkpoint, "--output", str(output)]
    exported = subprocess.run([*command, "--check", "1"], cwd=ROOT, capture_output=True, text=True)
    assert exported.returncode == 0, exported.stderr
    session = onnxruntime.InferenceSession(str(output), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape[1] == STATE
    metadata = session.get_modelmeta().custom_metadata_map  # what a deployment reads (README)
    assert json.loads(metadata["obs_dim"]) == STATE  # not the 171 of [state | privileged_state]
    ckpt = script.load_checkpoint(checkpoint)
    agent = script.Agent(ckpt["obs_dim"], ckpt["act_dim"], script.saved_args(ckpt), STATE)
    agent.load_state_dict(ckpt["agent"])
    envs = script.make_envs(GO1, 4, "envpool")
    obs, _ = envs.reset(seed=3)
    for _ in range(20):
        obs = envs.step(np.random.default_rng(0).uniform(-1, 1, (4, 12)))[0]
    envs.close()
    (action,) = session.run(None, {"obs": obs[:, :STATE].astype(np.float32)})
    expected = agent.mean_action(torch.as_tensor(obs, dtype=torch.float32)).clamp(-1, 1)
    np.testing.assert_allclose(action, expected.detach().numpy(), atol=1e-5)
    typed = ["--eval-checkpoint", checkpoint, "--eval-episodes", "1"]  # in this process
    evaluated = f"{script.train(script.parse_args(typed))['eval/episodic_return']:.1f}"
    assert exported.stdout.split("return ")[1].split(" ")[0] == evaluated, exported.stdout


def test_gaits_films_a_robot_checkpoint_whose_actor_reads_state_only(
    go1_run, tmp_path, monkeypatch
):
    """benchmarks/gaits.py on a Go1 checkpoint (its actor reads 48 of the 171 columns): its video
    and strip, on the run's EnvPool backend (the episode cut at 8 steps: 0.5 s a frame)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import gaits

    script, _, checkpoint = go1_run
    render_kwargs = script.render_kwargs
    monkeypatch.setattr(
        script, "render_kwargs", lambda *a: {**render_kwargs(*a), "max_episode_steps": 8}
    )
    output = tmp_path / "gaits.png"
    gaits.main(gaits.Args(checkpoints=(checkpoint,), output=str(output), frames=2, seconds=0.1,
                          video_dir=str(tmp_path / "videos")))  # fmt: skip
    (video,) = (tmp_path / "videos").glob("*.mp4")
    assert imageio.v3.imread(video).shape == (8, 480, 480, 3)
    assert output.stat().st_size > 0


def test_an_envpool_task_the_scripts_cannot_use_is_one_line():
    """Pixels and discrete actions (Pong), a board (Go): refused before anything runs, in every
    script's adapter, and as one line with exit code 1 on the command line."""
    refused = {"Pong-v5": "(4, 84, 84)", "Go13x13-v1": "(13, 13, 17)"}
    for name in ALL_SCRIPTS:
        script = importlib.import_module(name)
        for env_id, shape in refused.items():
            expected = f"error: EnvPool's {env_id} observes {shape}, acts in Discrete: the scripts"
            with pytest.raises(SystemExit, match=re.escape(expected)):
                script.EnvPoolVectorEnv(env_id, 1)
    result = subprocess.run(
        [sys.executable, "ppo_continuous.py", "--env-backend", "envpool", "--env-id", "Pong-v5"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1 and result.stderr.startswith("error: EnvPool's Pong-v5 observes")
    assert len(result.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# Evaluation under a chosen command (--eval-command), and its video (--capture-video)
# ---------------------------------------------------------------------------------------------
COMMAND = (0.5, -0.2, 0.3)  # vx, vy, yaw rate
SLOTS = [45, 46, 47, STATE + 45, STATE + 46, STATE + 47]  # state's, and privileged_state's copy
VX, VY, GYRO_Z = STATE + 57, STATE + 58, STATE + 50  # privileged_state's, in the flat obs


def tracking(obs: np.ndarray, command) -> tuple[np.ndarray, np.ndarray]:
    """Go1's tracking terms, written out (go1.h): exp(-|command_xy - v_xy|^2 / 0.25) and
    0.5 x exp(-(command_yaw - gyro_z)^2 / 0.25), from the flat obs after a step."""
    command = np.asarray(command, dtype=np.float64).reshape(-1, 3)
    lin = ((command[:, :2] - obs[:, [VX, VY]]) ** 2).sum(-1)
    return np.exp(-lin / 0.25), 0.5 * np.exp(-((command[:, 2] - obs[:, GYRO_Z]) ** 2) / 0.25)


def test_a_chosen_command_is_in_every_observation_and_tracked_as_the_env_tracks_its_own():
    """150 steps of 3 Go1 envs, random actions. The formula above is the env's: with the command
    each env observed before a step, it gives that step's reward_tracking_* terms. With a chosen
    command, the adapter writes it into every observation (resets, autoresets, final_obs) and an
    ended episode's tracking terms are the formula's mean against it over the episode's steps;
    the other terms stay the env's."""
    script = importlib.import_module("ppo_continuous")
    rng = np.random.default_rng(0)
    envs = script.make_envs(GO1, 3, "envpool")
    obs, _ = envs.reset(seed=0)
    raw, step = [], envs.pool.step
    envs.pool.step = lambda actions: raw.append(step(actions)) or raw[-1]
    for _ in range(60):
        before = obs[:, 45:48]
        obs, _, _, _, info = envs.step(rng.uniform(-1, 1, (3, 12)))
        pool_info = raw[-1][4]
        lin, yaw = tracking(np.concatenate([raw[-1][0][k] for k in ("state", "privileged_state")],
                                           -1), before)  # fmt: skip
        np.testing.assert_allclose(lin, pool_info["reward_tracking_lin_vel"], rtol=1e-12)
        np.testing.assert_allclose(yaw, pool_info["reward_tracking_ang_vel"], rtol=1e-12)
    envs.close()
    envs = script.make_envs(GO1, 3, "envpool", command=COMMAND)
    obs, _ = envs.reset(seed=0)
    raw, step = [], envs.pool.step
    envs.pool.step = lambda actions: raw.append(step(actions)) or raw[-1]
    sums, ended = {"lin": np.zeros(3), "yaw": np.zeros(3), "pose": np.zeros(3)}, 0
    np.testing.assert_array_equal(obs[:, SLOTS], np.tile(COMMAND * 2, (3, 1)))
    for _ in range(150):
        obs, _, terminated, truncated, info = envs.step(rng.uniform(-1, 1, (3, 12)))
        np.testing.assert_array_equal(obs[:, SLOTS], np.tile(COMMAND * 2, (3, 1)))
        pool_obs, _, _, _, pool_info = raw[-1]
        after = np.concatenate([pool_obs[k] for k in ("state", "privileged_state")], -1)
        lin, yaw = tracking(after, COMMAND)
        sums["lin"], sums["yaw"] = sums["lin"] + lin, sums["yaw"] + yaw
        sums["pose"] = sums["pose"] + pool_info["reward_pose"]
        done = np.flatnonzero(terminated | truncated)
        if done.size:
            np.testing.assert_array_equal(
                info["final_obs"][done][:, SLOTS], [COMMAND * 2] * done.size
            )
            length = pool_info["elapsed_step"][done]
            terms = {name: means[done] for name, means in info["reward_terms"].items()}
            np.testing.assert_allclose(terms["tracking_lin_vel"], sums["lin"][done] / length)
            np.testing.assert_allclose(terms["tracking_ang_vel"], sums["yaw"][done] / length)
            np.testing.assert_allclose(terms["pose"], sums["pose"][done] / length)
            for key in sums:
                sums[key][done] = 0.0
            ended += done.size
    envs.close()
    assert ended >= 3


def evaluating() -> bool:
    """Whether evaluate is a caller. Frame by frame: inspect.stack() reads every caller's source,
    29 ms a step under pytest (30 s for a 1000-step evaluation)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name != "evaluate":
        frame = frame.f_back
    return frame is not None


@pytest.mark.parametrize("name", [*ALL_SCRIPTS, "ppo_teacher_student"])
def test_every_script_films_and_evaluates_the_robot_under_a_chosen_command(
    name, go1_run, tmp_path, monkeypatch, capsys
):
    """A one-iteration Go1 run with --capture-video and --eval-command 0.5 -0.2 0.3, its filmed
    evaluation episode cut at 8 steps (a robot's frame takes 0.5 s in software). The MP4 holds
    the episode's 8 frames of env 0, the first one the robot as an env of the evaluation's seed
    renders it (not another seed's); every observation of every evaluation carries the command
    (training's do not); the printed tracking is the formula's against it over the episode. The
    first line (before the envs are made) says that they are being made."""
    script = importlib.import_module(name)
    render_kwargs = script.render_kwargs
    monkeypatch.setattr(
        script, "render_kwargs", lambda *a: {**render_kwargs(*a), "max_episode_steps": 8}
    )
    records, flat = [], script.EnvPoolVectorEnv.flat

    def recorded_flat(self, obs):
        flat_obs = flat(self, obs)
        records.append((self, evaluating(), flat_obs.copy()))  # the adapter writes into it
        return flat_obs

    monkeypatch.setattr(script.EnvPoolVectorEnv, "flat", recorded_flat)
    if name != "ppo_continuous":  # start_mujoco's probe, a child rendering a robot frame (7 s):
        monkeypatch.setattr(script, "rendering_error", lambda *a: None)  # once, and in its tests
    fields = dict(capture_video=True, video_dir=str(tmp_path / "videos"), eval_command=COMMAND)
    if name == "ppo_teacher_student":
        fields.update(teacher=go1_run[2], history=1)
    script.train(go1_args(script, tmp_path / "run", total_timesteps=128, **fields))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "making 2 envs"
    assert re.search(
        r": iterations 1-1 \(batches of 128 steps: .*2 envs x 64\) to step 128;", lines[1]
    )
    evaluated = np.concatenate([obs for _, evaluation, obs in records if evaluation])
    np.testing.assert_array_equal(evaluated[:, SLOTS], [COMMAND * 2] * len(evaluated))
    trained = [obs for _, evaluation, obs in records if not evaluation]  # appo's: in its actors
    assert all((obs[:, SLOTS] != COMMAND * 2).any(1).all() for obs in trained)
    last = [obs for pool, _, obs in records if pool is records[-1][0]]  # the final evaluation's
    assert len(last) == 10  # its reset, 8 steps, and the reset after them
    lin, yaw = tracking(np.concatenate(last[1:9]), COMMAND)
    (final,) = [line for line in lines if line.startswith("deterministic eval over 1 episode: ")]
    measures = f"| tracking lin {lin.mean():.3f} yaw {yaw.mean():.3f} | falls 0 of 1 | length 8"
    assert measures in final
    (video,) = (tmp_path / "videos").glob("*/eval_step128.mp4")
    frames = imageio.v3.imread(video).astype(float)
    assert frames.shape == (8, 480, 480, 3)
    difference, envs = {}, script.make_envs(GO1, 1, "envpool", **render_kwargs(GO1, "envpool"))
    for seed in (1, 2):  # the evaluation's seed, and another
        envs.reset(seed=seed + script.EVAL_SEED_OFFSET)
        difference[seed] = np.abs(frames[0] - envs.envs[0].render()).mean()  # of 255
    envs.close()
    assert difference[1] < 2.5 and difference[2] > 8  # the MP4's compression, another robot


def test_periodic_and_checkpoint_evaluations_run_the_chosen_command_too(go1_run, monkeypatch):
    """--eval-every's evaluation and --eval-checkpoint's (the flag as typed: negative numbers; 17
    episodes, two waves) make their pools with the command, which every observation carries."""
    script, _, checkpoint = go1_run
    made, reset = [], script.EnvPoolVectorEnv.reset

    def recorded_reset(self, seed, options=None):
        obs, info = reset(self, seed, options)
        made.append((evaluating(), obs[:, SLOTS].copy()))
        return obs, info

    monkeypatch.setattr(script.EnvPoolVectorEnv, "reset", recorded_reset)
    eval_options = script.eval_options  # episodes of 8 steps: two waves of them in a few seconds
    monkeypatch.setattr(
        script, "eval_options", lambda a: {**eval_options(a), "max_episode_steps": 8}
    )
    saved = script.saved_args(script.load_checkpoint(checkpoint))
    run_dir = os.path.dirname(checkpoint)
    args = dataclasses.replace(saved, log_dir=run_dir + "-periodic", eval_every=1)
    script.train(dataclasses.replace(args, total_timesteps=128, eval_command=COMMAND))
    typed = ["--eval-checkpoint", checkpoint, "--eval-episodes", "17", "--eval-command"]
    script.train(script.parse_args([*typed, *map(str, COMMAND)]))
    evaluations = [slots for evaluation, slots in made if evaluation]
    assert len(evaluations) == 4  # --eval-every's, the final one, --eval-checkpoint's 2 waves
    for slots in evaluations:
        np.testing.assert_array_equal(slots, [COMMAND * 2] * len(slots))
    assert [len(slots) for slots in evaluations] == [1, 1, 16, 1]


@pytest.mark.parametrize("name", [*ALL_SCRIPTS, "ppo_teacher_student"])
def test_a_command_where_no_one_knows_its_slots_is_refused_in_one_line(name, tmp_path):
    """--eval-command on a gymnasium task, on a robot whose command slots are not known here, or
    with a NaN: one line before anything runs."""
    script = importlib.import_module(name)
    for fields, message in [
        (dict(), "--eval-command commands EnvPool's robots (Go1JoystickFlatTerrain-v1, "),
        (dict(env_id="BerkeleyHumanoidJoystickFlatTerrain-v1", env_backend="envpool"),
         "--eval-command: where BerkeleyHumanoidJoystickFlatTerrain-v1's observation holds its "),
        (dict(env_id=GO1, env_backend="envpool", eval_command=(1.0, float("nan"), 0.0)),
         "--eval-command must be 3 finite numbers (vx vy yaw-rate), got (1.0, nan, 0.0)"),
    ]:  # fmt: skip
        args = small_args(script, tmp_path, **{"eval_command": COMMAND, **fields})
        with pytest.raises(SystemExit, match=f"^error: {re.escape(message)}"):
            script.train(args)
    assert not list(tmp_path.iterdir())
