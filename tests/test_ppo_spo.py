"""Tests of what ppo_spo.py adds to ppo_continuous.py: the SPO loss and its use in ppo_loss.

The shared end-to-end tests (GAE, normalization, checkpoints, learning) run on ppo_spo.py from
test_ppo_family.py.
"""

import numpy as np
import pytest
import torch

import ppo_spo


def ratio_grad(ratio, advantages, epsilon):
    """d spo_loss / d ratio, by autograd."""
    r = torch.as_tensor(ratio, dtype=torch.float64).clone().requires_grad_(True)
    ppo_spo.spo_loss(r, torch.as_tensor(advantages, dtype=torch.float64), epsilon).backward()
    return r.grad


@pytest.mark.parametrize("eps", [0.1, 0.2, 0.3])
def test_gradient_is_zero_at_the_edge_of_the_trust_region(eps):
    adv = torch.tensor([2.0, -0.5, 1.3, -3.0], dtype=torch.float64)
    edge = 1.0 + torch.sign(adv) * eps
    torch.testing.assert_close(ratio_grad(edge, adv, eps), torch.zeros(4, dtype=torch.float64))


def test_gradient_at_ratio_one_equals_ppo():
    adv = torch.tensor([2.0, -0.5, 1.3, -3.0, 0.0], dtype=torch.float64)
    grad = ratio_grad(torch.ones(5), adv, 0.2)
    torch.testing.assert_close(grad, -adv / len(adv))
    # PPO's clipped surrogate has the same gradient at r = 1 (inside the clip range).
    r = torch.ones(5, dtype=torch.float64, requires_grad=True)
    (-torch.min(r * adv, r.clamp(0.8, 1.2) * adv).mean()).backward()
    torch.testing.assert_close(grad, r.grad)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_gradient_points_back_into_the_trust_region(sign):
    """Gradient descent on the loss lowers r above 1 + eps and raises it below 1 - eps, whatever the
    sign of A; PPO's clipped surrogate has zero gradient at those r where A favours leaving."""
    eps = 0.2
    adv = sign * torch.tensor([0.3, 1.0, 4.0], dtype=torch.float64)
    for r in (1.0 + eps + 1e-3, 1.5, 3.0):
        assert (ratio_grad(torch.full((3,), r), adv, eps) > 0).all(), r
    for r in (1.0 - eps - 1e-3, 0.5, 0.01):
        assert (ratio_grad(torch.full((3,), r), adv, eps) < 0).all(), r


def test_zero_advantage_gives_zero_finite_loss_and_gradient():
    ratio = torch.tensor([0.1, 1.0, 5.0], dtype=torch.float64)
    grad = ratio_grad(ratio, torch.zeros(3), 0.2)
    assert torch.equal(grad, torch.zeros(3, dtype=torch.float64))
    assert ppo_spo.spo_loss(ratio, torch.zeros(3, dtype=torch.float64), 0.2).item() == 0.0


@pytest.mark.parametrize("per_sample", [False, True])
def test_loss_and_gradient_match_an_independent_formula(per_sample):
    rng = np.random.default_rng(0)
    n = 257
    ratio, adv = np.exp(rng.normal(0, 0.3, n)), rng.normal(0, 2, n)
    eps = rng.uniform(0.05, 0.4, n) if per_sample else 0.2
    eps_arr = np.broadcast_to(eps, (n,))
    expected = (
        -sum(r * a - abs(a) / (2 * e) * (r - 1) ** 2 for r, a, e in zip(ratio, adv, eps_arr)) / n
    )
    expected_grad = -(adv - np.abs(adv) * (ratio - 1) / eps_arr) / n  # d/dr, written out by hand
    eps_arg = torch.as_tensor(eps) if per_sample else eps
    loss = ppo_spo.spo_loss(torch.as_tensor(ratio), torch.as_tensor(adv), eps_arg)
    assert loss.shape == ()
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    np.testing.assert_allclose(
        ratio_grad(ratio, adv, eps_arg).numpy(), expected_grad, rtol=1e-10, atol=1e-15
    )


def test_ppo_loss_uses_spo_with_eps_high_for_positive_and_eps_low_for_negative_advantages():
    torch.manual_seed(0)
    args = ppo_spo.Args(norm_obs=False, clip_low=0.1, clip_high=0.3)
    agent = ppo_spo.Agent(3, 2, args)
    obs, actions = torch.randn(64, 3), torch.randn(64, 2)
    with torch.no_grad():
        old = agent.get_action_and_value(obs, actions)
    # Log-probs moved so that the ratios spread on both sides of the trust region.
    old_logprobs = old["logprobs"] + 0.3 * torch.randn(64)
    adv, returns = torch.randn(64), torch.randn(64)
    mb = {"obs": obs, "actions": actions, "logprobs": old_logprobs, "advantages": adv,
          "returns": returns, "values": old["values"]}  # fmt: skip
    loss, terms, new = ppo_spo.ppo_loss(agent, mb, args)
    ratio = new["ratio"]
    norm_adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    eps = torch.where(norm_adv > 0, 0.3, 0.1)
    torch.testing.assert_close(terms["policy_loss"], ppo_spo.spo_loss(ratio, norm_adv, eps))
    # Not PPO's clipped surrogate: with ratios outside [0.9, 1.3] the two differ.
    clipped = -torch.min(ratio * norm_adv, ratio.clamp(0.9, 1.3) * norm_adv).mean()
    assert abs(terms["policy_loss"].item() - clipped.item()) > 1e-3
    assert torch.isfinite(loss)


def test_checkpoints_are_tagged_ppo_spo():
    assert ppo_spo.SCRIPT_NAME == "ppo_spo" and ppo_spo.Args().exp_name == "ppo_spo"


def test_default_actor_is_the_papers_deep_one_and_the_critic_stays_small():
    args = ppo_spo.Args()
    assert args.actor_layers == (256, 256, 128, 128, 64, 64) and args.critic_layers == (64, 64)
    agent = ppo_spo.Agent(11, 3, args)
    linears = [m for m in agent.actor_mean if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 7 and linears[-1].out_features == 3  # 6 hidden layers + the mean head
