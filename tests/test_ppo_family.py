"""Tests shared by the PPO family: ppo_continuous.py and every variant copied from it.

The variants keep ppo_continuous.py's names (Args, train, compute_gae, ppo_loss, Agent, ...), so
each test here runs once per script that exists; algorithm-specific tests live in test_<script>.py.
"""

import copy
import importlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from conftest import (
    ALL_SCRIPTS,
    BOOTSTRAP_RUN,
    CLEANRL_TAGS,
    ENV_ID,
    PPO_FAMILY,
    ROOT,
    TOY_ENV,
    allow_toy_env,
    assert_finite_metrics,
    flags,
    read_events,
    small_args,
    toy_args,
    toy_rollout_and_batch,
    trained_value,
)
from toy_envs import CountsSteps


# ---------------------------------------------------------------------------------------------
# GAE
# ---------------------------------------------------------------------------------------------
def gae_reference(rewards, values, next_values, terminated, dones, gamma, lam):
    """GAE written as the textbook double loop: A_t = sum_k (gamma lam)^k delta_{t+k} within an
    episode."""
    T, N = rewards.shape
    adv = np.zeros((T, N))
    for n in range(N):
        for t in range(T):
            total, discount = 0.0, 1.0
            for k in range(t, T):
                bootstrap = 0.0 if terminated[k, n] else gamma * next_values[k, n]
                total += discount * (rewards[k, n] + bootstrap - values[k, n])
                if dones[k, n]:
                    break
                discount *= gamma * lam
            adv[t, n] = total
    return adv


def test_gae_matches_plain_loop_with_terminations_and_truncations(ppo):
    rng = np.random.default_rng(0)
    T, N = 17, 4
    rewards, values, next_values = rng.normal(size=(3, T, N))
    terminated = np.zeros((T, N))
    truncated = np.zeros((T, N))
    terminated[3, 0] = terminated[10, 2] = terminated[16, 3] = 1
    truncated[5, 1] = truncated[11, 0] = truncated[7, 2] = 1
    dones = np.maximum(terminated, truncated)
    expected = gae_reference(rewards, values, next_values, terminated, dones, 0.97, 0.9)
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    adv, ret = ppo.compute_gae(
        t(rewards), t(values), t(next_values), t(terminated), t(dones), 0.97, 0.9
    )
    np.testing.assert_allclose(adv.numpy(), expected, atol=1e-12)
    np.testing.assert_allclose(ret.numpy(), expected + values, atol=1e-12)


def test_gae_truncation_bootstraps_and_termination_does_not(ppo):
    ones = torch.ones(1, 1)
    zero = torch.zeros(1, 1)
    # One step, reward 1, V(s_{t+1}) = 5: truncated -> 1 + 0.9 * 5; terminated -> 1.
    adv_trunc, _ = ppo.compute_gae(ones, zero, 5 * ones, zero, ones, 0.9, 0.95)
    adv_term, _ = ppo.compute_gae(ones, zero, 5 * ones, ones, ones, 0.9, 0.95)
    assert adv_trunc.item() == pytest.approx(5.5)
    assert adv_term.item() == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------
# Clipped surrogate
# ---------------------------------------------------------------------------------------------
def call_ppo_loss(script, agent, obs, actions, old_logprobs, advantages, args):
    """ppo_loss of any script, with zero returns and old values. ppo_symaug's also takes mirror
    maps: with the identity the mirrored half copies the minibatch, and means are unchanged."""
    zeros = torch.zeros(len(obs))
    mb = {"obs": obs, "actions": actions, "logprobs": old_logprobs, "advantages": advantages}
    mb.update(returns=zeros, values=zeros, means=torch.zeros_like(actions))
    if hasattr(script, "make_mirror_fns"):
        return script.ppo_loss(agent, mb, args, lambda o: o, lambda a: a)
    return script.ppo_loss(agent, mb, args)


