"""Robots (EnvPool's MuJoCo Playground tasks): a Dict observation of what the robot senses (`state`)
and what only the simulator knows (`privileged_state`). The scripts lay it flat as [state |
privileged_state]; the actor reads state, the critic privileged_state (--asymmetric-critic), each
column normalized by its own statistics; the export takes state only. Checked on real short runs
of Go1JoystickFlatTerrain-v1."""

import dataclasses
import importlib
import os
import re
import shutil
import subprocess
import sys

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


def test_a_privileged_actor_reads_state_and_privileged_state_and_keeps_it_on_resume(
    tmp_path, monkeypatch
):
    """--privileged-actor (a teacher for ppo_teacher_student.py): every input the actor got is a
    whole [state | privileged_state] the env gave; the checkpoint says so, a resume keeps it."""
    script = importlib.import_module("ppo_continuous")
    seen = recording(script, monkeypatch)
    script.train(go1_args(script, tmp_path / "run", norm_obs=False, privileged_actor=True))
    pairs = zip(seen["state"], seen["privileged_state"])
    whole = rows(np.concatenate(pair, -1) for pair in pairs)
    actor = torch.cat([x.flatten(0, -2) for x in seen["actor"]]).numpy()
    assert actor.shape[1] == STATE + PRIVILEGED and rows([actor]) <= whole
    checkpoint = only_checkpoint(tmp_path / "run")
    ckpt = script.load_checkpoint(checkpoint)
    assert ckpt["actor_dim"] == STATE + PRIVILEGED
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
    command = [sys.executable, "ppo_continuous.py", "--eval-checkpoint", checkpoint]
    evaluated = subprocess.run(
        [*command, "--eval-episodes", "1"], cwd=ROOT, capture_output=True, text=True
    )
    returns = [
        line.split("return ")[1].split(" ")[0] for line in (exported.stdout, evaluated.stdout)
    ]
    assert returns[0] == returns[1], (exported.stdout, evaluated.stdout)


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
