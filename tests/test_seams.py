"""Tests of what flows between the functions, on the data of real short runs: each runs the real
thing briefly, records what it handed on, and checks that against an independent reading of the
same steps (a plain loop in the test), not against the function that computed it.

- the rollout -> GAE -> update: the batch the update gets, from the raw steps the env returned;
- the diagnostics (clip fractions, the divergence check) on hand-made inputs with known answers;
- evaluation -> best.pt: the checkpoint against the run's own log;
- evaluation: the seeds of its waves, the memory of a long one, a signal during the final one;
- the run directory: one process at a time, and free again after a crash.

appo_vtrace.py's learner-to-actor seams and ppo_ddp.py's rank-to-rank seams are tested in their
own files.
"""

import copy
import dataclasses
import importlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from conftest import (
    ALL_SCRIPTS,
    ENV_ID,
    ROOT,
    flags,
    only_checkpoint,
    read_events,
    small_args,
)


class StepRecorder:
    """A vector env that keeps what every step sent and returned: the actions, the observations,
    rewards and flags, and each finished episode's final observation."""

    def __init__(self, envs):
        self.envs, self.steps, self.first_obs = envs, [], None

    def reset(self, **kwargs):
        obs, info = self.envs.reset(**kwargs)
        self.first_obs = obs.copy()
        return obs, info

    def step(self, actions):
        obs, rewards, terminated, truncated, info = self.envs.step(actions)
        final = np.full_like(obs, np.nan)  # NaN where no episode ended: never to be read
        for i in np.flatnonzero(terminated | truncated):
            final[i] = info["final_obs"][i]
        step = dict(actions=np.array(actions), obs=obs.copy(), rewards=np.array(rewards))
        step.update(terminated=terminated.copy(), truncated=truncated.copy(), final_obs=final)
        self.steps.append(step)
        return obs, rewards, terminated, truncated, info

    def __getattr__(self, name):  # single_action_space, close, ...
        return getattr(self.envs, name)


def pooled_variance(x: np.ndarray) -> float:
    """The population variance that RunningMeanStd holds after seeing x: its prior is one sample's
    worth 1e-4 of count at mean 0 and variance 1."""
    count = 1e-4 + x.size
    mean = x.sum() / count
    return (1e-4 * (1.0 + mean**2) + ((x - mean) ** 2).sum()) / count