# ppo_spo.py replaces the clip by SPO's penalty (tests/test_ppo_spo.py); appo_vtrace.py clips too.
@pytest.mark.parametrize("name", [s for s in PPO_FAMILY if s != "ppo_spo"] + ["appo_vtrace"])
def test_clipped_surrogate_matches_the_formula_and_stops_outside_the_range(name):
    """-mean(min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)) for ratios on both sides of the range.
    Its gradient is zero where A favours leaving the range (r > 1 + eps_high with A > 0,
    r < 1 - eps_low with A < 0): max in place of min would push further out there."""
    script = importlib.import_module(name)
    args = script.Args(norm_obs=False, norm_adv=False)
    low = high = args.clip_coef
    if hasattr(args, "clip_low"):
        args.clip_low, args.clip_high = low, high = 0.2, 0.3
    torch.manual_seed(0)
    agent = script.Agent(3, 2, args)
    obs, actions = torch.randn(12, 3), torch.randn(12, 2)
    ratios = torch.tensor([0.5, 0.75, 0.9, 1.1, 1.25, 1.6]).repeat(2)
    advantages = torch.tensor([1.5] * 6 + [-0.7] * 6)
    with torch.no_grad():
        logprobs = agent.get_action_and_value(obs, actions)["logprobs"]
    # The gradient with respect to the old log-probs is -dL/dr * r: it is zero where dL/dr is.
    old_logprobs = (logprobs - ratios.log()).requires_grad_(True)
    _, terms, new = call_ppo_loss(script, agent, obs, actions, old_logprobs, advantages, args)
    torch.testing.assert_close(new["ratio"].detach(), ratios)
    expected = -torch.min(ratios * advantages, ratios.clamp(1 - low, 1 + high) * advantages).mean()
    torch.testing.assert_close(terms["policy_loss"], expected)
    (grad,) = torch.autograd.grad(terms["policy_loss"], old_logprobs)
    leaving = ((ratios > 1 + high) & (advantages > 0)) | ((ratios < 1 - low) & (advantages < 0))
    assert leaving[:6].any() and leaving[6:].any()  # both sides of the range
    assert torch.all(grad[leaving] == 0)
    torch.testing.assert_close(grad[~leaving], (advantages * ratios)[~leaving] / len(ratios))


# ppo_ddp.py normalizes once per update with the global batch's moments (tests/test_ppo_ddp.py).
@pytest.mark.parametrize("name", [s for s in ALL_SCRIPTS if s != "ppo_ddp"])
def test_normalized_advantages_leave_the_policy_loss_blind_to_their_scale_and_shift(name):
    """With --norm-adv each minibatch's advantages are standardized (mean 0, std 1) inside the
    loss: a -> 5 a + 3 leaves the policy loss as it was; without it the loss moves with them."""
    script = importlib.import_module(name)
    args = script.Args(norm_obs=False, norm_adv=True)
    torch.manual_seed(0)
    agent = script.Agent(3, 2, args)
    obs, actions, advantages = torch.randn(12, 3), torch.randn(12, 2), torch.randn(12)
    with torch.no_grad():
        logprobs = agent.get_action_and_value(obs, actions)["logprobs"]
    old_logprobs = logprobs - torch.linspace(-0.3, 0.3, 12)  # ratios on both sides of 1

    def policy_loss(advantages, args):
        terms = call_ppo_loss(script, agent, obs, actions, old_logprobs, advantages, args)[1]
        return terms["policy_loss"]

    torch.testing.assert_close(policy_loss(5 * advantages + 3, args), policy_loss(advantages, args))
    plain = script.Args(norm_obs=False, norm_adv=False)
    assert not torch.allclose(policy_loss(5 * advantages, plain), policy_loss(advantages, plain))


# ---------------------------------------------------------------------------------------------
# Normalization
# ---------------------------------------------------------------------------------------------
def test_merge_moments_equals_statistics_of_concatenated_data(ppo):
    rng = np.random.default_rng(1)
    a, b = rng.normal(3, 2, size=(50, 3)), rng.normal(-1, 0.5, size=(7, 3))
    count, mean, var = ppo.merge_moments(len(a), a.mean(0), a.var(0), len(b), b.mean(0), b.var(0))
    both = np.concatenate([a, b])
    assert count == len(both)
    np.testing.assert_allclose(mean, both.mean(0), rtol=1e-12)
    np.testing.assert_allclose(var, both.var(0), rtol=1e-12)


def test_running_mean_std_over_batches_equals_whole_data(ppo):
    rng = np.random.default_rng(2)
    data = rng.normal(2, 3, size=(300, 4))
    rms = ppo.RunningMeanStd((4,))
    for chunk in np.split(data, [10, 100, 101]):
        rms.update(torch.as_tensor(chunk))
    np.testing.assert_allclose(rms.mean.numpy(), data.mean(0), rtol=1e-6)
    np.testing.assert_allclose(rms.var.numpy(), data.var(0), rtol=1e-4)


