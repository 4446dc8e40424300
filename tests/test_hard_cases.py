"""What a real user still hit (issue 45): values beyond what a run can hold, broken custom envs, a
read-only run to resume, a closed pipe, and the messages that confused a newcomer. Each test runs
the case for real, and each failed on the code before it was handled."""

import dataclasses
import functools
import importlib
import os
import subprocess
import sys
import time

import pytest
import torch
from conftest import PPO_FAMILY, ROOT, RecordingWriter, allow_toy_env, only_checkpoint, small_args


def toy_env_args(script, log_dir, env_id, **overrides):
    fields = dict(env_id=env_id, num_steps=16, total_timesteps=64, **overrides)
    return small_args(script, log_dir, **fields)


def no_env(*args, **kwargs):
    raise AssertionError("an env was made before the bad input was found")


# ---------------------------------------------------------------------------------------------
# Values beyond what a run can hold, and a network without hidden layers
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(total_timesteps=10**21), "--total-timesteps must lie in [1, 2**63 - 1], got 10"),
        (dict(total_timesteps=10**23), "--total-timesteps must lie in [1, 2**63 - 1], got 10"),
        (dict(seed=10**20), "--seed must lie in [0, 2**63 - 1], got 100000000000000000000"),
        (dict(seed=2**63), "--seed must lie in [0, 2**63 - 1], got 9223372036854775808"),
    ],
)
def test_counts_and_seeds_beyond_int64_are_one_line(
    script, overrides, message, tmp_path, monkeypatch
):
    monkeypatch.setattr(script.gym, "make_vec", no_env)
    with pytest.raises(SystemExit) as stopped:
        script.train(small_args(script, tmp_path, **overrides))
    assert str(stopped.value.code).startswith(f"error: {message}")


def test_the_largest_count_and_seed_are_held(tmp_path, capsys):
    # 2**63 - 1 is accepted: TensorBoard's step, torch's seed and the ETA all hold it.
    ppo = importlib.import_module("ppo_continuous")
    args = small_args(ppo, tmp_path, total_timesteps=2**63 - 1, seed=2**63 - 1)
    run = ppo.plan_run(args, None)
    assert run["end_step"] == (2**63 - 1) // 128 * 128
    torch.manual_seed(args.seed)
    run.update(start_time=0.0, eval_seconds=0.0, writer=RecordingWriter())
    optimizers = [torch.optim.Adam([torch.zeros(1, requires_grad=True)])]
    progress = {"global_step": 128, "iteration": 1, "command_scale": 1.0}
    ppo.log_iteration(run, {}, optimizers, {"episodes": []}, progress)  # 1 SPS: an ETA of 2**63 s
    assert "| ETA 106751991167300d " in capsys.readouterr().out


def test_an_actor_and_a_critic_without_hidden_layers_train(script, tmp_path):
    """`--actor-layers` with no sizes: a linear policy (and a linear critic); its diagnostics are
    those of its input (effective rank) and of no hidden unit (no dormant fraction)."""
    args = small_args(script, tmp_path, actor_layers=(), critic_layers=(), total_timesteps=128)
    metrics = script.train(args)
    assert metrics["charts/actor_dormant_fraction"] == 0.0
    assert 1.0 <= metrics["charts/actor_effective_rank"] <= 17.0  # Walker2d's 17 observations
    ckpt = script.load_checkpoint(only_checkpoint(tmp_path))
    assert ckpt["agent"]["actor_mean.0.weight"].shape == (6, 17)


# ---------------------------------------------------------------------------------------------
# Custom envs: actions without bounds, an observation of another shape
# ---------------------------------------------------------------------------------------------
def test_an_action_box_with_infinite_bounds_is_one_line(script, tmp_path, monkeypatch):
    allow_toy_env(script, monkeypatch)
    with pytest.raises(SystemExit) as stopped:
        script.train(toy_env_args(script, tmp_path, "toy_envs:UnboundedActions-v0"))
    assert stopped.value.code == (
        "error: UnboundedActions-v0: its action Box has infinite bounds (Box(-inf, inf, (1,), "
        "float32)); they must be finite (actions are scaled to them), or wrap it to rescale"
    )


