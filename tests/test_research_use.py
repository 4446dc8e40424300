"""Research use off the main path, in every script: runs launched together, preemption (SIGTERM),
divergence, a full disk, folders that refuse, custom envs, and the small things a user trips over.
Each test fails on the code before these cases were handled."""

import contextlib
import copy
import dataclasses
import importlib
import os
import re
import signal
import subprocess
import sys
import threading
import time

import gymnasium as gym
import pytest
import torch
from conftest import (
    PPO_FAMILY,
    ROOT,
    allow_toy_env,
    only_checkpoint,
    small_args,
    toy_rollout_and_batch,
)


def toy_env_args(script, log_dir, env_id, **overrides):
    """small_args on a toy env (identity mirror map for ppo_symaug: see allow_toy_env)."""
    fields = dict(env_id=env_id, num_steps=16, total_timesteps=64, **overrides)
    return small_args(script, log_dir, **fields)


# ---------------------------------------------------------------------------------------------
# Run directories: one per run, even for runs started in the same second, with portable names
# ---------------------------------------------------------------------------------------------
class FrozenClock:
    """time.time() that stays in one second (advancing a millisecond a call, for the SPS)."""

    def __init__(self):
        self.now = 1_000_000.0

    def time(self):
        self.now += 1e-3
        return self.now

    def __getattr__(self, name):
        return getattr(time, name)


def test_runs_started_in_the_same_second_get_their_own_directories(script, tmp_path, monkeypatch):
    monkeypatch.setattr(script, "time", FrozenClock())
    args = small_args(script, tmp_path, total_timesteps=128)
    script.train(args)
    script.train(dataclasses.replace(args, learning_rate=1e-3))  # a sweep's other point
    first, second = sorted(tmp_path.iterdir())
    assert second.name == f"{first.name}-2"
    for run_dir in (first, second):
        assert len(list(run_dir.glob("events.out.tfevents*"))) == 1
    assert script.load_checkpoint(str(second / "checkpoint.pt"))["args"]["learning_rate"] == 1e-3


def test_run_directories_are_made_atomically_and_named_portably(tmp_path, monkeypatch):
    ppo = importlib.import_module("ppo_continuous")
    monkeypatch.setattr(ppo, "time", FrozenClock())
    args = ppo.Args(env_id="my_envs:MyEnv-v0", exp_name="sweep/a", log_dir=str(tmp_path))
    made = []
    threads = [
        threading.Thread(target=lambda: made.append(ppo.new_run_dir(args))) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(made)) == 8 and all(os.path.isdir(path) for path in made)
    assert sorted(os.listdir(tmp_path))[0] == "my_envs_MyEnv-v0__sweep_a__1__1000000"