def test_normalizer_is_frozen_during_update_and_learns_from_rollouts_only(
    ppo, tmp_path, monkeypatch
):
    """Every minibatch of one update sees the same statistics, and the first one sees the rollout's
    statistics (ratio exactly 1); the count grows by exactly one batch per iteration."""
    seen = []

    def recording_loss(agent, mb, *rest):
        out = original(agent, mb, *rest)
        logratio = out[2]["logratio"]
        seen.append(
            (agent.obs_rms.count.item(), agent.obs_rms.mean.clone(), logratio.abs().max().item())
        )
        return out

    original = ppo.ppo_loss
    monkeypatch.setattr(ppo, "ppo_loss", recording_loss)
    args = small_args(ppo, tmp_path, total_timesteps=3 * 128, num_minibatches=4, update_epochs=2)
    ppo.train(args)
    counts = sorted({c for c, _, _ in seen})
    # One update per iteration, each after the rollout with the same number of observations (one
    # batch of 128, or a multiple of it where a variant also feeds the normalizer augmented copies).
    growth = counts[1] - counts[0]
    assert len(counts) == 3 and counts[0] == pytest.approx(1e-4)
    assert growth / 128 == pytest.approx(round(growth / 128)) and counts[2] - counts[
        1
    ] == pytest.approx(growth)
    for i, (count, mean, _) in enumerate(seen):
        first = next(j for j, (c, _, _) in enumerate(seen) if c == count)
        assert torch.equal(mean, seen[first][1])
        if i == first:
            assert seen[i][2] < 1e-5, "first minibatch must reproduce the rollout's log-probs"
    ckpt = torch.load(tmp_path.glob("*/checkpoint.pt").__next__(), weights_only=False)
    assert ckpt["agent"]["obs_rms.count"].item() == pytest.approx(1e-4 + 3 * growth)


# ---------------------------------------------------------------------------------------------
# Truncation bootstrap, end to end
# ---------------------------------------------------------------------------------------------
def test_truncated_episodes_bootstrap_from_final_obs(ppo, tmp_path, monkeypatch):
    allow_toy_env(ppo, monkeypatch)
    value = trained_value(ppo, small_args(ppo, tmp_path, total_timesteps=10_000, **BOOTSTRAP_RUN))
    # Bootstrapping: 1 / (1 - 0.9) = 10. Treating truncation as termination would give at most
    # (1 - 0.9**5) / 0.1 = 4.1 (and about 2.8 averaged over the episode's states).
    assert value == pytest.approx(10.0, rel=0.15)


# ---------------------------------------------------------------------------------------------
# What train() hands to compute_gae, and what a resume restores: a few steps of a toy env
# ---------------------------------------------------------------------------------------------
def spy_on_train(ppo, monkeypatch) -> dict:
    """Wrap the make_optimizers and compute_gae that train() calls. The dict returned gets the
    agent and its optimizers, and for each compute_gae call (one per iteration, after the rollout
    and before the update) its arguments, a copy of the agent and the optimizers' state."""
    seen = {"gae_calls": []}
    make_optimizers, compute_gae = ppo.make_optimizers, ppo.compute_gae

    def spy_make_optimizers(agent, args):
        seen["agent"], seen["optimizers"] = agent, make_optimizers(agent, args)
        return seen["optimizers"]

    def spy_compute_gae(rewards, values, next_values, terminated, dones, *rest):
        seen["gae_calls"].append(
            {
                "rewards": rewards.clone(),
                "values": values.clone(),
                "next_values": next_values.clone(),
                "dones": dones.clone(),
                "agent": copy.deepcopy(seen["agent"]),
                "optimizer_states": copy.deepcopy([opt.state_dict() for opt in seen["optimizers"]]),
            }
        )
        return compute_gae(rewards, values, next_values, terminated, dones, *rest)

    allow_toy_env(ppo, monkeypatch)
    monkeypatch.setattr(ppo, "make_optimizers", spy_make_optimizers)
    monkeypatch.setattr(ppo, "compute_gae", spy_compute_gae)
    return seen


