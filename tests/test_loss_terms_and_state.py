"""Each loss term and normalization step against its formula, with inputs where it is active, and
each piece of resumed state round-tripped: tests that fail on a one-line bug in any of them.

Run once per script of the PPO family (ppo_continuous.py and the variants copied from it)."""

import math

import numpy as np
import pytest
import torch
from conftest import RecordingWriter, allow_toy_env, toy_args, toy_rollout_and_batch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def minibatch(ppo, args, scale_actor=1.0):
    """An agent and a minibatch of 16 samples with ratio 1, advantages of mean 0.5, and returns
    and old values far enough apart that the value clip is active."""
    torch.manual_seed(0)
    agent = ppo.Agent(3, 2, args)
    with torch.no_grad():
        agent.actor_mean[-1].weight.mul_(scale_actor)
    obs, actions = torch.randn(16, 3), torch.randn(16, 2)
    with torch.no_grad():
        logprobs = agent.get_action_and_value(obs, actions)["logprobs"]
    advantages = torch.linspace(-1.0, 2.0, 16)
    return agent, obs, actions, logprobs, advantages


def loss_of(ppo, args, scale_actor=1.0, returns=None, old_values=None):
    agent, obs, actions, logprobs, advantages = minibatch(ppo, args, scale_actor)
    mb = {"obs": obs, "actions": actions, "logprobs": logprobs, "advantages": advantages}
    mb["returns"] = torch.zeros(16) if returns is None else returns
    mb["values"] = torch.zeros(16) if old_values is None else old_values
    mb["means"] = torch.zeros_like(actions)
    if hasattr(ppo, "make_mirror_fns"):
        return agent, mb, ppo.ppo_loss(agent, mb, args, lambda o: o, lambda a: a)
    return agent, mb, ppo.ppo_loss(agent, mb, args)


def test_value_loss_matches_its_formula_with_and_without_the_clip(ppo):
    """Old values 1 below the new ones (the clip at 0.2 is active); the returns 0.5 above them in
    half the samples (the clipped error is the larger) and 0.9 below in the other half."""
    agent, obs, _, _, _ = minibatch(ppo, ppo.Args(norm_obs=False))
    with torch.no_grad():
        values = agent.get_value(obs)
    old_values = values - 1.0
    returns = values + torch.tensor([0.5, -0.9]).repeat(8)
    for clip_vloss in (False, True):
        args = ppo.Args(norm_obs=False, clip_vloss=clip_vloss)
        _, _, (_, terms, _) = loss_of(ppo, args, returns=returns, old_values=old_values)
        loss = (values - returns) ** 2
        if clip_vloss:
            delta = (values - old_values).clamp(-args.clip_coef, args.clip_coef)
            clipped = (old_values + delta - returns) ** 2
            assert (clipped > loss).any() and (clipped < loss).any()  # both sides of the max
            loss = torch.max(loss, clipped)
        torch.testing.assert_close(terms["value_loss"].detach(), 0.5 * loss.mean())


def test_entropy_bonus_lowers_the_loss_by_its_coefficient(ppo):
    _, _, (plain, _, _) = loss_of(ppo, ppo.Args(norm_obs=False))
    _, _, (bonus, terms, _) = loss_of(ppo, ppo.Args(norm_obs=False, ent_coef=0.01))
    assert terms["entropy"] > 0
    torch.testing.assert_close(bonus - plain, -0.01 * terms["entropy"])


def test_bounds_loss_raises_the_loss_by_its_coefficient_times_the_penalty(ppo):
    _, _, (plain, _, new) = loss_of(ppo, ppo.Args(norm_obs=False), scale_actor=500.0)
    _, _, (bounded, terms, _) = loss_of(
        ppo, ppo.Args(norm_obs=False, bounds_loss_coef=0.5), scale_actor=500.0
    )
    penalty = ppo.bounds_loss(new["means"])
    assert penalty > 0.1  # the means have left [-1, 1]
    torch.testing.assert_close(terms["bounds_loss"], penalty)
    torch.testing.assert_close(bounded - plain, 0.5 * penalty)