# ---------------------------------------------------------------------------------------------
# SIGTERM (a cluster's preemption) stops like Ctrl-C: after the iteration, saved, exit 143
# ---------------------------------------------------------------------------------------------
def test_sigterm_finishes_the_iteration_saves_and_exits_143(script, tmp_path, monkeypatch, capfd):
    original = script.ppo_loss
    calls = []

    def loss_then_sigterm(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # 2 minibatches per iteration: iteration 2's first
            signal.raise_signal(signal.SIGTERM)
        return original(*args, **kwargs)

    monkeypatch.setattr(script, "ppo_loss", loss_then_sigterm)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped:
        script.train(small_args(script, tmp_path, total_timesteps=640, checkpoint_every=0))
    assert stopped.value.code == 143
    assert script.load_checkpoint(only_checkpoint(tmp_path))["global_step"] == 256
    err = capfd.readouterr().err
    assert "SIGTERM: stopped at step 256; resume with: " in err and "Traceback" not in err
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_second_signal_stops_at_once_with_its_exit_code(signum, tmp_path):
    ppo = importlib.import_module("ppo_continuous")
    run = {"dir": str(tmp_path), "checkpoint": str(tmp_path / "checkpoint.pt"), "start_line": ""}
    with pytest.raises(SystemExit) as stopped:
        with ppo.run_guard(run, ppo.Args(log_dir=str(tmp_path))) as signals:
            signal.raise_signal(signum)  # must not raise: see test_ppo_family's Ctrl-C test
            assert signals["signum"] == signum
            signal.raise_signal(signum)
            pytest.fail("the second signal must stop at once")
    assert stopped.value.code == 128 + signum


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="looks for the actors through /proc")
def test_sigterm_to_every_process_of_appo_stops_it_cleanly(tmp_path):
    # A scheduler may signal the whole process group: the actors ignore it, and the learner
    # finishes its iteration, saves, stops them and leaves no semaphore behind.
    flags = ["--env-id", "Walker2d-v5", "--num-envs", "2", "--num-steps", "64", "--log-dir"]
    flags += [str(tmp_path), "--num-minibatches", "2", "--num-actors", "2"]
    proc = subprocess.Popen(
        [sys.executable, "appo_vtrace.py", *flags],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 120
        while "iter 2/" not in proc.stdout.readline():
            assert time.time() < deadline and proc.poll() is None
        actors = children(proc.pid)
        assert len(actors) == 2
        os.kill(actors[0], signal.SIGTERM)  # an actor alone: it must go on
        for _ in range(2):
            assert "iter " in proc.stdout.readline()
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err
    assert re.search(r"SIGTERM: stopped at step \d+; resume with: python appo_vtrace.py", err)
    assert "Traceback" not in err and "Warning" not in err and "leaked" not in err, err
    assert not any(os.path.exists(f"/proc/{pid}") for pid in actors)


def children(pid: int) -> list[int]:
    """The actors among the processes that pid started (the other is multiprocessing's tracker)."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(child) for child in f.read().split()]
    return [
        child for child in found if b"spawn_main" in open(f"/proc/{child}/cmdline", "rb").read()
    ]


# ---------------------------------------------------------------------------------------------
# Divergence: one line, and no checkpoint that holds a NaN
# ---------------------------------------------------------------------------------------------
def test_a_diverging_run_stops_in_one_line_and_keeps_the_last_good_checkpoint(script, tmp_path):
    script.train(small_args(script, tmp_path, total_timesteps=128, eval_every=1))
    path = only_checkpoint(tmp_path)
    saved = {
        name: open(f"{os.path.dirname(path)}/{name}", "rb").read()
        for name in ("checkpoint.pt", "best.pt")
    }
    args = script.parse_args(
        ["--resume", path, "--total-timesteps", "640", "--learning-rate", "1e6"]
    )
    args = dataclasses.replace(args, checkpoint_every=1, eval_every=1)
    with pytest.raises(SystemExit) as stopped:
        script.train(args)
    message = str(stopped.value.code)
    assert re.match(
        r"error: iteration 2 diverged \(.* not finite\); try a lower --learning-rate", message
    )
    assert message.endswith(f"last good checkpoint: {path}")
    for name, data in saved.items():  # neither was overwritten with the diverged policy
        assert open(f"{os.path.dirname(path)}/{name}", "rb").read() == data, name
    # The run's lock went with the error, though the exception (here `stopped`, in a notebook the
    # last traceback) still holds train()'s frame: the run resumes in this same process.
    assert stopped.value.code
    metrics = script.train(script.parse_args(["--resume", path, "--total-timesteps", "256"]))
    assert metrics["global_step"] == 256


def test_a_run_that_diverges_at_once_has_no_checkpoint_yet(tmp_path):
    ppo = importlib.import_module("ppo_continuous")
    with pytest.raises(SystemExit, match="iteration 1 diverged.*last good checkpoint: none yet"):
        ppo.train(small_args(ppo, tmp_path, learning_rate=1e6))
    assert not list(tmp_path.glob("*/*.pt"))


# ---------------------------------------------------------------------------------------------
# A full disk, and folders that look writable but refuse
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def small_disk(path, options: str):
    """A tmpfs of this size at path (root only); the test is skipped where mounting is refused."""
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def test_a_full_disk_while_saving_keeps_the_last_checkpoint(script, tmp_path):
    # Room for one checkpoint and the event file, not for the .tmp of the next one beside it.
    script.train(small_args(script, tmp_path / "probe", total_timesteps=128))
    size = os.path.getsize(only_checkpoint(tmp_path / "probe"))
    with small_disk(tmp_path / "disk", f"size={size * 3 // 2 + 32 * 1024}") as disk:
        args = small_args(script, disk, total_timesteps=640, checkpoint_every=1)
        with pytest.raises(SystemExit) as stopped:
            script.train(args)
        path = only_checkpoint(disk)
        assert stopped.value.code == f"error: no space left on device while writing {path}"
        assert script.load_checkpoint(path)["global_step"] == 128
        assert not list(disk.glob("*/*.tmp"))


def test_a_full_disk_under_tensorboard_is_one_line(script, tmp_path, monkeypatch, capfd):
    # TensorBoard's writer thread dies of the error: Python's own hook would print its traceback
    # (pytest's turns it into a warning instead).
    monkeypatch.setattr(threading, "excepthook", threading.__excepthook__)
    with small_disk(tmp_path / "disk", "size=64k") as disk:
        (disk / "filler").write_bytes(b"\0" * 64 * 1024)  # fills it, but for folders
        with pytest.raises(SystemExit, match=r"^error: no space left on device while writing "):
            script.train(small_args(script, disk / "runs"))
    assert "Traceback" not in capfd.readouterr().err


def test_a_folder_that_refuses_files_is_found_before_any_env_is_built(
    script, tmp_path, monkeypatch
):
    # A tmpfs out of inodes: os.access tells root it is writable; making anything there fails.
    with small_disk(tmp_path / "disk", "size=64k,nr_inodes=1") as disk:
        monkeypatch.setattr(script.gym, "make_vec", no_env)
        for overrides in (
            dict(log_dir=str(disk / "runs")),
            dict(capture_video=True, video_dir=str(disk)),
        ):
            args = dataclasses.replace(small_args(script, tmp_path / "runs"), **overrides)
            with pytest.raises(SystemExit, match="cannot write there .*No space left on device"):
                script.train(args)


def no_env(*args, **kwargs):
    raise AssertionError("an env was made before the bad input was found")


# ---------------------------------------------------------------------------------------------
# Custom envs: module:EnvId, Dict and Tuple observations, NaN and inf
# ---------------------------------------------------------------------------------------------
def test_a_custom_env_module_that_cannot_be_imported_is_one_line(script, tmp_path):
    env_id = "no_such_module:MyEnv-v0"
    message = f"^error: cannot make {env_id}: No module named 'no_such_module'[^\\n]*$"
    with pytest.raises(SystemExit, match=message):
        script.train(small_args(script, tmp_path, env_id=env_id))
    script.train(small_args(script, tmp_path, total_timesteps=128))  # a run, then its env gone
    path = only_checkpoint(tmp_path)
    ckpt = torch.load(path, weights_only=True)
    ckpt["env_id"] = ckpt["args"]["env_id"] = env_id
    torch.save(ckpt, path)
    for argv in (["--resume", path, "--total-timesteps", "256"], ["--eval-checkpoint", path]):
        with pytest.raises(SystemExit, match=message):
            script.train(script.parse_args(argv))


def test_dict_and_tuple_observations_are_flattened(script, tmp_path, monkeypatch):
    allow_toy_env(script, monkeypatch)
    script.train(toy_env_args(script, tmp_path, "toy_envs:DictObservations-v0"))
    ckpt = script.load_checkpoint(only_checkpoint(tmp_path))
    assert ckpt["obs_dim"] == 5  # position 2, the step count 1, one-hot of Discrete(2) 2
    envs = script.make_envs("toy_envs:DictObservations-v0", 1)
    obs, _ = envs.reset(seed=0)
    obs, *_ = envs.step(envs.action_space.sample())
    assert obs.tolist() == [[0.0, 0.0, 1.0, 0.0, 1.0]]  # position, then step 1 and one-hot 1
    args = script.Args(eval_checkpoint=only_checkpoint(tmp_path), eval_episodes=2)
    assert script.train(args)["eval/episodic_return"] == 5.0


def test_an_observation_that_cannot_be_flattened_is_one_line(script, tmp_path, monkeypatch):
    allow_toy_env(script, monkeypatch)
    with pytest.raises(SystemExit, match="GraphObservations-v0: its observation space cannot be"):
        script.train(toy_env_args(script, tmp_path, "toy_envs:GraphObservations-v0"))


@pytest.mark.parametrize("what", ["Observation", "Reward"])
def test_a_non_finite_observation_or_reward_is_one_line(script, what, tmp_path, monkeypatch, capfd):
    allow_toy_env(script, monkeypatch)
    env_id = f"toy_envs:NonFinite{what}-v0"
    expected = (
        f"error: NonFinite{what}-v0 returned a non-finite observation or reward at its step 3"
    )
    with pytest.raises(SystemExit) as stopped:
        script.train(toy_env_args(script, tmp_path, env_id))
    if script.__name__ == "appo_vtrace":  # in an actor: its line, then the learner's
        assert expected in capfd.readouterr().err
        assert "actor 0" in str(stopped.value.code) and "died (exit code 1)" in str(
            stopped.value.code
        )
    else:
        assert str(stopped.value.code).startswith(expected)


# ---------------------------------------------------------------------------------------------
# Small things: a run directory to resume, a complete run, the ETA, --help
# ---------------------------------------------------------------------------------------------
def test_resume_takes_a_run_directory_and_says_when_a_run_is_complete(script, tmp_path):
    script.train(small_args(script, tmp_path))
    run_dir = os.path.dirname(only_checkpoint(tmp_path))
    with pytest.raises(SystemExit) as stopped:
        script.train(script.parse_args(["--resume", run_dir]))
    message = str(stopped.value.code)
    complete = f"the run of {run_dir} is complete at step 256; to train on, resume with a larger"
    assert complete in message
    assert (
        script.train(script.parse_args(["--resume", run_dir, "--total-timesteps", "384"]))[
            "global_step"
        ]
        == 384
    )
    assert os.listdir(tmp_path) == [os.path.basename(run_dir)]  # it went on in its own directory


class NoWriter:
    def add_scalar(self, *args):
        pass


def test_the_eta_of_a_long_run_is_in_days_and_hours(capsys):
    ppo = importlib.import_module("ppo_continuous")
    run = {"start_step": 0, "start_time": time.time() - 1000.0, "end_step": 100_001_000}
    run["eval_seconds"] = 0.0  # no evaluation yet
    run.update(first_iteration=1, last_iteration=50_000, writer=NoWriter())
    optimizers = [torch.optim.Adam([torch.zeros(1, requires_grad=True)])]
    progress = {
        "global_step": 1000,
        "iteration": 1,
        "command_scale": 1.0,
    }  # 1 step per second: 100M seconds to go
    ppo.log_iteration(run, {}, optimizers, {"episodes": []}, progress)
    assert "| ETA 1157d 09:46:40" in capsys.readouterr().out


def test_help_starts_with_short_lines(script, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        script.parse_args(["--help"])
    head = capsys.readouterr().out.split("╭")[0]  # before the table of flags
    assert script.__doc__.splitlines()[0] in head
    assert max(len(line) for line in head.splitlines()) <= 100


# ---------------------------------------------------------------------------------------------
# Four deliberate one-line bugs that no fast test caught before
# ---------------------------------------------------------------------------------------------
def test_muon_takes_the_hidden_weight_matrices_only(script):
    agent = script.Agent(5, 3, script.Args(actor_layers=(8, 8, 8), critic_layers=(8, 8, 8)))
    hidden = {id(net[i].weight) for net in (agent.actor_mean, agent.critic) for i in (2, 4)}
    assert script.muon_params(agent) == hidden  # not the first layer, not the last
    _, muon = script.make_optimizers(agent, script.Args(optimizer="muon"))
    assert {id(p) for group in muon.param_groups for p in group["params"]} == hidden


@pytest.mark.parametrize("name", PPO_FAMILY)
def test_evaluation_uses_seeds_the_training_envs_never_see(name, tmp_path, monkeypatch):
    script = importlib.import_module(name)
    seeds = {"train": set(), "eval": set()}
    original = gym.vector.SyncVectorEnv.reset

    def recording_reset(self, seed=None, options=None):
        kind = "eval" if self.num_envs == 3 else "train"  # 3 evaluation episodes, 2 envs
        seeds[kind] |= set(range(seed, seed + self.num_envs))
        return original(self, seed=seed, options=options)

    monkeypatch.setattr(gym.vector.SyncVectorEnv, "reset", recording_reset)
    script.train(small_args(script, tmp_path, eval_every=1, eval_episodes=3))
    assert seeds["train"] and seeds["eval"] and not seeds["train"] & seeds["eval"]


def test_appo_evaluates_on_seeds_its_actors_never_see(tmp_path, monkeypatch):
    # The actors reset in processes of their own, with the seeds that --seed documents: env i of
    # actor a gets seed + a * num_envs + i. Evaluation resets here.
    appo = importlib.import_module("appo_vtrace")
    seeds, original = set(), gym.vector.SyncVectorEnv.reset

    def recording_reset(self, seed=None, options=None):
        seeds.update(range(seed, seed + self.num_envs))
        return original(self, seed=seed, options=options)

    monkeypatch.setattr(gym.vector.SyncVectorEnv, "reset", recording_reset)
    args = small_args(appo, tmp_path, num_actors=2, eval_every=1, eval_episodes=3)
    appo.train(args)
    actors = set(range(args.seed, args.seed + args.num_actors * args.num_envs))
    assert seeds and not seeds & actors


class GradientRecorder:
    """Stands in for the optimizers: keeps the norms of the actor's and the critic's gradients
    as a step would see them."""

    def __init__(self, agent):
        self.agent, self.norms = agent, {}

    def zero_grad(self, set_to_none=True):
        self.agent.zero_grad(set_to_none=set_to_none)

    def step(self):
        for part, params in [
            ("actor", self.agent.actor_parameters()),
            ("critic", self.agent.critic.parameters()),
        ]:
            norms = torch.stack([torch.linalg.vector_norm(p.grad) for p in params])
            self.norms[part] = torch.linalg.vector_norm(norms).item()


@pytest.mark.parametrize("name", PPO_FAMILY)
def test_actor_and_critic_gradients_are_each_clipped(name, monkeypatch):
    script = importlib.import_module(name)
    agent, args, *_, batch = toy_rollout_and_batch(script, monkeypatch, num_minibatches=1)
    args = dataclasses.replace(args, max_grad_norm=1e-4)
    recorder = GradientRecorder(agent)
    metrics, _ = script.ppo_update(agent, [recorder], script.ppo_loss, batch, 1.0, args)
    assert recorder.norms == {
        "actor": pytest.approx(1e-4, rel=1e-2),
        "critic": pytest.approx(1e-4, rel=1e-2),
    }
    assert min(metrics["losses/actor_grad_norm"], metrics["losses/critic_grad_norm"]) > 1e-3


def test_resume_restores_the_torch_generator(script, tmp_path):
    script.train(small_args(script, tmp_path))
    expected = torch.rand(4)  # the run's next draw: nothing after its last save draws from torch
    path = only_checkpoint(tmp_path)
    ckpt = script.load_checkpoint(path)
    args = dataclasses.replace(script.saved_args(ckpt), resume=path)
    agent = script.Agent(ckpt["obs_dim"], ckpt["act_dim"], args)
    target = [copy.deepcopy(agent)] if script.__name__ == "appo_vtrace" else []
    torch.manual_seed(args.seed)  # as train() does before it resumes
    optimizers = script.make_optimizers(agent, args)
    script.resume_run(ckpt, args, agent, *target, optimizers, script.RunningMeanStd())
    assert torch.equal(torch.rand(4), expected)


# ---------------------------------------------------------------------------------------------
# --init-from: a new run from a checkpoint's networks and observation normalizer, nothing else
# ---------------------------------------------------------------------------------------------
def test_init_from_takes_the_weights_and_normalizer_and_starts_the_rest_afresh(
    script, tmp_path, capsys
):
    script.train(small_args(script, tmp_path / "a"))  # 2 iterations of 128 steps, 2 steps each
    source = script.load_checkpoint(only_checkpoint(tmp_path / "a"))
    # A learning rate so small that no weight can move: those the run ends with are the source's.
    run_dir = os.path.dirname(only_checkpoint(tmp_path / "a"))  # a run directory will do
    fields = dict(init_from=run_dir, learning_rate=1e-12, total_timesteps=128)
    script.train(small_args(script, tmp_path / "b", **fields))
    assert (
        "note: starting from the networks and observation normalizer of" in capsys.readouterr().out
    )
    ckpt = script.load_checkpoint(only_checkpoint(tmp_path / "b"))
    for key, value in source["agent"].items():
        if "obs_rms" not in key:
            torch.testing.assert_close(ckpt["agent"][key], value, rtol=0, atol=1e-8)
    count = source["agent"]["obs_rms.count"].item()
    # It went on from the source's statistics, by one iteration's observations (half of what the
    # source's two iterations gave it: ppo_symaug feeds it mirrored copies too).
    assert ckpt["agent"]["obs_rms.count"].item() == pytest.approx(count + (count - 1e-4) / 2)
    assert ckpt["global_step"] == 128 and ckpt["iteration"] == 1  # a new count
    assert ckpt["reward_rms"]["count"] < source["reward_rms"]["count"]  # a new scaler
    adam_steps = {s["step"].item() for s in ckpt["optimizers"][0]["state"].values()}
    assert adam_steps == {2.0}  # a new optimizer: one iteration's two minibatches
    assert script.load_checkpoint(only_checkpoint(tmp_path / "a"))["global_step"] == 256


def test_init_from_refuses_other_shapes_and_resume_notes_another_env_and_is_not_resumed(
    tmp_path, capsys
):
    ppo = importlib.import_module("ppo_continuous")  # the harness of every script: test_contract
    ppo.train(small_args(ppo, tmp_path / "a", actor_layers=(8, 8)))
    source = only_checkpoint(tmp_path / "a")
    edited = torch.load(source, weights_only=False)  # a checkpoint without its normalizer
    del edited["agent"]["obs_rms.mean"]
    torch.save(edited, tmp_path / "edited.pt")
    small = {"init_from": source, "actor_layers": (8, 8)}
    refused = [
        ({"init_from": source}, f"--init-from {source}: its --actor-layers are 8 8, not 64 64"),
        ({**small, "env_id": "Hopper-v5"}, "Walker2d-v5 has 17 observations and 6 actions, Hopper"),
        ({**small, "init_from": f"{tmp_path}/edited.pt"}, "other networks (Missing key(s) in st"),
        ({**small, "resume": source}, "--init-from starts a new run from a checkpoint's weights"),
    ]
    for fields, message in refused:
        with pytest.raises(SystemExit) as stopped:
            ppo.train(small_args(ppo, tmp_path / "b", **fields))
        assert message in str(stopped.value.code)
    # HalfCheetah has Walker2d's shapes: fine-tuning on another task, said at the start.
    typed = ["--init-from", source, "--env-id", "HalfCheetah-v5", "--actor-layers", "8", "8"]
    typed += ["--total-timesteps", "128", "--num-envs", "2", "--num-steps", "64"]
    ppo.train(ppo.parse_args([*typed, "--log-dir", str(tmp_path / "c"), "--eval-episodes", "1"]))
    assert f"of {source} (step 256); it was trained on Walker2d-v5" in capsys.readouterr().out
    resumed = ppo.parse_args(["--resume", str(tmp_path / "c" / os.listdir(tmp_path / "c")[0])])
    assert resumed.init_from is None  # the resumed run goes on from its own weights
    assert ppo.train(dataclasses.replace(resumed, total_timesteps=256))["global_step"] == 256