@pytest.fixture(scope="module")
def toy_rollout(ppo, tmp_path_factory):
    """What compute_gae got in one iteration on CountsSteps."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        seen = spy_on_train(ppo, monkeypatch)
        ppo.train(toy_args(ppo, tmp_path_factory.mktemp("toy")))
    assert len(seen["gae_calls"]) == 1
    return seen["gae_calls"][0]


def test_truncation_bootstraps_from_the_final_obs_not_the_reset_obs(ppo, toy_rollout):
    """At a truncation the vector env returns the next episode's reset obs (0); next_values must
    be V(final obs = 5). AlwaysTruncates cannot tell the two apart: its obs is always 0."""
    with torch.no_grad():
        v_final, v_reset = toy_rollout["agent"].get_value(torch.tensor([[5.0], [0.0]]))
    assert abs(v_final - v_reset) > 1e-3, "the test needs V(final) != V(reset)"
    truncated, within = [4, 9], [0, 1, 2, 3, 5, 6, 7, 8]
    assert toy_rollout["dones"][truncated].all() and toy_rollout["dones"].sum() == 4
    next_values = toy_rollout["next_values"]
    torch.testing.assert_close(next_values[truncated], torch.full((2, 2), v_final.item()))
    # Within an episode, V(s_{t+1}) is the value the rollout computed at the next step.
    torch.testing.assert_close(next_values[within], toy_rollout["values"][[t + 1 for t in within]])


def test_rewards_are_divided_by_the_std_of_the_discounted_return(ppo, toy_rollout):
    """Reward 1 in every step of 5-step episodes: the discounted returns of the rollout are
    1, 1 + g, ..., 1 + g + ... + g^4 in every episode, and each reward becomes 1 / their std."""
    discounted = np.cumsum(ppo.Args().gamma ** np.arange(5))
    expected = torch.full((10, 2), 1.0 / discounted.std(), dtype=torch.float64)
    # rtol: the normalizer's prior (count 1e-4, var 1) is merged in as well.
    torch.testing.assert_close(toy_rollout["rewards"].double(), expected, rtol=1e-4, atol=0)


def test_resume_restores_the_optimizer_state(ppo, tmp_path, monkeypatch):
    """Adam's moments and step counts at the start of a resumed run are those the saved run ended
    with. (train(N) and train(N / 2) + resume differ anyway: the envs start fresh episodes.)"""
    seen = spy_on_train(ppo, monkeypatch)
    ppo.train(toy_args(ppo, tmp_path, total_timesteps=40))
    saved = [opt.state_dict() for opt in seen["optimizers"]]
    seen["gae_calls"].clear()
    ckpt_path = str(next(tmp_path.glob("*/checkpoint.pt")))
    ppo.train(toy_args(ppo, tmp_path, total_timesteps=60, resume=ckpt_path))
    restored = seen["gae_calls"][0]["optimizer_states"]  # before the resumed run's first step
    assert len(restored) == len(saved)
    for before, after in zip(saved, restored):
        assert before["state"], "the saved run has taken optimizer steps"
        assert after["state"].keys() == before["state"].keys()
        for param, state in before["state"].items():
            for name, value in state.items():
                assert torch.equal(after["state"][param][name], value), (param, name)


def test_collect_rollout_counts_steps_and_episodes_and_bootstraps_from_the_final_obs(
    ppo, monkeypatch
):
    agent, args, carry, writer, rollout, _ = toy_rollout_and_batch(ppo, monkeypatch)
    assert carry["obs"].shape == (2, 1)
    ended = [(e["return"], e["length"], e["fell"]) for e in carry["episodes"]]
    assert ended == [(5.0, 5, False)] * 4  # 2 envs x 2 episodes of 5 steps, reward 1, truncated
    # Logged at the step each episode ended: steps 5 and 10 of the rollout, 2 envs per step.
    assert [s for t, _, s in writer.scalars if t == "charts/episodic_return"] == [110] * 2 + [
        120
    ] * 2
    assert rollout["obs"][:5, 0, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    with torch.no_grad():
        v_final = agent.get_value(torch.tensor([[5.0]])).item()
    torch.testing.assert_close(rollout["next_values"][[4, 9]], torch.full((2, 2), v_final))
    assert rollout["dones"].sum() == 4 and rollout["terminated"].sum() == 0


def test_ppo_update_first_minibatch_reproduces_the_rollout_policy(ppo, monkeypatch):
    """With one minibatch and one epoch the only ratio is that of the rollout's own policy: 1.
    A second epoch sees the updated policy, so the same statistic must move."""
    for epochs, moved in ((1, False), (2, True)):
        agent, args, _, _, _, batch = toy_rollout_and_batch(
            ppo, monkeypatch, num_minibatches=1, update_epochs=epochs
        )
        optimizers = ppo.make_optimizers(agent, args)
        metrics, lr_scale = ppo.ppo_update(agent, optimizers, ppo.ppo_loss, batch, 1.0, args)
        assert (metrics["losses/ratio_dev_max"] > 1e-4) == moved, epochs
        assert lr_scale == 1.0  # no desired KL: the caller's schedule alone sets the lr


def test_every_epoch_visits_each_sample_once_in_a_new_random_order(ppo, monkeypatch):
    """Minibatches are a fresh random partition of the batch in every epoch: each epoch's
    minibatches together hold every sample once, and neither the batch's own order nor the
    previous epoch's order is kept (samples told apart by their actions)."""
    agent, args, _, _, _, batch = toy_rollout_and_batch(
        ppo, monkeypatch, num_minibatches=4, update_epochs=3
    )
    seen = []

    def recording_loss(agent, mb, args, *rest):
        seen.append(mb["actions"].clone())
        return ppo.ppo_loss(agent, mb, args, *rest)

    ppo.ppo_update(agent, ppo.make_optimizers(agent, args), recording_loss, batch, 1.0, args)
    actions = batch["actions"]
    assert len(actions) == 20 and len(seen) == 3 * 4
    orders = []
    for epoch in range(3):
        rows = torch.cat(seen[4 * epoch : 4 * epoch + 4])
        order = [int(torch.nonzero((actions == row).all(-1))[0, 0]) for row in rows]
        assert sorted(order) == list(range(20)), epoch  # every sample once
        orders.append(order)
    assert orders[0] != list(range(20)) and orders[1] != orders[0] and orders[2] != orders[1]


