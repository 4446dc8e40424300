"""Checkpoints, resume and the command line, in every script (appo_vtrace.py included).

ppo_ddp.py runs here as a single process (no torchrun); tests/test_ppo_ddp.py covers two ranks.
"""

import copy
import importlib
import os
import re
import signal

import pytest
import torch
from conftest import flags, only_checkpoint, run_script, small_args


# ---------------------------------------------------------------------------------------------
# Resume: what the user typed wins, and any --num-envs works
# ---------------------------------------------------------------------------------------------
def test_resume_with_other_num_envs_and_flags_set_back_to_default(script, tmp_path):
    script.train(small_args(script, tmp_path, anneal_lr=False, desired_kl=0.01))
    path = only_checkpoint(tmp_path)

    kept = script.parse_args(["--resume", path])
    assert kept.anneal_lr is False and kept.desired_kl == 0.01 and kept.num_envs == 2

    # Back to the defaults, which a "differs from the default" rule could not tell from no flag.
    typed = [
        *flags(resume=path, anneal_lr=True, desired_kl="None", num_envs=4, total_timesteps=768),
    ]
    args = script.parse_args(typed)
    assert args.anneal_lr is True and args.desired_kl is None and args.num_envs == 4
    assert args.num_steps == 64 and args.env_id == "Walker2d-v5"  # the rest as saved
    # 4 envs x 64 steps = 256 per batch: steps 256 -> 768 are two iterations.
    assert script.train(args)["global_step"] == 768


def test_a_checkpoint_of_no_run_goes_on_in_a_new_run_and_stays_as_it_is(script, tmp_path, capsys):
    """A checkpoint file that is no run's checkpoint.pt or best.pt (README: the committed
    benchmarks/robots/<script>-<env>.pt, three in one folder) is not its folder's run: a resume
    of it goes on in a new run directory under --log-dir, and leaves the file and its folder as
    they were (no checkpoint.pt, event file or .lock beside it)."""
    script.train(small_args(script, tmp_path / "trained"))
    committed = tmp_path / "robots" / f"{script.__name__}-Walker2d-v5.pt"
    committed.parent.mkdir()
    committed.write_bytes(open(only_checkpoint(tmp_path / "trained"), "rb").read())
    saved = committed.read_bytes()
    capsys.readouterr()
    typed = flags(resume=committed, total_timesteps=384, log_dir=tmp_path / "runs")
    assert script.train(script.parse_args(typed))["global_step"] == 384
    assert list(committed.parent.iterdir()) == [committed] and committed.read_bytes() == saved
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert script.load_checkpoint(str(run_dir / "checkpoint.pt"))["global_step"] == 384
    out = capsys.readouterr().out
    assert f"note: {committed} stays as it is: a new run goes on from it (under --log-dir)" in out
    assert " at step 256; changed: total_timesteps=384\n" in out  # what was typed, no path
    trained = os.path.dirname(only_checkpoint(tmp_path / "trained"))
    for own in ("checkpoint.pt", "best.pt"):  # a run's own files (and the run) go on in the run
        assert script.run_dir_of(os.path.join(trained, own), resume=True) == trained
    assert script.run_dir_of(trained, resume=True) == trained
    assert script.run_dir_of(str(committed), resume=True) is None


def test_a_resume_goes_on_from_every_value_its_checkpoint_holds(ppo, tmp_path, monkeypatch):
    """The first resumed iteration starts where the saved run stopped: the agent (its normalizer
    included), the optimizers' moments, the reward scaler, torch's generator, the step and the
    learning-rate scale (the desired-KL rule's). A value a resume left behind would start over."""
    ppo.train(small_args(ppo, tmp_path, anneal_lr=False, desired_kl=0.01))
    path = only_checkpoint(tmp_path)
    ckpt = ppo.load_checkpoint(path)
    assert ckpt["lr_scale"] != 1.0  # not vacuous: the rule has moved it
    seen, set_learning_rate, collect_rollout = {}, ppo.set_learning_rate, ppo.collect_rollout

    def first_learning_rate(optimizers, scale):
        if "optimizers" not in seen:
            seen.update(optimizers=[copy.deepcopy(opt.state_dict()) for opt in optimizers])
            seen["lr_scale"] = scale
        set_learning_rate(optimizers, scale)

    def first_rollout(agent, envs, reward_rms, carry, step, writer, args):
        if "agent" not in seen:
            seen.update(agent=copy.deepcopy(agent.state_dict()), step=step)
            seen.update(reward_rms=copy.deepcopy(reward_rms.state_dict()))
            seen["rng"] = torch.get_rng_state()
        return collect_rollout(agent, envs, reward_rms, carry, step, writer, args)

    monkeypatch.setattr(ppo, "set_learning_rate", first_learning_rate)
    monkeypatch.setattr(ppo, "collect_rollout", first_rollout)
    metrics = ppo.train(ppo.parse_args(["--resume", path, "--total-timesteps", "384"]))
    assert seen["step"] == ckpt["global_step"] == 256 and metrics["global_step"] == 384
    assert seen["lr_scale"] == ckpt["lr_scale"]
    assert torch.equal(seen["rng"], ckpt["rng"]["torch"])
    for name in ("agent", "reward_rms"):
        assert seen[name].keys() == ckpt[name].keys()
        for key, value in ckpt[name].items():
            assert torch.equal(seen[name][key], value), (name, key)
    for saved, resumed in zip(ckpt["optimizers"], seen["optimizers"], strict=True):
        assert saved["state"].keys() == resumed["state"].keys() and saved["state"]
        for index, moments in saved["state"].items():
            for key, value in moments.items():
                assert torch.equal(resumed["state"][index][key], value), (index, key)


