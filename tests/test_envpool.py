"""Tests of --env-backend envpool: the adapter gives the contract the rollout assumes (gymnasium's
SAME_STEP autoreset, info["final_obs"]), so that both backends step the same episodes from the
same state; the flag is saved, kept on resume and used by evaluation; and where EnvPool cannot
serve, one line says so. (The rollout -> update seam on EnvPool: tests/test_seams.py.)"""

import importlib
import importlib.util
import subprocess
import sys

import numpy as np
import pytest
from conftest import ALL_SCRIPTS, ROOT, only_checkpoint, small_args

pytest.importorskip("envpool")

# MuJoCo 3.6.0 inside EnvPool and 4.0.0 here integrate these three alike to float rounding; Ant and
# Humanoid drift apart within 10 to 20 steps (README.md, EnvPool).
SAME_DYNAMICS = ["Hopper-v5", "Walker2d-v5", "HalfCheetah-v5"]


@pytest.mark.parametrize("env_id", SAME_DYNAMICS)
def test_both_backends_step_the_same_episodes_from_the_same_state(env_id):
    """Without reset noise both start every episode in the model's initial state. 120 steps of the
    same random actions, with a time limit of 30 steps: the same observations (the next episode's
    first one where an episode ended), rewards, flags and final observations."""
    script = importlib.import_module("ppo_continuous")
    make = {"reset_noise_scale": 0.0, "max_episode_steps": 30}
    gym_envs = script.make_envs(env_id, 4, "gymnasium", **make)
    pool_envs = script.make_envs(env_id, 4, "envpool", **make)
    obs = [gym_envs.reset(seed=0)[0], pool_envs.reset(seed=0)[0]]
    np.testing.assert_allclose(obs[1], obs[0], atol=1e-9)
    assert pool_envs.single_action_space.shape == gym_envs.single_action_space.shape
    assert pool_envs.single_observation_space.shape == gym_envs.single_observation_space.shape
    rng, ends = np.random.default_rng(0), {"terminated": 0, "truncated": 0}
    ends["terminal at the limit"] = 0
    for _ in range(120):
        action = rng.uniform(-1, 1, (4, *gym_envs.single_action_space.shape)).astype(np.float32)
        (o0, r0, te0, tr0, i0), (o1, r1, te1, tr1, i1) = (
            gym_envs.step(action),
            pool_envs.step(action),
        )
        np.testing.assert_allclose(o1, o0, atol=1e-8)
        np.testing.assert_allclose(r1, r0, rtol=1e-6, atol=1e-6)  # EnvPool's rewards: float32
        # One difference: an episode that ends unhealthy on the very step of its time limit is
        # terminated and truncated in gymnasium, truncated only in EnvPool (README.md, EnvPool).
        at_limit = te0 & tr0 & ~te1
        ends["terminal at the limit"] += at_limit.sum()
        assert (te1 | at_limit).tolist() == te0.tolist() and tr1.tolist() == tr0.tolist()
        for i in np.flatnonzero(te0 | tr0):
            np.testing.assert_allclose(i1["final_obs"][i], i0["final_obs"][i], atol=1e-8)
        ends["terminated"] += te0.sum()
        ends["truncated"] += (tr0 & ~te0).sum()
    gym_envs.close()
    pool_envs.close()
    assert ends["truncated"] > 0 and (env_id == "HalfCheetah-v5" or ends["terminated"] > 0)


def test_reset_seeds_each_env_and_reseeding_repeats_its_episodes():
    script = importlib.import_module("ppo_continuous")
    envs = script.make_envs("Hopper-v5", 3, "envpool")
    first = envs.reset(seed=5)[0]
    assert len({tuple(row) for row in first}) == 3  # each env its own seed (5, 6, 7)
    np.testing.assert_array_equal(envs.reset(seed=5)[0], first)
    np.testing.assert_array_equal(envs.reset(seed=6)[0][:2], first[1:])  # env i: seed + i
    envs.close()


@pytest.mark.parametrize("name", ALL_SCRIPTS)
def test_a_run_on_envpool_saves_the_backend_and_its_resume_and_evaluation_use_it(
    name, tmp_path, monkeypatch, capsys
):
    script = importlib.import_module(name)
    made, adapter = [], script.EnvPoolVectorEnv

    def counting(env_id, num_envs, **kwargs):
        made.append(num_envs)
        return adapter(env_id, num_envs, **kwargs)

    monkeypatch.setattr(script, "EnvPoolVectorEnv", counting)
    metrics = script.train(small_args(script, tmp_path, env_backend="envpool"))
    assert "making" not in capsys.readouterr().out  # a robot's pools take seconds; Walker2d's not
    assert np.isfinite(metrics["losses/policy_loss"]) and np.isfinite(
        metrics["eval/episodic_return"]
    )
    assert (
        made
    )  # the checks, training (appo_vtrace.py's actors: in their own processes), evaluation
    path = only_checkpoint(tmp_path)
    assert script.load_checkpoint(path)["args"]["env_backend"] == "envpool"
    resumed = script.parse_args(["--resume", path, "--total-timesteps", "384"])
    assert resumed.env_backend == "envpool"
    assert script.train(resumed)["global_step"] == 384
    made.clear()
    evaluated = script.parse_args(["--eval-checkpoint", path, "--eval-episodes", "2"])
    assert evaluated.env_backend == "envpool"
    script.train(evaluated)
    assert 2 in made  # the evaluation's wave of 2 envs
    typed = script.parse_args(["--eval-checkpoint", path, "--env-backend", "gymnasium"])
    assert typed.env_backend == "gymnasium"  # either backend can evaluate it


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"env_id": "Walker2d-v2"}, "error: EnvPool has no Walker2d-v2"),  # never another version
        ({"env_id": "toy_envs:CountsSteps-v0"}, "error: EnvPool has no toy_envs:CountsSteps-v0"),
    ],
)
def test_where_envpool_cannot_serve_one_line_names_the_gymnasium_backend(fields, message, tmp_path):
    script = importlib.import_module("ppo_continuous")
    with pytest.raises(SystemExit) as stopped:
        script.train(small_args(script, tmp_path, env_backend="envpool", **fields))
    assert str(stopped.value.code).startswith(message)
    assert str(stopped.value.code).endswith("use --env-backend gymnasium")
    assert not list(tmp_path.iterdir())  # found before any run started