def test_ppo_update_applies_the_desired_kl_rule_after_every_minibatch(ppo, monkeypatch):
    """A KL far below --desired-kl grows the learning rate by 1.5 per minibatch (rsl_rl rule)."""
    agent, args, _, _, _, batch = toy_rollout_and_batch(
        ppo, monkeypatch, num_minibatches=2, update_epochs=1, desired_kl=1.0
    )
    optimizers = ppo.make_optimizers(agent, args)
    _, lr_scale = ppo.ppo_update(agent, optimizers, ppo.ppo_loss, batch, 1.0, args)
    assert lr_scale == pytest.approx(1.5**2)
    for opt in optimizers:
        for group in opt.param_groups:
            assert group["lr"] == pytest.approx(group["initial_lr"] * 1.5**2)


# ---------------------------------------------------------------------------------------------
# End to end on Walker2d: finite losses, diagnostics, checkpoints, reproducibility
# ---------------------------------------------------------------------------------------------
def short_args(ppo, tmp_path, **overrides):
    """small_args, 8 iterations of 4 envs x 256 steps, two epochs of 4 minibatches."""
    fields = dict(total_timesteps=2048, num_envs=4, num_steps=256, num_minibatches=4)
    return small_args(
        ppo, tmp_path, **{"update_epochs": 2, "eval_episodes": 2, **fields, **overrides}
    )