def test_best_pt_after_a_resume_is_replaced_only_by_a_better_evaluation(
    script, tmp_path, monkeypatch
):
    """--eval-every keeps the best policy as best.pt; a resume remembers how good it was, so the
    first evaluation after it replaces best.pt only if it beats the best made before."""
    by_step = {128: 20.0, 256: 10.0, 384: 15.0, 512: 25.0}  # the evaluations' mean returns

    def evaluate(agent, args, videos, name, stop=None):
        mean = by_step.get(int(name.removeprefix("eval_step")), 0.0)
        return [{"return": mean, "length": 1, "fell": False, "terms": {}}], None

    monkeypatch.setattr(script, "evaluate", evaluate)
    script.train(small_args(script, tmp_path, eval_every=1))
    path = only_checkpoint(tmp_path)
    best = os.path.join(os.path.dirname(path), "best.pt")
    assert script.load_checkpoint(best)["global_step"] == 128
    script.train(script.parse_args(["--resume", path, "--total-timesteps", "384"]))
    assert script.load_checkpoint(best)["global_step"] == 128  # 15 does not beat 20
    script.train(script.parse_args(["--resume", path, "--total-timesteps", "512"]))
    assert script.load_checkpoint(best)["global_step"] == 512  # 25 does


def test_a_saved_cuda_flag_can_be_turned_off(script, tmp_path):
    script.train(small_args(script, tmp_path))
    path = only_checkpoint(tmp_path)
    ckpt = torch.load(path, weights_only=True)
    ckpt["args"]["cuda"] = True  # as if trained on a GPU machine
    torch.save(ckpt, path)
    assert script.parse_args(["--resume", path]).cuda is True
    assert script.parse_args(["--resume", path, "--no-cuda"]).cuda is False


def test_rounding_to_whole_batches_is_said_and_never_passes_the_total(script, tmp_path, capsys):
    metrics = script.train(small_args(script, tmp_path, total_timesteps=300))
    assert metrics["global_step"] == 256
    assert "note: training to step 256: --total-timesteps 300" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no whole batch of 128 steps"):
        script.train(small_args(script, tmp_path, total_timesteps=100))


def test_progress_line_shows_a_dash_before_the_first_episode_ends(script, tmp_path, capsys):
    # 8 steps: no Walker2d episode ends that soon.
    script.train(small_args(script, tmp_path, num_steps=8, total_timesteps=16))
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("iter 1/")]
    assert "| return - |" in line and "nan" not in line