def test_without_envpool_installed_the_error_says_how_to_install_it(tmp_path, monkeypatch):
    script = importlib.import_module("ppo_continuous")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "envpool" else find_spec(name)
    )
    with pytest.raises(SystemExit) as stopped:
        script.train(small_args(script, tmp_path, env_backend="envpool"))
    assert stopped.value.code == (
        "error: --env-backend envpool needs EnvPool: pip install -r requirements-envpool.txt"
    )
    # The default backend does not need it.
    assert np.isfinite(script.train(small_args(script, tmp_path))["losses/policy_loss"])


def test_an_older_version_envpool_has_is_its_own_task():
    script = importlib.import_module("ppo_continuous")
    envs = script.make_envs("Hopper-v4", 2, "envpool")  # v4: 11 observations, as v5
    assert envs.single_observation_space.shape == (11,)
    envs.close()


def test_the_command_line_refusal_is_one_line_without_a_traceback():
    result = subprocess.run(
        [sys.executable, "ppo_continuous.py", "--env-backend", "envpool", "--env-id", "Ant-v2"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        "error: EnvPool has no Ant-v2 (envpool.list_all_envs()); closest: Ant-v5, Ant-v4, Ant-v3; "
        "gymnasium has it: use --env-backend gymnasium"
    )


@pytest.mark.parametrize("name", [*ALL_SCRIPTS, "ppo_teacher_student"])
def test_a_robot_on_the_wrong_backend_or_misspelled_is_pointed_the_right_way(name, tmp_path):
    """A robot's id on the default gymnasium backend: gymnasium's error, and that EnvPool has it.
    A misspelled one on EnvPool: its closest EnvPool ids (one name each, not also
    MuJoCoPlayground/'s), and no gymnasium backend, which does not have it either."""
    script = importlib.import_module(name)
    with pytest.raises(SystemExit) as stopped:  # where train() makes its envs (a student's too)
        script.make_envs("Go1JoystickFlatTerrain-v1", 1)
    assert str(stopped.value.code).startswith("error: unknown env id 'Go1JoystickFlatTerrain-v1' (")
    assert str(stopped.value.code).endswith("; EnvPool has it: add --env-backend envpool")
    with pytest.raises(SystemExit) as stopped:
        script.make_envs("NoSuchEnv-v0", 1)  # nor in EnvPool
    assert "EnvPool" not in str(stopped.value.code)
    misspelled = small_args(
        script, tmp_path, env_id="Go1JoystickFlatTerain-v1", env_backend="envpool"
    )
    with pytest.raises(SystemExit) as stopped:
        script.train(misspelled)
    assert stopped.value.code == (
        "error: EnvPool has no Go1JoystickFlatTerain-v1 (envpool.list_all_envs()); closest: "
        "Go1JoystickFlatTerrain-v1, G1JoystickFlatTerrain-v1, T1JoystickFlatTerrain-v1"
    )
    envpool = importlib.import_module("envpool")  # where both names of one task are close
    assert script.other_ids("BerkeleyHumanoidJoystickFlat-v1", envpool) == (
        "; closest: BerkeleyHumanoidJoystickFlatTerrain-v1, "
        "BerkeleyHumanoidJoystickRoughTerrain-v1, BarkourJoystick-v1"
    )


def test_envpool_films_at_the_envs_own_rate():
    """--capture-video's pools: a robot's frame rate is its control rate (50 a second for Go1's
    0.02 s), a gymnasium MuJoCo task's gymnasium's own (Hopper's 125); EnvPool renders env 0."""
    script = importlib.import_module("ppo_continuous")
    for env_id, fps in [("Go1JoystickFlatTerrain-v1", 50), ("Hopper-v5", 125)]:
        envs = script.make_envs(env_id, 2, "envpool", **script.render_kwargs(env_id, "envpool"))
        envs.reset(seed=0)
        assert envs.envs[0].metadata["render_fps"] == fps
        frame = envs.envs[0].render()
        assert frame.dtype == np.uint8 and frame.shape == (480, 480, 3) and frame.std() > 10
        envs.close()