def test_an_observation_of_another_shape_is_one_line(script, tmp_path, monkeypatch, capfd):
    allow_toy_env(script, monkeypatch)
    expected = (
        "error: ReshapesObservation-v0 returned an observation of shape (2,) at its step 3; its "
        "observation space declares (1,)"
    )
    with pytest.raises(SystemExit) as stopped:
        script.train(toy_env_args(script, tmp_path, "toy_envs:ReshapesObservation-v0"))
    err = capfd.readouterr().err
    if script.__name__ == "appo_vtrace":  # in an actor: its line, then the learner's
        assert expected in err and "died (exit code 1)" in str(stopped.value.code)
    else:
        assert stopped.value.code == expected
    assert "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# A run to resume on a read-only mount
# ---------------------------------------------------------------------------------------------
def test_a_resume_on_a_read_only_mount_is_refused_before_anything_starts(
    tmp_path, monkeypatch, capsys
):
    ppo = importlib.import_module("ppo_continuous")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        ppo.train(small_args(ppo, disk, total_timesteps=128))
        path = only_checkpoint(disk)
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        capsys.readouterr()
        monkeypatch.setattr(ppo.gym, "make_vec", no_env)
        with pytest.raises(SystemExit) as stopped:
            # Its saved --log-dir is on the mount too: another one typed, as a copied run has.
            argv = ["--resume", path, "--total-timesteps", "256", "--log-dir", str(tmp_path)]
            ppo.train(ppo.parse_args(argv))
        run_dir = os.path.dirname(path)
        assert stopped.value.code == (
            f"error: --resume {run_dir}: cannot write there (Read-only file system)"
        )
        assert capsys.readouterr().out == ""  # nothing started
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