def test_advantages_are_normalized_only_with_norm_adv(ppo):
    """Ratio 1 everywhere: the surrogate is -mean(A), 0 for normalized advantages."""
    _, mb, (_, raw, _) = loss_of(ppo, ppo.Args(norm_obs=False, norm_adv=False))
    torch.testing.assert_close(raw["policy_loss"], -mb["advantages"].mean())
    if ppo.__name__ != "ppo_ddp":  # ppo_ddp normalizes once per update, over the global batch
        _, _, (_, normalized, _) = loss_of(ppo, ppo.Args(norm_obs=False, norm_adv=True))
        assert abs(normalized["policy_loss"].item()) < 1e-6


def test_l2c2_loss_matches_its_formula_with_the_noise_scale(ppo):
    agent, obs, _, _, _ = minibatch(ppo, ppo.Args(norm_obs=False), scale_actor=100.0)
    mean = agent.actor_mean(obs)
    torch.manual_seed(5)
    value = ppo.l2c2_loss(agent, obs, mean, 0.3)
    torch.manual_seed(5)
    eps = (torch.rand_like(obs) * 2.0 - 1.0) * 0.3
    change = ((agent.actor_mean(obs + eps) - mean) ** 2).sum(-1).mean()
    torch.testing.assert_close(value, change / (eps**2).sum(-1).mean())


def test_normalize_clips_at_clip_obs_and_is_the_identity_without_norm_obs(ppo):
    obs = torch.tensor([[0.0, 50.0, -50.0], [1.0, 2.0, 3.0]])
    agent = ppo.Agent(3, 1, ppo.Args(clip_obs=0.5))
    agent.obs_rms.update(torch.tensor([[0.0, 0.0, 0.0], [2.0, 4.0, 6.0]]))
    expected = (obs - agent.obs_rms.mean) / torch.sqrt(agent.obs_rms.var + 1e-8)
    torch.testing.assert_close(agent.normalize(obs), expected.clamp(-0.5, 0.5).float())
    assert agent.normalize(obs).abs().max() == 0.5
    assert ppo.Agent(3, 1, ppo.Args(norm_obs=False)).normalize(obs) is obs


def toy_rollout(ppo, monkeypatch, **overrides):
    allow_toy_env(ppo, monkeypatch)
    torch.manual_seed(0)
    args = toy_args(ppo, "unused", **overrides)
    envs = ppo.make_envs(args.env_id, args.num_envs)
    agent = ppo.Agent(1, 1, args)
    carry = ppo.start_episodes(envs, 0, args, torch.device("cpu"))
    rms = ppo.RunningMeanStd()
    rollout = ppo.collect_rollout(agent, envs, rms, carry, 0, RecordingWriter(), args)
    envs.close()
    return rollout


def test_scaled_rewards_are_clipped_and_raw_without_norm_reward(ppo, monkeypatch):
    # Reward 1: scaled by 1 / std of the discounted returns (about 1.4), clipped at 0.3.
    assert torch.all(toy_rollout(ppo, monkeypatch)["rewards"] > 0.5)
    torch.testing.assert_close(
        toy_rollout(ppo, monkeypatch, clip_reward=0.3)["rewards"], torch.full((10, 2), 0.3)
    )
    rewards = toy_rollout(ppo, monkeypatch, norm_reward=False, clip_reward=0.3)["rewards"]
    torch.testing.assert_close(rewards, torch.ones(10, 2))


@pytest.mark.parametrize("nonnegative", [False, True])
@pytest.mark.parametrize("horizon", [False, True])
def test_reward_options_on_a_hand_computed_rollout(ppo, monkeypatch, nonnegative, horizon):
    """SignedRewards gives -2, 2, -2, 2, -2 per episode, two episodes per env in 10 steps:
    --nonnegative-reward makes them 0, 2, 0, 2, 0 and --horizon-scale-reward multiplies by
    1 - 0.99. The logged returns stay the env's (-2 per episode)."""
    options = dict(nonnegative_reward=nonnegative, horizon_scale_reward=horizon)
    _, _, carry, _, rollout, _ = toy_rollout_and_batch(
        ppo, monkeypatch, env_id="toy_envs:SignedRewards-v0", norm_reward=False, **options
    )
    episode = [0.0 if nonnegative else -2.0, 2.0] * 2 + [0.0 if nonnegative else -2.0]
    expected = torch.tensor(episode * 2, dtype=torch.float32) * (0.01 if horizon else 1.0)
    torch.testing.assert_close(rollout["rewards"], expected[:, None].expand(10, 2))
    assert [(e["return"], e["length"]) for e in carry["episodes"]] == [(-2.0, 5)] * 4


