"""The contract off the main path, in every script: bad input is one line and exit code 1 before
any env is built, checkpoints that are not ours say what is wrong, and resume honours the flags
typed now (learning rates included) or refuses the ones that cannot change."""

import dataclasses
import difflib
import importlib
import importlib.util
import os
import re

import pytest
import torch
from conftest import ALL_SCRIPTS, ROOT, only_checkpoint, read_events, small_args

EXTRA_BAD_INPUT = {  # flags only a variant has
    "ppo_symaug": [(dict(mirror_loss_coef=-1.0), "--mirror-loss-coef must be >= 0")],
    "ppo_ddp": [(dict(check_sync_every=-1), "--check-sync-every must be >= 0")],
    "appo_vtrace": [
        (dict(tau=0.0), "--tau must lie in"),
        (dict(num_actors=0), "--num-actors must be positive"),
        (dict(num_rollouts=-1), "--num-rollouts must be positive"),
        (dict(lr_decrease_factor=1.0), "--lr-decrease-factor and --lr-increase-factor must be > 1"),
        (dict(lr_increase_factor=0.5), "--lr-decrease-factor and --lr-increase-factor must be > 1"),
        (dict(clip_rho=0.0), "--clip-rho must be positive"),
    ],
}
ENV_ERRORS = [  # found when the env is made
    (dict(env_id="NoSuchEnv-v0"), "unknown env id 'NoSuchEnv-v0'"),
    (dict(env_id="CartPole-v1"), "CartPole-v1 has a Discrete action space"),
]


@pytest.fixture(scope="module")
def saved_run(script, tmp_path_factory):
    """Two iterations on Walker2d (17 obs, 6 actions: the shapes of HalfCheetah too)."""
    log_dir = tmp_path_factory.mktemp("saved")
    script.train(small_args(script, log_dir))
    return only_checkpoint(log_dir)