# ---------------------------------------------------------------------------------------------
# A closed pipe, and the messages that confused a newcomer
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["ppo_continuous", "ppo_ddp", "appo_vtrace"])
def test_a_closed_stdout_never_ends_a_run(name, tmp_path):
    """`python <script>.py ... | head -1`: the run trains on to its end and saves; stderr says
    once that its progress lines are gone."""
    flags = ["--env-id", "Walker2d-v5", "--num-envs", "2", "--num-steps", "64", "--log-dir"]
    flags += [str(tmp_path), "--num-minibatches", "2", "--update-epochs", "1"]
    flags += ["--total-timesteps", "512", "--eval-episodes", "1", "--checkpoint-every", "0"]
    if name == "appo_vtrace":
        flags += ["--num-actors", "1"]
    proc = subprocess.Popen(
        [sys.executable, f"{name}.py", *flags],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.readline()  # what `| head -1` does: one line, then the pipe closes
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 0, err
    assert err.count("note: stdout is closed; the run goes on without progress lines") == 1, err
    assert "Traceback" not in err
    script = importlib.import_module(name)
    assert script.load_checkpoint(only_checkpoint(tmp_path))["global_step"] == 512


def test_help_says_what_none_means_and_how_to_install_wandb(script, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        script.parse_args(["--help"])
    out = capsys.readouterr().out
    head = out.split("╭")[0]
    assert "{None}|FLOAT: a number, or None (the default it names)." in head
    assert "--critic-learning-rate {None}|FLOAT" in out
    assert "pip install -r requirements-extras.txt" in out and "pip install wandb" not in out


def test_new_and_resumed_runs_name_their_directory_alike(tmp_path, monkeypatch, capsys):
    ppo = importlib.import_module("ppo_continuous")
    monkeypatch.chdir(tmp_path)
    ppo.train(small_args(ppo, "runs", total_timesteps=128))
    new = capsys.readouterr().out
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert f"logging to {run_dir}\n" in new
    relative = os.path.join("runs", run_dir.name, "checkpoint.pt")
    ppo.train(ppo.parse_args(["--resume", relative, "--total-timesteps", "256"]))
    resumed = capsys.readouterr().out
    assert f"logging to {run_dir}\n" in resumed


def test_one_process_of_ppo_ddp_says_1_rank_and_1_episode(tmp_path, capsys):
    ddp = importlib.import_module("ppo_ddp")
    ddp.train(small_args(ddp, tmp_path, total_timesteps=128))
    out = capsys.readouterr().out
    assert "iterations 1-1 (batches of 128 steps: 1 rank x 2 envs x 64)" in out
    assert "deterministic eval over 1 episode: " in out


def test_eval_checkpoint_says_1_episode(tmp_path, capsys):
    ppo = importlib.import_module("ppo_continuous")
    ppo.train(small_args(ppo, tmp_path, total_timesteps=128))
    args = dataclasses.replace(ppo.Args(), eval_checkpoint=only_checkpoint(tmp_path))
    args.eval_episodes = 1
    ppo.train(args)
    assert "over 1 episode\n" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# Silence: what takes more than a few seconds says what it does; the SPS is training's alone
# ---------------------------------------------------------------------------------------------
def test_the_sps_leaves_the_evaluation_time_out(capsys):
    """100,000 steps in 1000 s, of which 990 s were evaluation: 10,000 training steps a second
    (less the seconds this test takes), not 100."""
    ppo = importlib.import_module("ppo_continuous")
    optimizers = [torch.optim.Adam([torch.zeros(1, requires_grad=True)])]
    run = {"start_step": 0, "start_time": time.time() - 1000.0, "eval_seconds": 990.0}
    run.update(end_step=200_000, first_iteration=1, last_iteration=2, writer=RecordingWriter())
    progress = {"global_step": 100_000, "iteration": 1, "command_scale": 1.0}
    logged = ppo.log_iteration(run, {}, optimizers, {"episodes": []}, progress)
    assert 5000 < logged["charts/SPS"] <= 10_000
    assert f"| SPS {logged['charts/SPS']} |" in capsys.readouterr().out


def test_the_sps_and_eta_count_from_the_end_of_the_first_iteration(monkeypatch, capsys):
    """Start-up is not the rate (issue 64: an ETA of 29:46 at iteration 1 on Go1, 7:33 by
    iteration 10). The first iteration's SPS counts from the start line, with the warm-up of its
    first calls (--compile's compile, appo's actors starting); from the second on, the rate is
    that of the iterations after the first: 1000 steps in its 1 s, not 2000 in 101 s."""
    ppo = importlib.import_module("ppo_continuous")
    optimizers = [torch.optim.Adam([torch.zeros(1, requires_grad=True)])]
    for first in (1, 5):  # a new run, and a resumed one (its first iteration is the 5th)
        clock = iter([1100.0, 1101.0])  # the ends of its first two iterations
        monkeypatch.setattr(ppo.time, "time", functools.partial(next, clock))
        start = 1000 * (first - 1)
        run = {"start_step": start, "start_time": 1000.0, "eval_seconds": 0.0}
        run.update(end_step=start + 3000, first_iteration=first, last_iteration=first + 2)
        run["writer"], sps = RecordingWriter(), []
        for iteration in (first, first + 1):
            step = start + 1000 * (iteration - first + 1)
            progress = {"global_step": step, "iteration": iteration, "command_scale": 1.0}
            logged = ppo.log_iteration(run, {}, optimizers, {"episodes": []}, progress)
            sps.append(logged["charts/SPS"])
        assert sps == [10, 1000], first
        assert capsys.readouterr().out.splitlines()[1].endswith("| SPS 1000 | ETA 0d 00:00:01")


@pytest.mark.parametrize("name", PPO_FAMILY)
def test_the_first_iteration_s_sps_leaves_the_envs_start_out(name, tmp_path, monkeypatch, capsys):
    """The clock starts after the envs' first reset (an EnvPool robot's pool is made there: 3 s
    for Go1's 32, 8 s for Berkeley Humanoid's): 3 s of it here leave the SPS of the first
    iteration (20 steps of CountsSteps) at what the iteration itself took."""
    script = importlib.import_module(name)
    allow_toy_env(script, monkeypatch)
    start_episodes = script.start_episodes

    def slow_start_episodes(*args, **kwargs):
        time.sleep(3.0)
        return start_episodes(*args, **kwargs)

    monkeypatch.setattr(script, "start_episodes", slow_start_episodes)
    script.train(small_args(script, tmp_path, env_id="toy_envs:CountsSteps-v0", num_steps=10,
                            total_timesteps=20))  # fmt: skip
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("iter 1/")]
    assert int(line.split("| SPS ")[1].split(" ")[0]) > 20  # with the 3 s: 20 / 3 = 6


def test_long_evaluations_say_what_they_do_and_take(tmp_path, capsys):
    """--eval-every with more than one wave of episodes: a line before (the waves) and one after
    (the return and the seconds); the run's SPS is measured without them."""
    ppo = importlib.import_module("ppo_continuous")
    args = toy_env_args(ppo, tmp_path, "toy_envs:CountsSteps-v0", eval_every=1, eval_episodes=17)
    ppo.train(args)
    lines = capsys.readouterr().out.splitlines()
    evaluations = [i for i, line in enumerate(lines) if line.startswith("eval at step 32:")]
    assert len(evaluations) == 1 and "over 17 episodes (" in lines[evaluations[0]]
    assert lines[evaluations[0] - 1] == "evaluating 17 episodes in waves of 16"


def test_eval_checkpoint_says_what_it_evaluates_first_and_films_anew(tmp_path, capsys, monkeypatch):
    ppo = importlib.import_module("ppo_continuous")
    ppo.train(toy_env_args(ppo, tmp_path, "toy_envs:CountsSteps-v0"))
    checkpoint, names = only_checkpoint(tmp_path), []
    capsys.readouterr()
    ppo.train(ppo.Args(eval_checkpoint=checkpoint, env_id="toy_envs:CountsSteps-v0"))
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"evaluating {checkpoint} (step 64) on toy_envs:CountsSteps-v0: 10")
    returns = ([{"return": 1.0, "length": 1, "fell": False, "terms": {}}], None)
    monkeypatch.setattr(ppo, "evaluate", lambda *args: (names.append(args[3]), returns)[1])
    for now in (1000.0, 1001.0):  # a re-film, a second later (a video takes longer to make)
        monkeypatch.setattr(ppo.time, "time", lambda now=now: now)
        ppo.evaluate_checkpoint(ppo.Args(eval_checkpoint=checkpoint), False)
    assert names == ["eval_checkpoint_step64_1000", "eval_checkpoint_step64_1001"]