def test_reward_options_keep_the_scale_of_norm_reward(ppo, monkeypatch):
    """With --norm-reward the options apply to the scaled rewards, whose scale is still that of the
    env's own rewards: the same rollout with the options is the one without, clamped and scaled."""
    rollouts = [
        toy_rollout_and_batch(ppo, monkeypatch, env_id="toy_envs:SignedRewards-v0", **options)[4]
        for options in ({}, dict(nonnegative_reward=True, horizon_scale_reward=True))
    ]
    expected = rollouts[0]["rewards"].clamp_min(0.0) * 0.01
    torch.testing.assert_close(rollouts[1]["rewards"], expected)
    assert rollouts[0]["rewards"].abs().max() != 2.0  # scaled


def test_target_kl_stops_the_epochs(ppo, monkeypatch):
    allow_toy_env(ppo, monkeypatch)
    calls = []

    def counting_loss(*args):
        calls.append(1)
        return ppo.ppo_loss(*args)

    for target_kl, expected in ((None, 5 * 2), (1e-12, 2)):
        rollout = toy_rollout(ppo, monkeypatch, update_epochs=5, target_kl=target_kl)
        rollout["advantages"] = torch.linspace(-1, 1, 20).reshape(10, 2)
        rollout["returns"] = torch.zeros(10, 2)
        batch = {key: value.flatten(0, 1) for key, value in rollout.items()}
        args = toy_args(ppo, "unused", update_epochs=5, target_kl=target_kl)
        agent = ppo.Agent(1, 1, args)
        calls.clear()
        ppo.ppo_update(agent, ppo.make_optimizers(agent, args), counting_loss, batch, 1.0, args)
        assert len(calls) == expected, target_kl


def scalars(run_dir, tag):
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0}).Reload()
    return [event.value for event in events.Scalars(tag)]


def test_learning_rate_anneals_linearly_to_zero(ppo, tmp_path, monkeypatch):
    allow_toy_env(ppo, monkeypatch)
    ppo.train(toy_args(ppo, tmp_path, total_timesteps=60, learning_rate=1e-3))
    (run_dir,) = tmp_path.glob("*")
    lrs = scalars(run_dir, "charts/learning_rate")
    np.testing.assert_allclose(lrs, [1e-3, 1e-3 * 2 / 3, 1e-3 / 3], rtol=1e-6)


def test_no_norm_obs_leaves_the_normalizer_alone(ppo, tmp_path, monkeypatch):
    allow_toy_env(ppo, monkeypatch)
    ppo.train(toy_args(ppo, tmp_path, total_timesteps=40, norm_obs=False))
    ckpt = ppo.load_checkpoint(str(next(tmp_path.glob("*/checkpoint.pt"))))
    assert ckpt["agent"]["obs_rms.count"].item() == pytest.approx(1e-4)


def test_resume_restores_the_reward_normalizer(ppo, tmp_path, monkeypatch):
    """A resumed run scales its rewards with the saved statistics, not from scratch."""
    allow_toy_env(ppo, monkeypatch)
    ppo.train(toy_args(ppo, tmp_path, total_timesteps=40))
    path = str(next(tmp_path.glob("*/checkpoint.pt")))
    saved = ppo.load_checkpoint(path)["reward_rms"]
    assert saved["count"] > 1
    seen = []
    original = ppo.collect_rollout

    def spy(agent, envs, reward_rms, *rest):
        seen.append({key: value.clone() for key, value in reward_rms.state_dict().items()})
        return original(agent, envs, reward_rms, *rest)

    monkeypatch.setattr(ppo, "collect_rollout", spy)
    ppo.train(toy_args(ppo, tmp_path, total_timesteps=60, resume=path))
    for key, value in saved.items():
        assert torch.equal(seen[0][key], value), key