@pytest.fixture(scope="module")
def short_run(ppo, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("runs")
    metrics = ppo.train(short_args(ppo, log_dir))
    return metrics, next(log_dir.glob("*/checkpoint.pt"))


def test_short_run_has_finite_losses_and_all_diagnostics(ppo, short_run):
    metrics, _ = short_run
    tags = [
        "losses/policy_loss",
        "losses/value_loss",
        "losses/entropy",
        "losses/approx_kl",
        "losses/old_approx_kl",
        "losses/clipfrac",
        "losses/clipfrac_high",
        "losses/clipfrac_low",
        "losses/explained_variance",
        "losses/actor_grad_norm",
        "losses/critic_grad_norm",
        "losses/ratio_dev_mean",
        "losses/ratio_dev_max",
        "losses/ratio_outside_frac",
        "charts/advantage_mean",
        "charts/advantage_std",
        "charts/value_mean",
        "charts/policy_std",
        "charts/policy_gain",
        "charts/actor_effective_rank",
    ]
    assert_finite_metrics(metrics, tags, global_step=2048)
    assert 1.0 <= metrics["charts/actor_effective_rank"] <= 64


def test_tensorboard_has_cleanrl_tags(ppo, short_run):
    events = read_events(short_run[1].parent)
    assert CLEANRL_TAGS <= set(events.Tags()["scalars"])
    assert "hyperparameters/text_summary" in events.Tags()["tensors"]


def test_checkpoint_round_trip_gives_the_same_policy(ppo, short_run):
    metrics, ckpt_path = short_run
    # The eval of the reloaded checkpoint uses the same seeds as the final eval of the run: any
    # difference in weights or normalizer statistics would change the return.
    reloaded = ppo.train(ppo.Args(eval_checkpoint=str(ckpt_path), eval_episodes=2))
    assert reloaded["eval/episodic_return"] == metrics["eval/episodic_return"]


def test_resume_continues_the_step_count(ppo, short_run, tmp_path):
    _, ckpt_path = short_run
    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    copy = resumed_dir / "checkpoint.pt"
    copy.write_bytes(ckpt_path.read_bytes())
    typed = ["--resume", str(copy), "--total-timesteps", "4096", "--eval-episodes", "2"]
    args = ppo.parse_args(typed)
    metrics = ppo.train(args)
    assert metrics["global_step"] == 4096
    ckpt = ppo.load_checkpoint(str(copy))
    assert ckpt["iteration"] == 4 and ckpt["args"]["num_envs"] == 4  # saved settings kept


def test_same_seed_gives_identical_runs_with_or_without_periodic_evaluation(ppo, tmp_path):
    # Two iterations of 512 steps: b evaluates after the first, and trains on.
    a = ppo.train(short_args(ppo, tmp_path / "a", total_timesteps=1024, num_steps=128))
    b = ppo.train(
        short_args(ppo, tmp_path / "b", total_timesteps=1024, num_steps=128, eval_every=1)
    )
    c = ppo.train(short_args(ppo, tmp_path / "c", total_timesteps=1024, num_steps=128, seed=2))
    keys = [k for k in a if k != "charts/SPS"]
    assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
    assert a["losses/policy_loss"] != c["losses/policy_loss"]


def test_options_train_with_finite_losses(ppo, tmp_path):
    """Muon, adaptive learning rate, asymmetric clip, value clipping, deep actor: all train."""
    metrics = ppo.train(
        short_args(
            ppo,
            tmp_path,
            total_timesteps=1024,
            optimizer="muon",
            desired_kl=0.01,
            clip_low=0.2,
            clip_high=0.28,
            clip_vloss=True,
            actor_layers=(32, 32, 32),
            critic_learning_rate=1e-3,
            target_kl=0.05,
        )
    )
    assert all(np.isfinite(v) for v in metrics.values())


def test_adaptive_learning_rate_rule(ppo):
    assert ppo.adapt_learning_rate(1e-3, kl=0.05, desired_kl=0.01) == pytest.approx(1e-3 / 1.5)
    assert ppo.adapt_learning_rate(1e-3, kl=0.001, desired_kl=0.01) == pytest.approx(1.5e-3)
    assert ppo.adapt_learning_rate(1e-3, kl=0.01, desired_kl=0.01) == 1e-3
    assert ppo.adapt_learning_rate(1e-2, kl=0.0, desired_kl=0.01) == 1e-2
    assert ppo.adapt_learning_rate(1e-5, kl=1.0, desired_kl=0.01) == 1e-5


def test_gaussian_kl_matches_torch(ppo):
    rng = torch.Generator().manual_seed(0)
    m0, m1 = torch.randn(5, 3, generator=rng), torch.randn(5, 3, generator=rng)
    s0, s1 = torch.rand(5, 3, generator=rng) + 0.1, torch.rand(5, 3, generator=rng) + 0.1
    expected = torch.distributions.kl_divergence(
        torch.distributions.Normal(m0, s0), torch.distributions.Normal(m1, s1)
    ).sum(-1)
    torch.testing.assert_close(ppo.gaussian_kl(m0, s0, m1, s1), expected)


@pytest.mark.parametrize("name", PPO_FAMILY + ["appo_vtrace"])  # appo_vtrace.py has the same Agent
def test_policy_log_prob_entropy_and_sampling_match_torch_normal(name):
    script = importlib.import_module(name)
    agent = script.Agent(5, 3, script.Args())
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.tensor([-1.0, 0.0, 0.5]))
    obs, actions = torch.randn(7, 5), torch.randn(7, 3)
    out = agent.get_action_and_value(obs, actions)
    reference = torch.distributions.Normal(out["means"], out["std"])
    torch.testing.assert_close(out["logprobs"], reference.log_prob(actions).sum(-1))
    torch.testing.assert_close(out["entropy"], reference.entropy().sum(-1))
    torch.manual_seed(3)
    sampled = agent.act(obs)  # the rollout's per-step call
    torch.manual_seed(3)
    torch.testing.assert_close(sampled, reference.sample())  # same draw from the same RNG state