def bad_inputs(script, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    cases = [
        (dict(max_grad_norm=-1.0), "--max-grad-norm must be positive, got -1.0"),
        (dict(clip_obs=-1.0), "--clip-obs must be positive"),
        (dict(clip_coef=-0.2), "--clip-coef must be positive"),
        (dict(clip_coef=0.0), "--clip-coef must be positive"),
        (dict(learning_rate=float("nan")), "--learning-rate must be positive, got nan"),
        (dict(eval_every=-1), "--eval-every must be >= 0"),
        (dict(checkpoint_every=-5), "--checkpoint-every must be >= 0"),
        (dict(seed=-1), "--seed must be >= 0"),
        (dict(actor_layers=(0,)), "--actor-layers must be positive sizes"),
        (dict(critic_layers=(-4,)), "--critic-layers must be positive sizes"),
        (dict(gamma=1.5), "--gamma"),
        (dict(num_minibatches=128), "minibatches of one sample"),
        (dict(eval_episodes=0), "--eval-episodes must be positive"),
        (dict(num_envs=0), "--num-envs must be positive"),
        (dict(total_timesteps=-5), "--total-timesteps must be positive"),
        (dict(num_minibatches=3), "batch size 128 is not divisible by --num-minibatches 3"),
        (dict(resume="/no/such/checkpoint.pt"), "checkpoint not found"),
        (dict(eval_checkpoint="/no/such/checkpoint.pt"), "checkpoint not found"),
        (dict(log_dir=str(a_file / "runs")), "--log-dir .*: cannot write there"),
        (dict(capture_video=True, video_dir=str(a_file / "v")), "--video-dir .*: cannot write"),
        (dict(env_id="BipedalWalker-v3"), "cannot make BipedalWalker-v3: Box2D is not installed"),
    ]
    if not hasattr(script.Args(), "gae_lambda"):  # appo_vtrace: V-trace, no GAE
        cases[10] = (dict(gamma=1.5), "--gamma must lie in")
    return cases + EXTRA_BAD_INPUT.get(script.__name__, [])


def no_env(*args, **kwargs):
    raise AssertionError("an env was made before the bad input was found")


def test_bad_input_is_one_line_before_any_env_is_built(script, tmp_path, monkeypatch):
    monkeypatch.setattr(script.gym, "make_vec", no_env)
    for overrides, message in bad_inputs(script, tmp_path):
        if "BipedalWalker" in str(overrides):
            continue  # found when the env is made: below
        args = dataclasses.replace(small_args(script, tmp_path), **overrides)
        with pytest.raises(SystemExit, match=f"^error: {message}"):
            script.train(args)
    monkeypatch.undo()
    for overrides, message in ENV_ERRORS:
        with pytest.raises(SystemExit, match=f"^error: {message}"):
            script.train(small_args(script, tmp_path, **overrides))
    if importlib.util.find_spec("Box2D") is None:
        with pytest.raises(SystemExit, match="cannot make BipedalWalker-v3: Box2D is not inst"):
            script.train(small_args(script, tmp_path, env_id="BipedalWalker-v3"))


def test_eval_checkpoint_checks_its_flags_too(script, saved_run):
    with pytest.raises(SystemExit, match="--eval-episodes must be positive, got 0"):
        script.train(script.Args(eval_checkpoint=saved_run, eval_episodes=0))


@pytest.mark.parametrize("name", [*ALL_SCRIPTS, "ppo_teacher_student"])
def test_eval_checkpoint_runs_on_the_run_s_threads(name, monkeypatch):
    """--eval-checkpoint evaluates with --threads, as the run's own evaluations did: torch's
    default (one per core) sums the networks' floats in another order, and a robot's chaotic
    episodes then end elsewhere (a Go1 student's 10-episode return: 17.124 against its run's
    17.070, found in benchmarks/distill.py's runs)."""
    script, seen = importlib.import_module(name), []
    monkeypatch.setattr(
        script, "evaluate_checkpoint", lambda *_: seen.append(torch.get_num_threads())
    )
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        script.train(script.Args(eval_checkpoint="any.pt", threads=1))
    finally:
        torch.set_num_threads(before)
    assert seen == [1]


def test_track_without_wandb_names_the_pip_command(script, tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *rest: None if name == "wandb" else find_spec(name),
    )
    with pytest.raises(SystemExit, match="--track needs wandb: pip install -r requirements-extras"):
        script.train(small_args(script, tmp_path, track=True))


@pytest.mark.parametrize("name", [*ALL_SCRIPTS, "ppo_teacher_student"])
def test_an_exp_name_too_long_for_a_folder_name_is_one_line(name, tmp_path, monkeypatch):
    """The run directory is named {env_id}__{exp_name}__{seed}__{time}, and a file system takes
    names of 255 bytes at most: 300 letters are one line before any env is built (they were
    OSError: File name too long), and the longest --exp-name that is taken makes its folder."""
    script = importlib.import_module(name)
    monkeypatch.setattr(script.gym, "make_vec", no_env)
    args = small_args(script, tmp_path / "runs", exp_name="a" * 300)
    with pytest.raises(SystemExit, match="^error: --exp-name is too long \\(300 characters\\)"):
        script.train(args)
    assert not (tmp_path / "runs").exists()
    longest = dataclasses.replace(args, exp_name="a" * (200 - len("Walker2d-v5__")), seed=2**63 - 1)
    script.check_args(longest)
    assert os.path.isdir(script.new_run_dir(longest))
    for over in (
        "a" * (201 - len("Walker2d-v5__")),
        "é" * 100,
    ):  # one byte more; bytes, not letters
        with pytest.raises(SystemExit, match="^error: --exp-name is too long"):
            script.check_args(dataclasses.replace(args, exp_name=over))


def test_files_that_are_not_checkpoints_say_what_is_wrong(script, saved_run, tmp_path):
    payload = open(saved_run, "rb").read()
    (tmp_path / "random.pt").write_bytes(os.urandom(2000))
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "truncated.pt").write_bytes(payload[: len(payload) // 2])
    incomplete = torch.load(saved_run, weights_only=True)
    del incomplete["reward_rms"]
    torch.save(incomplete, tmp_path / "incomplete.pt")
    for name, message in [
        ("random.pt", "is not a torch checkpoint \\(empty, corrupt or truncated\\)"),
        ("empty.pt", "is not a torch checkpoint"),
        ("truncated.pt", "is not a torch checkpoint"),
        ("incomplete.pt", "is not a complete checkpoint \\(missing: reward_rms\\)"),
        ("", "checkpoint not found: .*checkpoint.pt"),  # a run directory without one
    ]:
        path = str(tmp_path / name)
        with pytest.raises(SystemExit, match=message):
            script.train(script.Args(eval_checkpoint=path))
        with pytest.raises(SystemExit, match=message):
            script.parse_args(["--resume", path])


def test_a_checkpoint_of_another_env_with_the_same_shapes_is_refused(script, saved_run):
    with pytest.raises(SystemExit, match="holds a policy for Walker2d-v5, not for HalfCheetah"):
        script.train(script.parse_args(["--resume", saved_run, "--env-id", "HalfCheetah-v5"]))
    with pytest.raises(SystemExit, match="holds a policy for Walker2d-v5, not for HalfCheetah"):
        script.parse_args(["--eval-checkpoint", saved_run, "--env-id", "HalfCheetah-v5"])
    assert script.parse_args(["--eval-checkpoint", saved_run]).env_id == "Walker2d-v5"


def test_flags_that_shape_the_networks_cannot_change_on_resume(script, saved_run):
    for flags, message in [
        (
            ["--actor-layers", "32", "32"],
            "--actor-layers cannot change on resume \\(saved: \\(64, ",
        ),
        (["--critic-layers", "8"], "--critic-layers cannot change on resume"),
        (["--optimizer", "muon"], "--optimizer cannot change on resume \\(saved: adam\\)"),
    ]:
        if script.__name__ == "ppo_spo" and flags[0] == "--actor-layers":
            message = message.replace("64, ", "256, ")
        with pytest.raises(SystemExit, match=message):
            script.train(script.parse_args(["--resume", saved_run, *flags]))


def copy_of(saved_run, tmp_path):
    (tmp_path / "run").mkdir()
    path = tmp_path / "run" / "checkpoint.pt"
    path.write_bytes(open(saved_run, "rb").read())
    return str(path)


def test_resume_takes_the_learning_rates_typed_now(script, tmp_path):
    """load_state_dict brings back the saved initial_lr of every group; the new flags must win:
    actor and critic, Adam and Muon (--optimizer muon has both), with and without --desired-kl."""
    script.train(small_args(script, tmp_path, optimizer="muon", actor_layers=(8, 8, 8)))
    path = only_checkpoint(tmp_path)
    typed = ["--resume", path, "--total-timesteps", "384", "--learning-rate", "0.001"]
    typed += ["--critic-learning-rate", "0.002", "--no-anneal-lr"]
    script.train(script.parse_args(typed))
    events = read_events(os.path.dirname(path))
    assert events.Scalars("charts/learning_rate")[-1].value == pytest.approx(0.001)
    ckpt = script.load_checkpoint(path)
    assert len(ckpt["optimizers"]) == 2
    for opt in ckpt["optimizers"]:
        initial = {group["name"]: group["initial_lr"] for group in opt["param_groups"]}
        assert initial == {"actor": 0.001, "critic": 0.002}
    script.train(script.parse_args([*typed, "--total-timesteps", "512", "--desired-kl", "0.01"]))
    scale = script.load_checkpoint(path)["lr_scale"]
    events = read_events(os.path.dirname(path))
    assert events.Scalars("charts/learning_rate")[-1].value == pytest.approx(0.001 * scale)


def test_resume_says_that_log_dir_is_ignored(script, saved_run, tmp_path, capsys):
    path = copy_of(saved_run, tmp_path)
    typed = ["--resume", path, "--total-timesteps", "384", "--log-dir", str(tmp_path / "other")]
    script.train(script.parse_args(typed))
    out = capsys.readouterr().out
    assert f"note: --log-dir is ignored on resume: the run goes on in {tmp_path / 'run'}" in out
    assert "log_dir=" not in out.split("changed: ")[1].splitlines()[0]


# evaluate_checkpoint and __main__ are the same harness in ppo_continuous, ppo_spo and ppo_symaug:
# the subprocess and rendering tests below run where the code differs.
@pytest.mark.parametrize("name", ["ppo_continuous", "appo_vtrace"])
def test_eval_checkpoint_records_a_video(name, tmp_path, capsys):
    script = importlib.import_module(name)
    script.train(small_args(script, tmp_path / "run"))
    saved_run = only_checkpoint(tmp_path / "run")
    videos = tmp_path / "videos"
    args = script.Args(eval_checkpoint=saved_run, eval_episodes=1)
    args.capture_video, args.video_dir = True, str(videos)
    script.train(args)
    (video,) = videos.glob("*/eval_checkpoint_step256_*.mp4")  # _<time>: a re-film is new
    assert video.stat().st_size > 1000
    out = capsys.readouterr().out
    assert f"wrote {video}" in out
    assert re.search(r"Walker2d-v5: deterministic return -?[\d.]+ ± 0.0 over 1 episode\n", out)


# The lines of ppo_continuous.py's harness (banner to end) that each copy changes, where its
# algorithm differs: what `diff <(awk '/^# Harness:/{f=1} f' ppo_continuous.py) <(awk '/^#
# Harness:/{f=1} f' X.py)` lists. Any change to one copy alone moves the count.
HARNESS_DIFF = {"ppo_spo": 0, "ppo_symaug": 3, "ppo_ddp": 47, "appo_vtrace": 31}
HARNESS_DIFF["ppo_teacher_student"] = 34  # the teacher's loader, the student's envs (its saved
# --history and --student-obs), its progress and final lines (the teacher's return, the action
# error), DAgger's kept rollouts on resume; and no --privileged-actor to check on resume: a
# student reads its deployable obs only


def harness(name: str) -> list[str]:
    with open(os.path.join(ROOT, f"{name}.py")) as file:
        text = file.read()
    return text[text.index("\n# Harness:") :].splitlines()


@pytest.mark.parametrize("name", list(HARNESS_DIFF))
def test_every_harness_is_ppo_continuous_s_where_the_algorithm_is(name):
    # So the subprocess and rendering tests need not run on every script: the copies are the same.
    diff = difflib.unified_diff(harness("ppo_continuous"), harness(name), n=0, lineterm="")
    changed = [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert len(changed) == HARNESS_DIFF[name], "\n".join(changed)
