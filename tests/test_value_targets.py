"""--recompute-advantages (candidate R of issue #32; V, --norm-value, lost and left the scripts),
in every script that has it: against a reference, with a test that fails when its line is
dropped."""

import importlib

import numpy as np
import pytest
import torch
from conftest import PPO_FAMILY, small_args, toy_rollout_and_batch

HAS_R = [importlib.import_module(n).Args.__annotations__ for n in PPO_FAMILY]
SCRIPTS = [n for n, fields in zip(PPO_FAMILY, HAS_R) if "recompute_advantages" in fields]


@pytest.fixture(scope="module", params=SCRIPTS)
def ppo(request):
    return importlib.import_module(request.param)


def test_next_obs_is_the_successor_state_and_gives_the_bootstrap_values(ppo, monkeypatch):
    """CountsSteps: obs k is followed by k + 1, also at a truncation (the final obs 5, not the
    reset obs 0); the critic's values of next_obs are the rollout's next_values."""
    agent, _, _, _, rollout, _ = toy_rollout_and_batch(ppo, monkeypatch)
    assert rollout["dones"].sum() == 4  # both envs truncated twice
    torch.testing.assert_close(rollout["next_obs"], rollout["obs"] + 1)
    with torch.no_grad():
        values = agent.get_value(rollout["next_obs"].flatten(0, 1)).view(10, 2)
    torch.testing.assert_close(values, rollout["next_values"])


def test_recompute_gae_is_the_gae_of_the_current_critic(ppo, monkeypatch):
    agent, args, _, _, rollout, batch = toy_rollout_and_batch(ppo, monkeypatch)
    advantages, returns = ppo.recompute_gae(agent, batch, args)
    torch.testing.assert_close(advantages, batch["advantages"])  # the rollout's critic: the same
    torch.testing.assert_close(returns, batch["returns"])
    with torch.no_grad():  # another critic
        agent.critic[-1].weight.mul_(3.0)
        agent.critic[-1].bias.add_(0.5)
        # The reference: values of the counts k and k + 1 taken one by one, in time-major order.
        values = torch.stack([agent.get_value(obs) for obs in rollout["obs"]])
        next_values = torch.stack([agent.get_value(obs + 1) for obs in rollout["obs"]])
    expected, _ = ppo.compute_gae(
        rollout["rewards"], values, next_values, rollout["terminated"], rollout["dones"],
        args.gamma, args.gae_lambda,
    )  # fmt: skip
    advantages, returns = ppo.recompute_gae(agent, batch, args)
    torch.testing.assert_close(advantages, expected.flatten())
    torch.testing.assert_close(returns, (expected + values).flatten())
    assert not torch.allclose(advantages, batch["advantages"], atol=1e-3)


@pytest.mark.parametrize("recompute", [False, True])
def test_epochs_after_the_first_use_the_advantages_of_the_current_critic(
    ppo, monkeypatch, recompute
):
    """One minibatch per epoch, in batch order: each epoch's advantages are recorded beside the
    GAE of the critic as that epoch starts. Without the option every epoch keeps the rollout's."""
    agent, args, _, _, _, batch = toy_rollout_and_batch(
        ppo, monkeypatch, num_minibatches=1, update_epochs=3, learning_rate=0.01,
        recompute_advantages=recompute,
    )  # fmt: skip
    monkeypatch.setattr(torch, "randperm", lambda n, device=None: torch.arange(n, device=device))
    rollout_batch, seen = dict(batch), []

    def recording_loss(agent, mb, args):
        current, _ = ppo.recompute_gae(agent, rollout_batch, args)
        seen.append((mb["advantages"].clone(), current))
        return ppo.ppo_loss(agent, mb, args)

    ppo.ppo_update(agent, ppo.make_optimizers(agent, args), recording_loss, batch, 1.0, args)
    assert len(seen) == 3
    torch.testing.assert_close(seen[0][0], rollout_batch["advantages"])
    for used, current in seen[1:]:
        assert not torch.allclose(current, rollout_batch["advantages"], atol=1e-4)
        torch.testing.assert_close(used, current if recompute else rollout_batch["advantages"])


def test_recompute_advantages_trains_with_finite_losses_and_defaults_to_off(ppo, tmp_path):
    assert not ppo.Args().recompute_advantages
    args = small_args(ppo, tmp_path, recompute_advantages=True, update_epochs=2)
    metrics = ppo.train(args)
    assert all(np.isfinite(v) for k, v in metrics.items() if k != "losses/explained_variance")