@pytest.mark.parametrize("name", PPO_FAMILY + ["appo_vtrace"])
def test_evaluate_acts_with_the_mean_of_the_policy(name):
    """Every action the evaluation sends is the actor's mean of the normalized obs, not a sample
    (the checkpoint round trip notices sampling only through two differing RNG states)."""
    script = importlib.import_module(name)
    torch.manual_seed(0)
    agent = script.Agent(1, 1, script.Args())
    agent.obs_rms.update(torch.tensor([[1.0], [2.0], [4.0]]))  # so that normalize changes the obs
    CountsSteps.log.clear()
    script.evaluate(agent, script.Args(env_id=TOY_ENV, eval_episodes=2), None, "unused")
    assert len(CountsSteps.log) == 10  # 2 episodes of 5 steps
    obs = torch.tensor([[o] for o, _ in CountsSteps.log])
    actions = torch.tensor(np.array([a for _, a in CountsSteps.log]))
    with torch.no_grad():
        means = agent.actor_mean(agent.normalize(obs))
    assert means.abs().max() < 1  # inside the action bounds, where scale_action is the identity
    torch.testing.assert_close(actions, means)


# ---------------------------------------------------------------------------------------------
# Bad input: one line, exit code != 0, no traceback
# ---------------------------------------------------------------------------------------------
def test_checkpoint_of_another_script_or_env_is_refused(ppo, short_run, tmp_path):
    _, ckpt_path = short_run
    foreign = tmp_path / "foreign.pt"
    torch.save({**torch.load(ckpt_path, weights_only=False), "script": "another_script"}, foreign)
    with pytest.raises(SystemExit, match=f"not written by {ppo.__name__}.py"):
        ppo.train(ppo.Args(eval_checkpoint=str(foreign)))
    with pytest.raises(SystemExit, match=f"holds a policy for {ENV_ID}"):
        ppo.train(ppo.Args(resume=str(ckpt_path), env_id="Ant-v5"))


def test_command_line_error_has_no_traceback_and_comes_first(ppo, capsys):
    # 3000 steps are not whole batches: the note about it must not come before the error. A
    # SystemExit with a message is what Python prints as that one line, exit code 1.
    with pytest.raises(SystemExit) as stopped:
        ppo.train(ppo.parse_args(["--env-id", "NoSuchEnv-v0", "--total-timesteps", "3000"]))
    assert str(stopped.value).startswith("error: unknown env id 'NoSuchEnv-v0'")
    assert "note:" not in capsys.readouterr().out