def test_dormant_fraction_against_hand_made_layers(script):
    # Mean |activation| per unit 1, 1, 0.02, 2: the layer's mean is 1.005, and 0.02 / 1.005 is
    # below Sokar et al.'s threshold 0.025, at any scale of the layer; 0.03 / 1.0075 = 0.0298 is
    # above it.
    h = torch.tensor([[1.0, -1.0, 0.02, 2.0], [-1.0, 1.0, -0.02, -2.0]])
    assert script.dormant_fraction([h]) == 0.25
    assert script.dormant_fraction([h * 100]) == script.dormant_fraction([h / 100]) == 0.25
    h[:, 2] = 0.03
    assert script.dormant_fraction([h]) == 0.0
    silent = torch.tensor([[1.0, 0.0, 0.0, 1.0]]).repeat(2, 1)  # two units that never respond
    assert script.dormant_fraction([h, silent]) == 2 / 8  # the fraction of all hidden units


def test_effective_rank_against_hand_made_features(script):
    # k orthogonal feature directions of equal strength: k equal singular values, entropy log k,
    # effective rank k; one direction: 1. Uneven strengths fall between (Roy & Vetterli 2007).
    q, _ = torch.linalg.qr(torch.randn(32, 32, generator=torch.Generator().manual_seed(0)))
    for k in (1, 4, 16):
        assert script.effective_rank(3.0 * q[:, :k]) == pytest.approx(k)
    uneven = q[:, :4] * torch.tensor([1.0, 1.0, 0.1, 0.1])
    assert 2.0 < script.effective_rank(uneven) < 4.0
    assert math.isnan(script.effective_rank(torch.full((4, 4), math.inf)))


def test_explained_variance_against_hand_made_values(script):
    """1 - Var(returns - values) / Var(returns): 1 for a perfect critic, 0 for one that predicts
    the mean, 0.75 for one whose error has half the returns' std; NaN for constant returns."""
    torch.manual_seed(0)
    args = script.Args(norm_obs=False)
    agent = script.Agent(3, 2, args)
    obs, actions = torch.randn(64, 3), torch.randn(64, 2)
    with torch.no_grad():
        logprobs = agent.get_action_and_value(obs, actions)["logprobs"]
    returns = torch.randn(64) * 3 + 1
    noise = torch.randn(64)
    noise = 0.5 * noise * returns.std() / noise.std()
    cases = [
        (returns, 1.0),
        (torch.full((64,), returns.mean().item()), 0.0),
        (returns + noise, 0.75),
    ]
    for values, expected in cases:
        batch = {"obs": obs, "actions": actions, "logprobs": logprobs, "values": values}
        batch.update(advantages=torch.randn(64), returns=returns)
        metrics = script.diagnostics(agent, batch, torch.ones(64), args)
        assert metrics["losses/explained_variance"] == pytest.approx(expected, abs=1e-5)
    batch["returns"] = torch.ones(64)
    assert math.isnan(
        script.diagnostics(agent, batch, torch.ones(64), args)["losses/explained_variance"]
    )


def test_diagnostics_counts_the_dead_units_of_every_hidden_layer(script):
    torch.manual_seed(0)
    args = script.Args(actor_layers=(8, 8), norm_obs=False)
    agent = script.Agent(3, 2, args)
    with torch.no_grad():  # 3 units of the first layer output tanh(0) = 0 whatever the input
        agent.actor_mean[0].weight[:3] = 0.0
        agent.actor_mean[0].bias[:3] = 0.0
    obs, actions = torch.randn(64, 3), torch.randn(64, 2)
    with torch.no_grad():
        out = agent.get_action_and_value(obs, actions)
    batch = {"obs": obs, "actions": actions, "logprobs": out["logprobs"]}
    batch.update(advantages=torch.randn(64), returns=torch.randn(64), values=out["values"])
    metrics = script.diagnostics(agent, batch, torch.ones(64), args)
    # The reference, written out: both hidden layers' activations, each unit's score.
    w1, b1 = agent.actor_mean[0].weight, agent.actor_mean[0].bias
    w2, b2 = agent.actor_mean[2].weight, agent.actor_mean[2].bias
    h1 = torch.tanh(obs @ w1.T + b1)
    h2 = torch.tanh(h1 @ w2.T + b2)
    dormant = [(h.abs().mean(0) / h.abs().mean() <= 0.025).sum().item() for h in (h1, h2)]
    assert dormant[0] == 3
    assert metrics["charts/actor_dormant_fraction"] == pytest.approx(sum(dormant) / 16)