@pytest.mark.parametrize("backend", ["gymnasium", "envpool"])
def test_the_update_gets_what_a_plain_reading_of_the_rollout_gives(
    ppo, backend, tmp_path, monkeypatch
):
    """Two iterations of 4 Walker2d envs x 64 steps with a time limit of 20 steps (episodes end by
    falling and by the limit). Every batch the update gets is recomputed from the raw steps with
    the policy that collected them: the observations, actions and log-probs, the values, the scaled
    rewards, and the advantages and returns by GAE written as a plain loop over each episode
    (bootstrapping from V(final_obs) after a truncation, from V of the next state within the
    rollout and after its last step, from nothing after a termination). On both backends: the
    rollout cannot tell which one stepped the envs."""
    if backend == "envpool":
        pytest.importorskip("envpool")
    recorders, batches, make_envs, ppo_update = [], [], ppo.make_envs, ppo.ppo_update

    def recording_make_envs(env_id, num_envs, *rest, **kwargs):
        recorders.append(StepRecorder(make_envs(env_id, num_envs, *rest, max_episode_steps=20)))
        return recorders[-1]

    def recording_update(agent, optimizers, loss_fn, batch, lr_scale, args):
        policy = copy.deepcopy(getattr(agent, "module", agent))  # the one that collected it
        batches.append((policy, {key: value.clone() for key, value in batch.items()}))
        return ppo_update(agent, optimizers, loss_fn, batch, lr_scale, args)

    monkeypatch.setattr(ppo, "make_envs", recording_make_envs)
    monkeypatch.setattr(ppo, "ppo_update", recording_update)
    args = small_args(ppo, tmp_path, num_envs=4, num_steps=64, total_timesteps=512)
    args.env_backend = backend
    ppo.train(args)
    steps = recorders[0].steps  # the training envs (evaluation made the others)
    T, N, gamma, lam = args.num_steps, args.num_envs, args.gamma, args.gae_lambda
    assert len(steps) == 2 * T and len(batches) == 2
    terminated = np.array([s["terminated"] for s in steps])
    truncated = np.array([s["truncated"] for s in steps]) & ~terminated
    # Not vacuous: the rollouts hold terminations, truncations and episodes that run on past the
    # end of a rollout.
    assert terminated.any() and truncated.any()
    assert not (terminated[T - 1] | truncated[T - 1]).all()
    obs = np.concatenate([recorders[0].first_obs[None], [s["obs"] for s in steps]])  # s_0..s_2T
    rewards = np.array([s["rewards"] for s in steps])
    discounted, running = np.zeros_like(rewards), np.zeros(N)
    for k in range(2 * T):  # the discounted return of each env, from each episode's start
        running = running * gamma + rewards[k]
        discounted[k] = running
        running[terminated[k] | steps[k]["truncated"]] = 0.0
    for it, (policy, batch) in enumerate(batches):
        ks = range(it * T, (it + 1) * T)
        with torch.no_grad():
            value = [policy.get_value(torch.as_tensor(obs[k], dtype=torch.float32)) for k in ks]
            value.append(policy.get_value(torch.as_tensor(obs[(it + 1) * T], dtype=torch.float32)))
            finals = [np.nan_to_num(steps[k]["final_obs"]) for k in ks]  # NaN: not read
            final = [policy.get_value(torch.as_tensor(f, dtype=torch.float32)) for f in finals]
            logprobs = [
                policy.get_action_and_value(
                    torch.as_tensor(obs[k], dtype=torch.float32),
                    batch["actions"][t * N : (t + 1) * N],
                )["logprobs"]
                for t, k in enumerate(ks)
            ]
        value, final = torch.stack(value).numpy(), torch.stack(final).numpy()
        scale = np.sqrt(pooled_variance(discounted[: (it + 1) * T]) + 1e-8)
        scaled = np.clip(rewards[ks] / scale, -args.clip_reward, args.clip_reward)
        advantages, last = np.zeros((T, N)), np.zeros(N)
        for t in reversed(range(T)):
            k = it * T + t
            ended = terminated[k] | steps[k]["truncated"]
            next_value = np.where(truncated[k], final[t], value[t + 1])
            delta = scaled[t] + gamma * next_value * ~terminated[k] - value[t]
            last = delta + gamma * lam * last * ~ended
            advantages[t] = last
        flat = batch  # flat already: t-major, t * N + i
        np.testing.assert_allclose(flat["obs"].numpy(), obs[ks].reshape(T * N, -1), rtol=1e-6)
        sent = np.array([steps[k]["actions"] for k in ks]).reshape(T * N, -1)
        space = recorders[0].single_action_space
        np.testing.assert_allclose(sent, ppo.scale_action(flat["actions"].numpy(), space))
        # The log-probs and values of the one batched pass after the rollout are those of a pass
        # per step, to float rounding.
        np.testing.assert_allclose(flat["logprobs"], torch.stack(logprobs).flatten(), atol=1e-6)
        np.testing.assert_allclose(flat["values"], value[:T].flatten(), atol=1e-6, rtol=1e-6)
        np.testing.assert_allclose(flat["rewards"], scaled.flatten(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(flat["advantages"], advantages.flatten(), rtol=1e-4, atol=1e-5)
        returns = (advantages + value[:T]).flatten()
        np.testing.assert_allclose(flat["returns"], returns, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Diagnostics on hand-made inputs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL_SCRIPTS)
def test_clip_fractions_count_the_asymmetric_range_they_clip_to(name):
    """With --clip-low 0.2 --clip-high 0.3 the range is [0.8, 1.3]: of the ratios 0.75, 0.75,
    1.25, 1 two lie outside, both below. The mirrored range [0.7, 1.2] would count one, above."""
    script = importlib.import_module(name)
    args = script.Args(norm_obs=False, clip_low=0.2, clip_high=0.3)
    torch.manual_seed(0)
    agent = script.Agent(3, 2, args)
    obs, actions = torch.randn(4, 3), torch.randn(4, 2)
    ratios = torch.tensor([0.75, 0.75, 1.25, 1.0])
    with torch.no_grad():
        policy = agent.get_action_and_value(obs, actions)
    mb = {"obs": obs, "actions": actions, "logprobs": policy["logprobs"] - ratios.log()}
    mb.update(advantages=torch.tensor([1.0, -1.0, 1.0, -1.0]), returns=torch.zeros(4))
    mb.update(values=policy["values"], means=policy["means"])
    identity = (lambda o: o, lambda a: a)
    rest = identity if hasattr(script, "make_mirror_fns") else ()
    _, terms, _ = script.ppo_loss(agent, mb, args, *rest)
    assert terms["clipfrac"].item() == pytest.approx(0.5)
    assert terms["clipfrac_low"].item() == pytest.approx(0.5)
    assert terms["clipfrac_high"].item() == pytest.approx(0.0)
    batch = {**mb, "advantages": mb["advantages"], "values": policy["values"]}
    diagnostics = script.diagnostics(agent, batch, ratios, args)
    assert diagnostics["losses/ratio_outside_frac"] == pytest.approx(0.5)


@pytest.mark.parametrize("name", ALL_SCRIPTS)
def test_a_parameter_gone_non_finite_stops_the_run_though_every_loss_is_finite(
    name, tmp_path, monkeypatch
):
    """A run whose update leaves an inf in a parameter, after the last loss was computed (so all
    the logged losses stay finite): check_finite names the parameter and stops the run in one line,
    before any checkpoint holds it."""
    script = importlib.import_module(name)
    update = script.ppo_update

    def update_then_break_a_parameter(agent, *rest):
        metrics, lr_scale = update(agent, *rest)
        with torch.no_grad():
            getattr(agent, "module", agent).actor_logstd[0] = float("inf")
        return metrics, lr_scale

    monkeypatch.setattr(script, "ppo_update", update_then_break_a_parameter)
    with pytest.raises(SystemExit) as stopped:
        script.train(small_args(script, tmp_path, checkpoint_every=1))
    message = str(stopped.value.code)
    assert message.startswith("error: iteration 1 diverged (actor_logstd not finite)"), message
    assert message.endswith("last good checkpoint: none yet")
    assert not list(tmp_path.glob("*/checkpoint.pt"))


# ---------------------------------------------------------------------------------------------
# Evaluation -> best.pt
# ---------------------------------------------------------------------------------------------
def test_best_pt_holds_the_policy_and_the_return_of_the_best_periodic_evaluation(ppo, tmp_path):
    """6 iterations, each evaluated: best.pt's return is the largest eval/periodic_return of the
    run's own log, its step that evaluation's, and its policy evaluates to that return again."""
    args = small_args(ppo, tmp_path, total_timesteps=768, eval_every=1, eval_episodes=2)
    ppo.train(args)
    (run_dir,) = tmp_path.glob("*__*")
    periodic = [(e.step, e.value) for e in read_events(run_dir).Scalars("eval/periodic_return")]
    assert [step for step, _ in periodic] == [128 * i for i in range(1, 7)]
    best_step, best_return = max(periodic, key=lambda pair: pair[1])
    assert best_step != periodic[-1][0], "the test needs a run whose best is not its last"
    best = ppo.load_checkpoint(str(run_dir / "best.pt"))
    assert best["global_step"] == best_step
    assert best["best_eval"] == pytest.approx(best_return, abs=1e-4)
    again = ppo.train(ppo.Args(eval_checkpoint=str(run_dir / "best.pt"), eval_episodes=2))
    assert again["eval/episodic_return"] == pytest.approx(best_return, abs=1e-3)
    # checkpoint.pt, the last one, knows the best so far: a resumed run keeps best.pt's bar.
    assert ppo.load_checkpoint(only_checkpoint(tmp_path))["best_eval"] == best["best_eval"]


def test_a_resumed_run_starts_new_episodes_not_a_replay_of_its_start(ppo, tmp_path, monkeypatch):
    """A run of 1 iteration, resumed for a second: the resumed envs start from other states than
    the run's first start did (it would otherwise train twice on the same first episodes), and
    the same resume again starts from the same ones (seeded)."""
    recorders, make_envs = [], ppo.make_envs

    def recording_make_envs(*args, **kwargs):
        recorders.append(StepRecorder(make_envs(*args, **kwargs)))
        return recorders[-1]

    monkeypatch.setattr(ppo, "make_envs", recording_make_envs)
    args = small_args(ppo, tmp_path, total_timesteps=128)
    ppo.train(args)
    first_start = recorders[0].first_obs
    checkpoint = only_checkpoint(tmp_path)
    shutil.copy(checkpoint, tmp_path / "after_iteration_1.pt")
    starts = []
    for _ in range(2):  # the same resume twice, from the checkpoint of iteration 1
        shutil.copy(tmp_path / "after_iteration_1.pt", checkpoint)
        recorders.clear()
        ppo.train(dataclasses.replace(args, resume=checkpoint, total_timesteps=256))
        starts.append(recorders[0].first_obs)
    assert not np.allclose(starts[0], first_start)
    np.testing.assert_array_equal(starts[0], starts[1])


# ---------------------------------------------------------------------------------------------
# Evaluation in waves, and a signal during it
# ---------------------------------------------------------------------------------------------
def test_evaluation_runs_in_waves_of_at_most_16_envs_with_a_seed_per_episode(monkeypatch):
    script = importlib.import_module("ppo_continuous")
    waves, make_envs = [], script.make_envs

    def recording_make_envs(env_id, num_envs, *rest, **kwargs):
        envs = make_envs(env_id, num_envs, *rest, **kwargs)
        reset = envs.reset
        envs.reset = lambda seed: waves.append((num_envs, seed)) or reset(seed=seed)
        return envs

    monkeypatch.setattr(script, "make_envs", recording_make_envs)
    args = script.Args(env_id="InvertedPendulum-v5", eval_episodes=40, seed=3)
    agent = script.Agent(4, 1, args)
    returns, _ = script.evaluate(agent, args, None, "unused")  # the episodes' records
    first = 3 + script.EVAL_SEED_OFFSET  # episode i: seed first + i, as one env per episode had
    assert waves == [(16, first), (16, first + 16), (8, first + 32)] and len(returns) == 40


def test_ten_episodes_evaluate_as_one_vector_env_of_ten_did():
    """The returns of 10 episodes are those of the evaluation before waves: 10 envs side by side,
    reset with the evaluation seed, stepped with the mean action until each episode ended."""
    script = importlib.import_module("ppo_continuous")
    args = script.Args(env_id="Hopper-v5", eval_episodes=10)
    torch.manual_seed(0)
    agent = script.Agent(11, 3, args)
    returns = [episode["return"] for episode in script.evaluate(agent, args, None, "unused")[0]]
    envs = script.make_envs("Hopper-v5", 10)
    obs, _ = envs.reset(seed=args.seed + script.EVAL_SEED_OFFSET)
    expected, finished = np.zeros(10), np.zeros(10, dtype=bool)
    while not finished.all():
        with torch.no_grad():
            mean = agent.actor_mean(agent.normalize(torch.as_tensor(obs, dtype=torch.float32)))
        action = script.scale_action(mean.numpy(), envs.single_action_space)
        obs, reward, terminated, truncated, _ = envs.step(action)
        expected += reward * ~finished
        finished |= terminated | truncated
    envs.close()
    assert returns == expected.tolist()


@pytest.fixture(scope="module")
def saved_hopper_run(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("hopper")
    script = importlib.import_module("ppo_continuous")
    script.train(script.Args(total_timesteps=2048, eval_episodes=1, log_dir=str(log_dir)))
    return only_checkpoint(log_dir)


# Its own peak: a fresh parent whose only child is the command (RUSAGE_CHILDREN of this pytest
# worker would hold the peak of every child an earlier test ran).
PEAK_OF_CHILD = """import resource, subprocess, sys
code = subprocess.run(sys.argv[1:]).returncode
print(f"peak KiB {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}")
sys.exit(code)"""


def peak_mb(checkpoint: str, episodes: int) -> float:
    """The peak memory of `--eval-checkpoint` of so many episodes, in its own process."""
    result = subprocess.run(
        [sys.executable, "-c", PEAK_OF_CHILD, sys.executable, "ppo_continuous.py",
         "--eval-checkpoint", checkpoint, "--eval-episodes", str(episodes)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"over {episodes} episodes" in result.stdout
    return int(result.stdout.rsplit("peak KiB ", 1)[1]) / 1024  # KiB on Linux


def test_memory_of_an_evaluation_does_not_grow_with_the_episodes(saved_hopper_run):
    """One env per episode held 1.4 GB for 1000 episodes (about 1.4 MB an env); waves of 16 hold
    what one wave holds, however many episodes: 208 episodes (13 waves) peak as 16 do."""
    growth = peak_mb(saved_hopper_run, 208) - peak_mb(saved_hopper_run, 16)
    assert growth < 60, f"{growth:.0f} MB more for 208 episodes than for 16"


def test_a_signal_during_the_final_evaluation_stops_it_with_the_checkpoint_saved(tmp_path):
    """1000 final episodes of HalfCheetah take minutes: the signal ends them within a step,
    exit code 128 + signal, and checkpoint.pt holds the whole run. (SIGINT and SIGTERM have the
    same handler: test_first_ctrl_c_sets_a_flag_and_a_second_interrupts_at_once.)"""
    signum = signal.SIGTERM
    command = [sys.executable, "ppo_continuous.py", "--env-id", "HalfCheetah-v5"]
    command += flags(total_timesteps=256, num_envs=2, num_steps=64, num_minibatches=2)
    command += flags(update_epochs=1, eval_episodes=1000, log_dir=tmp_path)
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        while "iter 2/2" not in proc.stdout.readline():
            assert proc.poll() is None, proc.stderr.read()
        time.sleep(1.0)  # into the evaluation
        proc.send_signal(signum)
        sent = time.time()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert time.time() - sent < 10 and proc.returncode == 128 + signum, err
    assert f"{signal.Signals(signum).name}: stopped at step 256; the run is complete" in err
    assert "Traceback" not in err
    script = importlib.import_module("ppo_continuous")
    assert script.load_checkpoint(only_checkpoint(tmp_path))["global_step"] == 256


# ---------------------------------------------------------------------------------------------
# One process per run directory
# ---------------------------------------------------------------------------------------------
def test_a_run_in_use_is_refused_to_a_second_process_and_free_again_after_a_crash(tmp_path, capsys):
    """Two --resume of one run would both write its checkpoint and its TensorBoard log: the
    second is refused in one line that names the first. SIGKILL leaves no lock behind."""
    short = flags(env_id=ENV_ID, num_envs=2, num_steps=64, num_minibatches=2, update_epochs=1)
    short += flags(eval_episodes=1, checkpoint_every=1)
    first = subprocess.Popen(
        [sys.executable, "ppo_continuous.py", *short, *flags(total_timesteps=10**6),
         "--log-dir", str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        while "iter 2/" not in first.stdout.readline():
            assert first.poll() is None
        (run_dir,) = tmp_path.iterdir()
        second = subprocess.run(
            [sys.executable, "ppo_continuous.py", "--resume", str(run_dir),
             *flags(total_timesteps=10**6)], cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert second.returncode == 1
        last_line = second.stderr.strip().splitlines()[-1]
        assert last_line == (
            f"error: {run_dir} is in use by process {first.pid}; wait for it, or stop it"
        )
        assert "Traceback" not in second.stderr
        assert "logging to" not in second.stdout  # refused before its start line
    finally:
        first.kill()  # SIGKILL: no handler runs, the kernel releases the lock
        first.wait()
    script = importlib.import_module("ppo_continuous")  # a third process: this one
    step = script.load_checkpoint(str(run_dir))["global_step"]
    typed = ["--resume", str(run_dir), *flags(total_timesteps=step + 128)]
    script.train(script.parse_args(typed))
    assert f"iterations {step // 128 + 1}-{step // 128 + 1}" in capsys.readouterr().out
