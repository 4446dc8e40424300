"""What the test modules share: the scripts under test, the settings of short runs, the launchers
and the toy-env helpers. A test module imports what it needs from here (`from conftest import
...`), never from another test module."""

import glob
import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALL_SCRIPTS = ["ppo_continuous", "ppo_spo", "ppo_symaug", "ppo_ddp", "appo_vtrace"]
PPO_FAMILY = ALL_SCRIPTS[:4]  # ppo_continuous.py and its copies: one process, collect_rollout
ENV_ID = "Walker2d-v5"  # terminates and truncates, and has a left-right symmetry (ppo_symaug)
TOY_ENV = "toy_envs:CountsSteps-v0"  # obs = step count 0..5, reward 1, truncated after 5 steps
RUN_TAGS = ("charts/SPS", "charts/learning_rate", "charts/episodic_return", "eval/episodic_return")
CLEANRL_TAGS = {"charts/episodic_return", "charts/SPS", "losses/approx_kl", "eval/episodic_return"}


# The test files, longest first (their seconds in a full run on 2026-12-07): --dist loadfile
# hands whole files to the 2 workers in collection order (pytest.ini: --no-loadscope-reorder), so
# the last files to start are short ones and both workers finish together. A file not listed
# goes last.
LONGEST_FIRST = ["test_robot_options", "test_ppo_ddp", "test_robots", "test_appo_vtrace"]
LONGEST_FIRST += ["test_ppo_family", "test_research_use", "test_checkpoints_and_cli", "test_track"]
LONGEST_FIRST += ["test_seams", "test_hard_cases", "test_contract", "test_benchmarks"]
LONGEST_FIRST += ["test_teacher_student", "test_envpool", "test_ppo_symaug", "test_export_onnx"]
LONGEST_FIRST += ["test_robot_symmetry", "test_loss_terms_and_state", "test_ppo_spo"]


def file_rank(item) -> int:
    name = item.path.stem
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items):
    items.sort(key=file_rank)  # stable: each file's own order stays


@pytest.fixture(scope="module", params=ALL_SCRIPTS)
def script(request):
    """Each of the five scripts, imported as a module."""
    return importlib.import_module(request.param)


@pytest.fixture(scope="module", params=PPO_FAMILY)
def ppo(request):
    """Each script of the PPO family, imported as a module."""
    return importlib.import_module(request.param)


def small_args(script, log_dir, **overrides):
    """2 envs x 64 steps on Walker2d, one epoch of 2 minibatches, 2 iterations (appo_vtrace: one
    actor, one rollout per update)."""
    fields = dict(env_id=ENV_ID, total_timesteps=256, num_envs=2, num_steps=64, num_minibatches=2)
    fields.update(update_epochs=1, eval_episodes=1, log_dir=str(log_dir))
    if script.__name__ == "appo_vtrace":
        fields.update(num_actors=1, num_rollouts=1)
    return script.Args(**{**fields, **overrides})


def toy_args(ppo, log_dir, **overrides):
    """One iteration of 2 envs x 10 steps of CountsSteps: both envs are truncated at steps 4
    and 9."""
    return small_args(
        ppo, log_dir, **{"env_id": TOY_ENV, "total_timesteps": 20, "num_steps": 10, **overrides}
    )


def flags(**fields) -> list[str]:
    """The command line of these fields: flags(num_envs=2, capture_video=True) is
    ["--num-envs", "2", "--capture-video"]."""
    words = []
    for name, value in fields.items():
        words.append(f"--{name.replace('_', '-')}")
        if value is not True:
            words.append(str(value))
    return words


def only_checkpoint(log_dir) -> str:
    (path,) = log_dir.glob("*/checkpoint.pt")
    return str(path)


def run_script(name: str, *flags: str, **env: str):
    """python <name>.py <flags> in the repository, with these environment variables added; its
    output captured."""
    command = [sys.executable, f"{name}.py", *flags]
    environment = {**os.environ, **env}
    return subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=environment
    )