# ---------------------------------------------------------------------------------------------
# Checkpoints: data only, and a second Ctrl-C leaves the last one alone
# ---------------------------------------------------------------------------------------------
class RunsCode:
    """Unpickling this object would call os.mkdir(marker): what a malicious checkpoint can do."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def test_a_crafted_checkpoint_is_refused_without_running_its_code(script, tmp_path):
    marker = tmp_path / "marker"
    crafted = tmp_path / "crafted.pt"
    torch.save({"script": script.__name__, "payload": RunsCode(str(marker))}, crafted)
    for load in (
        lambda: script.train(script.Args(eval_checkpoint=str(crafted))),
        lambda: script.parse_args(["--resume", str(crafted)]),
    ):
        with pytest.raises(SystemExit, match="refusing .*crafted.pt: it holds objects other"):
            load()
    assert not marker.exists()


def test_second_ctrl_c_leaves_the_last_checkpoint_as_it_was(script, tmp_path, monkeypatch, capfd):
    # Two presses in the middle of iteration 3's update: the first asks to stop after it, the
    # second stops at once. Checkpoint.pt (written after every iteration) must still hold step 256.
    original = script.ppo_loss
    calls = []
    snapshot = {}

    def loss_then_two_ctrl_c(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:  # 2 minibatches per iteration: iteration 3's first
            snapshot["bytes"] = open(only_checkpoint(tmp_path), "rb").read()
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
        return original(*args, **kwargs)

    monkeypatch.setattr(script, "ppo_loss", loss_then_two_ctrl_c)
    with pytest.raises(SystemExit) as stopped:
        script.train(small_args(script, tmp_path, total_timesteps=640, checkpoint_every=1))
    assert stopped.value.code == 130
    assert open(only_checkpoint(tmp_path), "rb").read() == snapshot["bytes"]
    assert script.load_checkpoint(only_checkpoint(tmp_path))["global_step"] == 256
    assert "stopped at once, without saving; last checkpoint:" in capfd.readouterr().err


# ---------------------------------------------------------------------------------------------
# Optimizers
# ---------------------------------------------------------------------------------------------
def test_weight_decay_reaches_every_parameter_group(script):
    agent = script.Agent(5, 3, script.Args(actor_layers=(8, 8, 8), critic_layers=(8, 8, 8)))
    for weight_decay in (0.0, 0.01):  # 0.0: torch.optim.Muon's own default would be 0.1
        args = script.Args(weight_decay=weight_decay, optimizer="muon")
        optimizers = script.make_optimizers(agent, args)
        assert len(optimizers) == 2
        for opt in optimizers:
            assert [g["weight_decay"] for g in opt.param_groups] == [weight_decay] * 2


def test_weight_decay_is_decoupled(script):
    """AdamW's decay: a parameter whose gradient is zero shrinks by exactly (1 - lr * wd) per step
    (as an L2 term in Adam's gradient, it would move by about lr, whatever its size)."""
    args = script.Args(weight_decay=0.1, learning_rate=0.01, critic_learning_rate=0.02)
    agent = script.Agent(5, 3, args)
    optimizers = script.make_optimizers(agent, args)
    for _ in range(2):  # the first step and one with Adam's moments
        before = {name: p.detach().clone() for name, p in agent.named_parameters()}
        for p in agent.parameters():
            p.grad = torch.zeros_like(p)
        for opt in optimizers:
            opt.step()
        for name, p in agent.named_parameters():
            lr = 0.02 if name.startswith("critic") else 0.01
            torch.testing.assert_close(p, before[name] * (1 - lr * 0.1), rtol=1e-6, atol=0)


# ---------------------------------------------------------------------------------------------
# What the user sees: help text, rendering failures, MuJoCo's warnings
# ---------------------------------------------------------------------------------------------
def test_help_describes_the_script_and_shows_each_default_once(script, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as stopped:
        script.parse_args(["--help"])  # what `python <script>.py --help` runs
    assert stopped.value.code == 0
    out = capsys.readouterr().out
    assert not re.search(r"\(default: [^()]*\)\s*\(default:", out)
    assert script.__doc__.splitlines()[0] in out
    assert "every evaluation (final, --eval-every, --eval-checkpoint)" in out


@pytest.mark.parametrize("name", ["ppo_continuous", "appo_vtrace"])  # the harness: test_contract
def test_a_renderer_that_cannot_load_is_one_line_and_training_goes_on(name, tmp_path):
    script = importlib.import_module(name)
    # MUJOCO_GL=bogus makes `import mujoco` raise, as osmesa without libosmesa6 does. HalfCheetah's
    # XML also makes MuJoCo warn about settotalmass for every env made (it has no mirror map).
    env_id = "Walker2d-v5" if script.__name__ == "ppo_symaug" else "HalfCheetah-v5"
    fields = dict(env_id=env_id, total_timesteps=128, num_envs=2, num_steps=64, num_minibatches=2)
    fields.update(update_epochs=1, eval_episodes=1, log_dir=tmp_path, capture_video=True)
    fields["video_dir"] = tmp_path / "videos"
    if script.__name__ == "appo_vtrace":
        fields.update(num_actors=1, num_rollouts=1)
    result = run_script(script.__name__, *flags(**fields), MUJOCO_GL="bogus")
    assert result.returncode == 0, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("warning: --capture-video") and "MUJOCO_GL=bogus" in line
    assert "deterministic eval" in result.stdout and not list(tmp_path.rglob("*.mp4"))


def test_the_rendering_check_runs_apart_and_says_why_it_failed(monkeypatch, capfd):
    # A GL library that fails can fail again when its half-built renderer is collected (EGL without
    # a vendor library), or take the process down: the check renders in a child process.
    script = importlib.import_module("ppo_continuous")
    assert script.rendering_error("Hopper-v5", "gymnasium") is None  # EGL with Mesa, as CI has
    monkeypatch.setenv("MUJOCO_GL", "bogus")
    error = script.rendering_error("Hopper-v5", "gymnasium")
    assert error.startswith("MUJOCO_GL=bogus: ") and "bogus" in error.split(": ", 1)[1]
    assert capfd.readouterr() == ("", "")