# ppo_spo's and ppo_symaug's harness (signals included) is ppo_continuous's: test_contract.py
@pytest.mark.parametrize("name", ["ppo_continuous", "ppo_ddp"])
def test_ctrl_c_saves_a_checkpoint_and_exits(name, tmp_path):
    ppo = importlib.import_module(name)
    proc = subprocess.Popen(
        [
            sys.executable,
            f"{name}.py",
            *flags(num_envs=2, num_steps=64, num_minibatches=2, log_dir=str(tmp_path)),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while "iter 2/" not in proc.stdout.readline():
        assert time.time() < deadline and proc.poll() is None
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert re.search(r"resume with: .*--resume \S*checkpoint.pt\n", err), err
    assert "Traceback" not in err
    ckpt = ppo.load_checkpoint(str(next(tmp_path.glob("*/checkpoint.pt"))))
    assert ckpt["global_step"] >= 128 and ckpt["global_step"] % 128 == 0


@pytest.mark.parametrize("name", PPO_FAMILY + ["appo_vtrace"])
def test_first_ctrl_c_sets_a_flag_and_a_second_interrupts_at_once(name):
    # The first Ctrl-C must not raise: a KeyboardInterrupt that lands inside TensorBoard's writer
    # left its close() waiting forever (in 2 of 32 runs of the Ctrl-C test above).
    script = importlib.import_module(name)
    before = signal.getsignal(signal.SIGINT)
    run = {"dir": "", "checkpoint": "/no/checkpoint.pt"}  # "": no TensorBoard writer
    with pytest.raises(SystemExit) as stopped:
        with script.run_guard(run, script.Args()) as ctrl_c:
            signal.raise_signal(signal.SIGINT)
            assert ctrl_c["signum"] == signal.SIGINT
            signal.raise_signal(signal.SIGINT)
            pytest.fail("the second Ctrl-C must interrupt at once")
    assert stopped.value.code == 130
    assert signal.getsignal(signal.SIGINT) is before


def test_train_restores_the_ctrl_c_handler(ppo, tmp_path):
    before = signal.getsignal(signal.SIGINT)
    ppo.train(small_args(ppo, tmp_path, env_id="InvertedPendulum-v5"))
    assert signal.getsignal(signal.SIGINT) is before


# ---------------------------------------------------------------------------------------------
# Learning
# ---------------------------------------------------------------------------------------------
# ppo_ddp learns on 2 ranks: test_two_ranks_learn_inverted_pendulum in test_ppo_ddp.py
@pytest.mark.slow
@pytest.mark.parametrize("name", [s for s in PPO_FAMILY if s != "ppo_ddp"])
def test_learns_inverted_pendulum(name, tmp_path):
    ppo = importlib.import_module(name)
    metrics = ppo.train(
        ppo.Args(env_id="InvertedPendulum-v5", total_timesteps=40_960, log_dir=str(tmp_path))
    )
    assert metrics["eval/episodic_return"] >= 900


# ---------------------------------------------------------------------------------------------
# Extra actor losses and videos
# ---------------------------------------------------------------------------------------------
def test_bounds_loss_is_zero_inside_and_matches_formula_outside(ppo):
    inside = torch.tensor([[0.5, -1.0, 1.0], [0.0, 0.9, -0.3]])
    assert ppo.bounds_loss(inside).item() == 0.0
    outside = torch.tensor([[1.5, -3.0, 0.0], [0.0, 2.0, -1.0]])
    # row 1: 0.5^2 + 2^2; row 2: 1^2 -> mean over the batch
    assert ppo.bounds_loss(outside).item() == pytest.approx((0.25 + 4.0 + 1.0) / 2)


def test_l2c2_is_zero_for_a_constant_actor_and_positive_for_a_varying_one(ppo):
    args = ppo.Args(norm_obs=False)
    agent = ppo.Agent(3, 2, args)
    obs = torch.randn(64, 3)
    mean = agent.actor_mean(obs)
    assert ppo.l2c2_loss(agent, obs, mean, 0.1).item() > 0
    with torch.no_grad():
        for p in agent.actor_mean.parameters():
            p.zero_()  # a constant actor: mu(s) = 0 everywhere
    mean = agent.actor_mean(obs)
    assert ppo.l2c2_loss(agent, obs, mean, 0.1).item() == 0.0


def test_extra_losses_train_and_are_logged(ppo, tmp_path):
    metrics = ppo.train(
        short_args(ppo, tmp_path, total_timesteps=1024, bounds_loss_coef=1.0, l2c2_coef=0.1)
    )
    assert np.isfinite(metrics["losses/bounds_loss"]) and metrics["losses/l2c2_loss"] > 0
    plain = ppo.train(short_args(ppo, tmp_path, total_timesteps=1024))
    assert "losses/bounds_loss" not in plain and "losses/l2c2_loss" not in plain


def video_args(ppo, tmp_path):
    """short_args for 4 iterations that film their one final evaluation episode."""
    fields = dict(total_timesteps=1024, capture_video=True, eval_episodes=1)
    return short_args(ppo, tmp_path, video_dir=str(tmp_path / "videos"), **fields)


@pytest.mark.parametrize("name", ["ppo_continuous"])  # one harness: test_contract
def test_capture_video_writes_a_playable_mp4(name, tmp_path):
    ppo = importlib.import_module(name)
    import imageio.v3 as iio

    ppo.train(video_args(ppo, tmp_path))
    videos = list((tmp_path / "videos").glob("*/eval_step1024.mp4"))
    assert len(videos) == 1 and videos[0].stat().st_size > 1000
    frames = iio.imread(videos[0])
    assert frames.shape[0] > 5 and frames.shape[1:] == (240, 320, 3)
    assert frames[0].std() > 1  # a real picture, not a blank frame


@pytest.mark.parametrize("name", ["ppo_continuous"])  # one harness: test_contract
def test_rendering_failure_is_one_line_and_training_continues(name, tmp_path, monkeypatch, capsys):
    ppo = importlib.import_module(name)
    # EGL without a vendor library: the renderer fails half-built, and again when collected.
    monkeypatch.setenv("MUJOCO_GL", "egl")
    monkeypatch.setenv("__EGL_VENDOR_LIBRARY_FILENAMES", "/nonexistent.json")
    metrics = ppo.train(video_args(ppo, tmp_path))
    warning = [line for line in capsys.readouterr().err.splitlines() if "--capture-video" in line]
    assert (
        len(warning) == 1
        and "Cannot initialize a EGL device display" in warning[0]
        and "MUJOCO_GL=egl" in warning[0]
    )
    assert np.isfinite(metrics["eval/episodic_return"]) and not list(tmp_path.rglob("*.mp4"))