def torchrun(script: str, *flags: str, nproc: int = 2, **popen_kwargs):
    """torchrun --standalone of script (a path, or a file of the repository) with these flags."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}  # OMP: torchrun's warning
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
    command += [str(nproc), script, *flags]
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        **popen_kwargs,
    )  # fmt: skip


# Reward 1 every step, truncated after 5 steps, gamma 0.9: the true value is 1 / (1 - 0.9) = 10;
# treating truncation as termination gives at most 4.1. No normalizers; a larger critic rate.
BOOTSTRAP_RUN = dict(env_id="toy_envs:AlwaysTruncates-v0", num_envs=4, num_steps=50, gamma=0.9)
BOOTSTRAP_RUN.update(num_minibatches=2, update_epochs=4, norm_reward=False, norm_obs=False)
BOOTSTRAP_RUN.update(critic_learning_rate=3e-3, anneal_lr=False, eval_episodes=1)


def trained_value(script, args) -> float:
    """Train with args; the saved critic's value of the observation 0."""
    script.train(args)
    ckpt = script.load_checkpoint(only_checkpoint(Path(args.log_dir)))
    agent = script.Agent(1, 1, args)
    agent.load_state_dict(ckpt["agent"])
    return agent.get_value(torch.zeros(1, 1)).item()


def assert_finite_metrics(metrics: dict, tags: list[str], global_step: int):
    """These tags, and those of every run (RUN_TAGS), are in metrics and finite, at global_step."""
    for tag in (*tags, *RUN_TAGS):
        assert np.isfinite(metrics[tag]), tag
    assert metrics["global_step"] == global_step


def read_events(run_dir):
    """The run's newest TensorBoard event file, loaded (a resumed run has one per start). Not the
    whole folder: files made in the same second sort by pid and counter as text, and on a step
    lower than the last one read, the reader drops the later steps it has (a restart)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    newest = max(glob.glob(f"{run_dir}/events.out.tfevents.*"), key=os.path.getmtime)
    return EventAccumulator(newest, size_guidance={"scalars": 0}).Reload()


def allow_toy_env(ppo, monkeypatch):
    """ppo_symaug needs a mirror map of the env: the identity map is a symmetry of every env."""
    if hasattr(ppo, "make_mirror_fns"):
        monkeypatch.setattr(
            ppo, "make_mirror_fns", lambda env_id: (lambda obs: obs, lambda act: act)
        )


class RecordingWriter:
    """Stands in for TensorBoard's SummaryWriter: keeps (tag, value, step) of every scalar."""

    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, float(value), step))


def toy_rollout_and_batch(ppo, monkeypatch, env_id=TOY_ENV, **overrides):
    """collect_rollout called directly: one rollout of 2 envs x 10 steps of CountsSteps (or another
    toy env with 1-dim observations and actions), and the flat batch ppo_update takes (with GAE's
    advantages and returns)."""
    allow_toy_env(ppo, monkeypatch)
    torch.manual_seed(0)
    args = toy_args(ppo, "unused", **overrides)
    envs = ppo.make_envs(env_id, args.num_envs)
    agent = ppo.Agent(1, 1, args)
    agent.obs_rms.update(torch.arange(6.0)[:, None])  # statistics of the obs 0..5
    carry = ppo.start_episodes(envs, 100, args, torch.device("cpu"))
    writer = RecordingWriter()
    rollout = ppo.collect_rollout(agent, envs, ppo.RunningMeanStd(), carry, 100, writer, args)
    envs.close()
    advantages, returns = ppo.compute_gae(
        rollout["rewards"], rollout["values"], rollout["next_values"], rollout["terminated"],
        rollout["dones"], args.gamma, args.gae_lambda,
    )  # fmt: skip
    batch = {key: value.flatten(0, 1) for key, value in rollout.items()}
    batch["advantages"], batch["returns"] = advantages.flatten(), returns.flatten()
    return agent, args, carry, writer, rollout, batch