def test_compile_and_thousands_of_envs_say_what_takes_the_time(tmp_path, capsys):
    ppo = importlib.import_module("ppo_continuous")
    args = small_args(ppo, tmp_path, num_envs=256, compile=True, total_timesteps=256 * 64)
    plan = ppo.plan_run(args, None)
    assert capsys.readouterr().out == "making 256 envs\n"
    start_line = ppo.start_run(args, plan, False)["start_line"]
    assert "note: --compile: the first update compiles the loss first" in start_line


def test_a_video_of_more_than_one_wave_keeps_its_frame_rate(tmp_path, monkeypatch):
    """17 evaluation episodes are two waves; the video (the first wave's first episode) is saved
    at the env's frame rate, not at the second wave's None."""
    ppo = importlib.import_module("ppo_continuous")
    monkeypatch.setenv("MUJOCO_GL", "egl")
    args = ppo.Args(env_id="InvertedPendulum-v5", eval_episodes=17, capture_video=True)
    if not ppo.start_mujoco(dataclasses.replace(args, video_dir=str(tmp_path))):
        pytest.skip("no offscreen rendering here")
    saved = {}
    imageio = importlib.import_module("imageio")
    monkeypatch.setattr(imageio, "mimsave", lambda path, frames, fps: saved.update(fps=fps))
    ppo.evaluate(ppo.Agent(4, 1, args), args, str(tmp_path), "two_waves")
    expected = ppo.gym.make("InvertedPendulum-v5").metadata["render_fps"]
    assert saved["fps"] == expected > 0
