"""Tests of appo_vtrace.py: V-trace against a plain loop, the actor/learner lifecycle (a killed
actor, Ctrl-C, no process left behind), checkpoints, bad input and learning.

The end-to-end tests start real actor processes (spawn), so each costs a few seconds of start-up.
"""

import contextlib
import copy
import dataclasses
import glob
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import toy_envs
from conftest import (
    BOOTSTRAP_RUN,
    CLEANRL_TAGS,
    ROOT,
    assert_finite_metrics,
    flags,
    only_checkpoint,
    read_events,
    run_script,
    small_args,
    trained_value,
)
from toy_envs import StartsAChild

import appo_vtrace as appo

ENV_ID = "Hopper-v5"  # terminates often early in training, so rollouts hold episode ends
ONE_ACTOR_ON_THE_TOY_ENV = dict(env_id="toy_envs:AlwaysTruncates-v0", num_actors=1, num_rollouts=1)
ONE_ACTOR_ON_THE_TOY_ENV["eval_episodes"] = 1


# ---------------------------------------------------------------------------------------------
# V-trace
# ---------------------------------------------------------------------------------------------
def vtrace_reference(behaviour, target, rewards, values, bootstrap, dones, gamma, clip_rho, clip_c):
    """IMPALA eq. 1 written out as a sum, one env and one start step at a time:
    v_s = V(x_s) + sum_{t>=s} gamma^{t-s} (prod_{i<t} c_i) rho_t (r_t + gamma V(x_{t+1}) - V(x_t)),
    stopping at the end of the episode (where V(x_{t+1}) counts as 0)."""
    T, N = rewards.shape
    ratio = np.exp(target - behaviour)
    vs, adv = np.zeros((T, N)), np.zeros((T, N))
    for n in range(N):

        def next_value(t, v, n=n):  # the value of the state after step t in the same episode
            return 0.0 if dones[t, n] else (bootstrap[n] if t == T - 1 else v[t + 1, n])

        for s in range(T):
            total, weight = values[s, n], 1.0
            for t in range(s, T):
                total += (
                    weight
                    * min(clip_rho, ratio[t, n])
                    * (rewards[t, n] + gamma * next_value(t, values) - values[t, n])
                )
                if dones[t, n]:
                    break
                weight *= gamma * min(clip_c, ratio[t, n])
            vs[s, n] = total
        for s in range(T):
            adv[s, n] = min(clip_rho, ratio[s, n]) * (
                rewards[s, n] + gamma * next_value(s, vs) - values[s, n]
            )
    return vs, adv


def test_vtrace_matches_plain_loop_off_policy_with_episode_ends():
    rng = np.random.default_rng(0)
    T, N = 13, 5
    behaviour = rng.normal(size=(T, N))
    target = behaviour + rng.normal(scale=0.6, size=(T, N))
    rewards, values = rng.normal(size=(2, T, N))
    bootstrap = rng.normal(size=N)
    dones = np.zeros((T, N))
    dones[2, 0] = dones[7, 0] = dones[12, 1] = dones[0, 3] = dones[5, 4] = 1
    clip_rho, clip_c = 1.3, 0.8  # different, so a swap of the two would be caught
    ratio = np.exp(target - behaviour)
    assert (
        (ratio > clip_rho).any()
        and ((ratio > clip_c) & (ratio < clip_rho)).any()
        and (ratio < clip_c).any()
    )
    expected_vs, expected_adv = vtrace_reference(
        behaviour, target, rewards, values, bootstrap, dones, 0.95, clip_rho, clip_c
    )
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    vs, adv = appo.vtrace_advantages(
        t(behaviour),
        t(target),
        t(rewards),
        t(values),
        t(bootstrap),
        t(dones),
        gamma=0.95,
        clip_rho=clip_rho,
        clip_c=clip_c,
    )
    np.testing.assert_allclose(vs.numpy(), expected_vs, atol=1e-12)
    np.testing.assert_allclose(adv.numpy(), expected_adv, atol=1e-12)


def test_vtrace_on_policy_is_the_bootstrapped_n_step_return():
    rng = np.random.default_rng(1)
    T, N, gamma = 9, 3, 0.9
    logp = torch.tensor(rng.normal(size=(T, N)))
    rewards, values = torch.tensor(rng.normal(size=(2, T, N)))
    bootstrap = torch.tensor(rng.normal(size=N))
    vs, adv = appo.vtrace_advantages(
        logp, logp, rewards, values, bootstrap, torch.zeros(T, N, dtype=torch.float64), gamma=gamma
    )
    for s in range(T):
        n_step = (
            sum(gamma ** (t - s) * rewards[t] for t in range(s, T)) + gamma ** (T - s) * bootstrap
        )
        torch.testing.assert_close(vs[s], n_step)
    next_vs = torch.cat([vs[1:], bootstrap[None]])
    torch.testing.assert_close(adv, rewards + gamma * next_vs - values)


def test_soft_update_and_lr_factors():
    args = appo.Args(actor_layers=(8,), critic_layers=(8,))
    agent, target = appo.Agent(3, 2, args), appo.Agent(3, 2, args)
    before = [p.clone() for p in target.parameters()]
    agent.obs_rms.update(torch.randn(10, 3))
    appo.soft_update(target, agent, 0.25)
    for b, p_target, p in zip(before, target.parameters(), agent.parameters()):
        torch.testing.assert_close(p_target, 0.75 * b + 0.25 * p)
    assert torch.equal(target.obs_rms.mean, agent.obs_rms.mean)
    assert appo.adapt_learning_rate(1e-3, kl=0.05, desired_kl=0.01, decrease=2.0) == pytest.approx(
        5e-4
    )
    assert appo.adapt_learning_rate(1e-3, kl=0.001, desired_kl=0.01, increase=1.2) == pytest.approx(
        1.2e-3
    )


# ---------------------------------------------------------------------------------------------
# Seams: the learner's weights -> the actors; an actor's raw rollout -> the learner's batch
# ---------------------------------------------------------------------------------------------
class RecordingPipe:
    """An actor's pipe, on the learner's side, that keeps every rollout it delivers; having got an
    even rollout j, it waits until the actor has started rollout j + 1, which so acts with the
    version before update j (toy_envs.LockstepCountsSteps)."""

    def __init__(self, conn, log: list, gate: str):
        self.conn, self.log, self.gate = conn, log, gate

    def recv(self):
        self.log.append(self.conn.recv())
        if len(self.log) % 2 == 1:
            toy_envs.wait_for(os.path.join(self.gate, "started"), len(self.log))
        return self.log[-1]

    def fileno(self):  # for multiprocessing.connection.wait
        return self.conn.fileno()

    def close(self):
        self.conn.close()


class HeldLock:
    """The weights' lock as publish sees it while the test's learner already holds the real one."""

    def acquire(self, timeout=None):
        return True

    def release(self):
        pass


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory):
    """6 updates of one actor on CountsSteps (2 envs x 32 steps, an episode end every 5 steps)
    in lockstep with the learner (versions 0, 0, 2, 2, 4, 4: lags 0, 1, 0, 1, 0, 1), with a
    target network that trails the learner (--tau 0.5): every rollout as the actor sent it, the
    weights the learner published at each version (0: those the actors started with), and what
    receive_rollouts made of each rollout, with the learner and target it had then."""
    record = {"received": [], "published": {}, "batches": [], "holds_lock": False}
    start_actors, publish, receive = appo.start_actors, appo.publish, appo.receive_rollouts
    gate = str(tmp_path_factory.mktemp("lockstep"))

    def recording_start_actors(agent, global_step, args):
        actors = start_actors(agent, global_step, args)
        record["published"][actors["version"].value] = copy.deepcopy(agent.state_dict())
        conns = actors["conns"]
        actors["conns"] = [RecordingPipe(conn, record["received"], gate) for conn in conns]
        return actors

    def recording_publish(agent, target_agent, actors, iteration, args):
        if record["holds_lock"]:  # publish under it, then let the waiting actor read the version
            publish(agent, target_agent, {**actors, "lock": HeldLock()}, iteration, args)
            actors["lock"].release()
            record["holds_lock"] = False
        else:
            publish(agent, target_agent, actors, iteration, args)
        record["published"][iteration] = copy.deepcopy(agent.state_dict())
        if iteration % 2 == 1:  # the actor, in rollout `iteration`, is to wait for the next one
            actors["lock"].acquire()
            record["holds_lock"] = True
            toy_envs.write_number(os.path.join(gate, "locked"), iteration)

    def recording_receive(agent, target_agent, *rest):
        rollout, lag = receive(agent, target_agent, *rest)
        nets = copy.deepcopy(agent), copy.deepcopy(target_agent)
        record["batches"].append((*nets, {k: v.clone() for k, v in rollout.items()}))
        return rollout, lag

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOCKSTEP", gate)  # the spawned actor inherits it
        patch.setattr(appo, "start_actors", recording_start_actors)
        patch.setattr(appo, "publish", recording_publish)
        patch.setattr(appo, "receive_rollouts", recording_receive)
        env_id = "toy_envs:LockstepCountsSteps-v0"
        args = small_args(appo, tmp_path_factory.mktemp("runs"), env_id=env_id)
        args = dataclasses.replace(args, num_steps=32, total_timesteps=384, tau=0.5)
        args = dataclasses.replace(args, learning_rate=3e-3, update_epochs=2)
        appo.train(args)
    return record, args


def test_actors_act_with_the_weights_the_learner_published(recorded_run):
    """The behaviour log-probs of each rollout are those of the weights published at the version
    it says it acted with, recomputed here for its observations and actions; and the rollouts
    of the run were fresh (lag 0) as well as one update old."""
    record, args = recorded_run
    lags, moved = set(), 0.0
    for update, rollout in enumerate(record["received"]):  # update k received the k-th rollout
        policy = appo.Agent(1, 1, args)
        policy.load_state_dict(record["published"][rollout["version"]])
        first = appo.Agent(1, 1, args)
        first.load_state_dict(record["published"][0])
        obs, actions = torch.as_tensor(rollout["obs"]), torch.as_tensor(rollout["actions"])
        with torch.no_grad():
            logprobs = policy.get_action_and_value(obs, actions)["logprobs"]
            initial = first.get_action_and_value(obs, actions)["logprobs"]
        torch.testing.assert_close(torch.as_tensor(rollout["logprobs"]), logprobs)
        lags.add(update - rollout["version"])  # update k starts with version k published
        moved = max(moved, (logprobs - initial).abs().max().item())
    assert [rollout["version"] for rollout in record["received"]] == [0, 0, 2, 2, 4, 4]
    assert lags == {0, 1} and moved > 1e-3  # not vacuous: the published policies differ


def test_the_learner_scales_rewards_then_bootstraps_and_takes_the_target_s_ratio(recorded_run):
    """From each rollout as the actor sent it: rewards divided by the std of all discounted
    returns so far (clipped), then gamma * V(final_obs) added where a time limit cut the episode
    (not scaled again); values and the bootstrap from the learner; the log-probs of IMPACT's ratio
    from the target network, which here differs from the learner."""
    record, args = recorded_run
    discounted = []
    for (agent, target, rollout), raw in zip(record["batches"], record["received"]):
        discounted.append(raw["discounted"])
        everything = np.concatenate(discounted, axis=None)
        count = 1e-4 + everything.size  # RunningMeanStd's prior: count 1e-4, mean 0, var 1
        mean = everything.sum() / count
        var = (1e-4 * (1 + mean**2) + ((everything - mean) ** 2).sum()) / count
        rewards = np.clip(raw["rewards"] / np.sqrt(var + 1e-8), -args.clip_reward, args.clip_reward)
        cut = raw["truncated"] & ~raw["terminated"]
        obs, actions = torch.as_tensor(raw["obs"]), torch.as_tensor(raw["actions"])
        with torch.no_grad():
            final_values = agent.get_value(torch.as_tensor(raw["final_obs"])).numpy()
            rewards = rewards + cut * args.gamma * final_values
            learner = agent.get_action_and_value(obs, actions)
            targets = target.get_action_and_value(obs, actions)["logprobs"]
            bootstrap = agent.get_value(torch.as_tensor(raw["next_obs"][0]))
        assert cut.any()
        np.testing.assert_allclose(rollout["rewards"], rewards, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(rollout["values"], learner["values"])
        torch.testing.assert_close(rollout["bootstrap_values"], bootstrap)
        torch.testing.assert_close(rollout["logprobs"], targets)
        torch.testing.assert_close(rollout["behaviour_logprobs"], torch.as_tensor(raw["logprobs"]))
    # Not vacuous: by the last update the target trails the learner (tau 0.5).
    assert (learner["logprobs"] - targets).abs().max() > 1e-4


# ---------------------------------------------------------------------------------------------
# End to end with 2 actors
# ---------------------------------------------------------------------------------------------
def short_args(tmp_path, **overrides):
    """small_args with 2 actors: batch = 2 rollouts x 2 envs x 128 steps = 512; 4 updates."""
    fields = dict(env_id=ENV_ID, total_timesteps=2048, num_actors=2, num_steps=128, num_rollouts=2)
    fields.update(num_minibatches=4, update_epochs=2, eval_episodes=2)
    return small_args(appo, tmp_path, **{**fields, **overrides})


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("runs")
    metrics = appo.train(short_args(log_dir))
    return metrics, next(log_dir.glob("*/checkpoint.pt"))


def test_short_run_trains_with_finite_losses_and_reports_policy_lag(short_run):
    metrics, ckpt_path = short_run
    tags = [
        "losses/policy_loss",
        "losses/value_loss",
        "losses/entropy",
        "losses/approx_kl",
        "losses/clipfrac",
        "losses/explained_variance",
        "losses/behaviour_kl",
        "losses/rho_clipfrac",
        "losses/rho_p99",
        "losses/grad_norm",
        "losses/actor_grad_norm",
        "losses/critic_grad_norm",
        "charts/policy_lag_mean",
        "charts/policy_lag_max",
        "charts/learner_wait_time",
        "charts/actor_wait_frac",
    ]
    assert_finite_metrics(metrics, tags, global_step=2048)
    assert 0 <= metrics["charts/policy_lag_mean"] <= metrics["charts/policy_lag_max"]
    # The learner normalizes with statistics of exactly the rollouts it trained on, and the
    # checkpoint holds the target network too.
    ckpt = appo.load_checkpoint(str(ckpt_path))
    assert ckpt["agent"]["obs_rms.count"].item() == pytest.approx(1e-4 + 2048)
    assert ckpt["iteration"] == 4 and "target_agent" in ckpt


def test_tensorboard_has_cleanrl_tags_and_a_nonzero_lag(short_run):
    events = read_events(short_run[1].parent)
    lag_tags = {"charts/policy_lag_mean", "charts/learner_wait_time"}
    assert CLEANRL_TAGS | lag_tags <= set(events.Tags()["scalars"])
    # Every actor starts its second rollout (with version 0) before the learner can publish
    # version 1, so the second update trains on data one update old.
    assert max(e.value for e in events.Scalars("charts/policy_lag_max")) >= 1


def test_checkpoint_round_trip_and_resume(short_run, tmp_path):
    metrics, ckpt_path = short_run
    reloaded = appo.train(appo.Args(eval_checkpoint=str(ckpt_path), eval_episodes=2))
    assert reloaded["eval/episodic_return"] == metrics["eval/episodic_return"]
    copy = tmp_path / "checkpoint.pt"
    copy.write_bytes(ckpt_path.read_bytes())
    resumed = appo.train(
        appo.parse_args(
            ["--resume", str(copy), "--total-timesteps", "3072", "--eval-episodes", "2"]
        )
    )
    assert resumed["global_step"] == 3072
    ckpt = appo.load_checkpoint(str(copy))
    assert ckpt["iteration"] == 6 and ckpt["args"]["num_envs"] == 2  # saved settings kept


class KeepingPipe:
    """An actor's pipe, on the learner's side, that keeps every rollout it delivers."""

    def __init__(self, conn, log: list):
        self.conn, self.log = conn, log

    def recv(self):
        self.log.append(self.conn.recv())
        return self.log[-1]

    def fileno(self):  # for multiprocessing.connection.wait
        return self.conn.fileno()

    def close(self):
        self.conn.close()


def test_actors_seed_apart_and_a_resume_goes_on_from_its_update(tmp_path, monkeypatch):
    """--seed's help: env i of actor a starts on seed + a * num_envs + i (+ the step a resume
    starts from), so no two actors play the same episodes. A resume goes on from the saved update:
    the version the actors' weights carry (so the rollouts' versions and the policy lag do not
    restart from 0), and the target network, learner and reward scaler the first update sees."""
    log = tmp_path / "seeds.log"
    monkeypatch.setenv("SEED_LOG", str(log))  # RecordsSeeds writes there in each actor
    monkeypatch.setenv("SEED_PROCESSES", "3")  # and waits until all 3 actors have
    monkeypatch.setenv("SEED_ENVS", "2")  # seeded both their envs
    args = small_args(appo, tmp_path, env_id="toy_envs:RecordsSeeds-v0", num_actors=3, seed=5)
    args = dataclasses.replace(args, tau=0.5)  # a target that trails the learner
    appo.train(dataclasses.replace(args, num_steps=16, total_timesteps=64))  # 2 updates of 32
    blocks = sorted(sorted(seeds) for seeds in toy_envs.seeding_processes(str(log)).values())
    assert blocks == [[5, 6], [7, 8], [9, 10]]
    path = only_checkpoint(tmp_path)
    ckpt = appo.load_checkpoint(path)
    log.unlink()
    received, seen = [], {}
    start_actors, receive_rollouts = appo.start_actors, appo.receive_rollouts

    def keeping_start_actors(agent, global_step, args):
        actors = start_actors(agent, global_step, args)
        seen["version"] = actors["version"].value
        actors["conns"] = [KeepingPipe(conn, received) for conn in actors["conns"]]
        return actors

    def first_receive(agent, target_agent, reward_rms, *rest):
        if "agent" not in seen:
            seen.update(agent=copy.deepcopy(agent.state_dict()))
            seen.update(target_agent=copy.deepcopy(target_agent.state_dict()))
            seen.update(reward_rms=copy.deepcopy(reward_rms.state_dict()))
        return receive_rollouts(agent, target_agent, reward_rms, *rest)

    monkeypatch.setattr(appo, "start_actors", keeping_start_actors)
    monkeypatch.setattr(appo, "receive_rollouts", first_receive)
    appo.train(appo.parse_args(["--resume", path, "--total-timesteps", "128"]))
    blocks = sorted(sorted(seeds) for seeds in toy_envs.seeding_processes(str(log)).values())
    assert blocks == [[69, 70], [71, 72], [73, 74]]  # + step 64
    assert seen["version"] == 2 and min(rollout["version"] for rollout in received) >= 2
    for name in ("agent", "target_agent", "reward_rms"):
        for key, value in ckpt[name].items():
            assert torch.equal(seen[name][key], value), (name, key)


def test_resume_with_another_batch_size_stops_at_total_timesteps(tmp_path, capsys):
    # 3 updates of 3 envs x 64 steps = 576 steps, then resume with batches of 2 x 64 = 128 steps.
    args = short_args(
        tmp_path,
        **ONE_ACTOR_ON_THE_TOY_ENV,
        total_timesteps=576,
        num_envs=3,
        num_steps=64,
        num_minibatches=2,
        update_epochs=1,
    )
    assert appo.train(args)["global_step"] == 576
    ckpt_path = str(next(tmp_path.glob("*/checkpoint.pt")))
    # (906 - 576) // 128 = 2 whole batches fit: 576 + 2 * 128 = 832. Continuing from the saved
    # update 3 to update 906 // 128 = 7 would run 4 more, to 1088.
    resumed = appo.train(
        appo.parse_args(
            [
                *flags(resume=ckpt_path, num_envs=2, total_timesteps=906, eval_episodes=1),
            ]
        )
    )
    assert resumed["global_step"] == 832
    assert "ETA -" not in capsys.readouterr().out


def test_options_train_with_finite_losses(tmp_path):
    """Adaptive LR, value clipping, a soft and rarer target update, rho-bar != c-bar, 3 actors,
    and the base's options: Muon, target KL, asymmetric clip, bounds loss and L2C2."""
    metrics = appo.train(
        short_args(
            tmp_path,
            total_timesteps=1536,
            num_actors=3,
            desired_kl=0.01,
            lr_decrease_factor=2.0,
            clip_vloss=True,
            tau=0.5,
            target_update_freq=2,
            clip_rho=2.0,
            clip_c=0.5,
            optimizer="muon",
            target_kl=0.05,
            clip_low=0.2,
            clip_high=0.28,
            bounds_loss_coef=0.1,
            l2c2_coef=0.1,
        )
    )
    assert all(np.isfinite(v) for v in metrics.values())
    assert metrics["losses/l2c2_loss"] > 0 and "losses/bounds_loss" in metrics


def test_each_update_starts_at_ratio_one_to_the_target_network(tmp_path, monkeypatch):
    """IMPACT's ratio is pi_theta / pi_target. With tau = 1 and a target update after every update
    (the defaults) the target is a copy of the learner when an update starts, so its first
    minibatch has log-ratio 0 however old the data are; a ratio to the behaviour policy would
    not."""
    ppo_loss, vtrace_advantages = appo.ppo_loss, appo.vtrace_advantages
    logratios, behaviour_gaps = [], []

    def spy_vtrace_advantages(behaviour_logprobs, target_logprobs, *rest):
        behaviour_gaps.append((target_logprobs - behaviour_logprobs).abs().max().item())
        return vtrace_advantages(behaviour_logprobs, target_logprobs, *rest)

    def spy_ppo_loss(agent, mb, args):
        loss, terms, new = ppo_loss(agent, mb, args)
        logratios.append(new["logratio"].abs().max().item())
        return loss, terms, new

    monkeypatch.setattr(appo, "vtrace_advantages", spy_vtrace_advantages)
    monkeypatch.setattr(appo, "ppo_loss", spy_ppo_loss)
    # 4 updates of 64 steps, 2 minibatches x 2 epochs each; one actor, so from the second update on
    # the data are one update old. A larger learning rate makes the policies of two updates differ.
    args = short_args(
        tmp_path,
        **ONE_ACTOR_ON_THE_TOY_ENV,
        total_timesteps=256,
        num_steps=32,
        num_minibatches=2,
        update_epochs=2,
        learning_rate=3e-3,
    )
    appo.train(args)
    first_minibatches = logratios[::4]
    assert len(logratios) == 16 and max(first_minibatches) < 1e-5
    # Not vacuous: the behaviour policy of some update differs from its target network.
    assert max(behaviour_gaps) > 1e-4


def test_each_update_normalizes_with_the_statistics_its_batch_was_valued_with(
    tmp_path, monkeypatch
):
    """The learner values its batch (and takes the target's log-probs) with the normalizer as it
    stands; the update must normalize the batch with those same statistics, which take the batch
    in only after it (as ppo_continuous.py's). So each update's first minibatch gives its values
    back, and the normalizer holds the earlier batches only. Hopper's observations move the
    statistics (a constant observation, as the toy env's, would hide a normalizer updated early)."""
    ppo_loss, seen = appo.ppo_loss, []

    def spy_ppo_loss(agent, mb, args):
        loss, terms, new = ppo_loss(agent, mb, args)
        gap = (new["values"] - mb["values"]).abs().max().item()
        seen.append((agent.obs_rms.count.item(), gap))
        return loss, terms, new

    monkeypatch.setattr(appo, "ppo_loss", spy_ppo_loss)
    # 3 updates of one rollout of 2 envs x 64 steps, each of 2 minibatches.
    appo.train(small_args(appo, tmp_path, env_id=ENV_ID, total_timesteps=384))
    counts, gaps = zip(*seen[::2])
    assert counts == pytest.approx([1e-4, 1e-4 + 128, 1e-4 + 256], abs=1e-9)
    assert max(gaps) < 1e-5


def test_truncated_episodes_bootstrap_from_final_obs(tmp_path):
    value = trained_value(appo, short_args(tmp_path, total_timesteps=20_000, **BOOTSTRAP_RUN))
    assert value == pytest.approx(10.0, rel=0.15)  # see BOOTSTRAP_RUN


@pytest.mark.parametrize(
    "env_id, bootstrapped",
    [
        ("toy_envs:AlwaysTruncates-v0", True),  # cut off by the limit: the episode would go on
        ("toy_envs:TerminatesAtTimeLimit-v0", False),  # terminal at the limit: nothing comes after
    ],
)
def test_only_truncated_and_not_terminated_steps_are_bootstrapped(env_id, bootstrapped):
    # Step the env for one 5-step episode, as an actor does, to get its flags at the last step.
    envs = appo.make_envs(env_id, 2)
    envs.reset(seed=0)
    for _ in range(5):
        _, reward, terminated, truncated, info = envs.step(np.zeros((2, 1), np.float32))
    # TimeLimit reports truncated=True at the limit even on a terminal step.
    assert truncated.all() and terminated.all() != bootstrapped
    final_obs = torch.as_tensor(np.stack(info["final_obs"]))[None]  # [T=1, N=2, obs]
    envs.close()
    # A critic that says 10 everywhere.
    agent = appo.Agent(1, 1, appo.Args(norm_obs=False))
    with torch.no_grad():
        agent.critic[-1].weight.zero_()
        agent.critic[-1].bias.fill_(10.0)
    rewards = torch.as_tensor(reward, dtype=torch.float32)[None]
    appo.add_truncation_bootstrap(
        agent,
        rewards,
        final_obs,
        torch.as_tensor(terminated)[None],
        torch.as_tensor(truncated)[None],
        gamma=0.9,
    )
    expected = 1.0 + 0.9 * 10.0 if bootstrapped else 1.0
    torch.testing.assert_close(rewards, torch.full((1, 2), expected))


# ---------------------------------------------------------------------------------------------
# Lifecycle: a dead actor, Ctrl-C, nothing left running
# ---------------------------------------------------------------------------------------------
def start_script(tmp_path, env_id=ENV_ID):
    """Run the script in a subprocess until its second update; return it and its actor pids."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "appo_vtrace.py",
            *flags(env_id=env_id, num_actors=2, num_envs=2, num_rollouts=2, num_steps=64),
            *flags(num_minibatches=2, update_epochs=2, log_dir=tmp_path),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "tests")},  # toy_envs
    )
    deadline, pids = time.time() + 120, None
    while True:
        line = proc.stdout.readline()
        assert time.time() < deadline and proc.poll() is None, "the script did not start"
        if "actor pids" in line:
            pids = [int(p) for p in re.search(r"actor pids ([\d ]+);", line).group(1).split()]
        if "iter 2/" in line:
            return proc, pids


def running(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def assert_all_gone(pids):
    deadline = time.time() + 3
    while any(running(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(running(p) for p in pids), "an actor outlived the learner"


def kill_childless(pid: int):
    """SIGKILL the process at a moment when it has no child. An actor that is still making its
    first MuJoCo env runs glfw's library probe (a 36-line `python -c` script) as its child, and
    the probe, orphaned by the kill, fails to print its answer: a BrokenPipeError traceback in the
    learner's stderr that no code of ours wrote. A stopped process cannot start a child."""
    deadline = time.time() + 30
    while True:
        os.kill(pid, signal.SIGSTOP)
        children = []
        for task in glob.glob(f"/proc/{pid}/task/*/children"):
            with open(task) as f:
                children += f.read().split()
        if not children:
            os.kill(pid, signal.SIGKILL)
            return
        os.kill(pid, signal.SIGCONT)
        assert time.time() < deadline, f"process {pid} kept a child for 30 s"
        time.sleep(0.01)


def test_killed_actor_stops_the_learner_promptly(tmp_path):
    proc, pids = start_script(tmp_path)
    kill_childless(pids[1])
    killed_at = time.time()
    _, err = proc.communicate(timeout=30)
    assert time.time() - killed_at < 10
    assert proc.returncode != 0
    assert "Traceback" not in err, err
    assert (
        f"error: actor 1 (pid {pids[1]}) died (killed by SIGKILL)" in err.strip().splitlines()[-1]
    )
    assert_all_gone(pids)
    ckpt = appo.load_checkpoint(
        str(next(tmp_path.glob("*/checkpoint.pt")))
    )  # what was learned is kept
    assert ckpt["iteration"] >= 2


def test_ctrl_c_saves_a_checkpoint_and_stops_every_actor(tmp_path):
    proc, pids = start_script(tmp_path)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "resume with: python appo_vtrace.py --resume " in err and "Traceback" not in err, err
    assert_all_gone(pids)
    ckpt = appo.load_checkpoint(str(next(tmp_path.glob("*/checkpoint.pt"))))
    assert ckpt["global_step"] >= 256 and ckpt["global_step"] % 256 == 0


def test_stopped_actors_take_their_children_with_them(tmp_path):
    """An actor can be running a child when the learner stops it (glfw's library probe, while its
    first MuJoCo env loads): ended with the actor, the child prints nothing and is gone. Orphaned,
    it would wait on its stdin, then print an EOFError traceback into the learner's stderr."""
    proc, _ = start_script(tmp_path, env_id="toy_envs:StartsAChild-v0")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)  # until every process writing to stderr is gone
    assert proc.returncode == 130 and "Traceback" not in err, err
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        with contextlib.suppress(OSError), open(path, "rb") as f:
            assert StartsAChild.CHILD_MARK.encode() not in f.read(), f"{path}: left running"


# ---------------------------------------------------------------------------------------------
# Bad input: one line, exit code != 0, no traceback
# ---------------------------------------------------------------------------------------------
def test_checkpoint_of_another_script_or_env_is_refused(short_run, tmp_path):
    _, ckpt_path = short_run
    foreign = tmp_path / "foreign.pt"
    torch.save({**torch.load(ckpt_path, weights_only=False), "script": "ppo_continuous"}, foreign)
    with pytest.raises(SystemExit, match="not written by appo_vtrace.py"):
        appo.train(appo.Args(eval_checkpoint=str(foreign)))
    with pytest.raises(SystemExit, match=f"holds a policy for {ENV_ID}"):
        appo.train(appo.Args(resume=str(ckpt_path), env_id="Ant-v5"))


def test_command_line_error_has_no_traceback():
    result = run_script("appo_vtrace", "--env-id", "NoSuchEnv-v0")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("error: unknown env id")


# ---------------------------------------------------------------------------------------------
# Learning
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_learns_inverted_pendulum(tmp_path):
    # Two actors, so that each batch mixes rollouts of different ages; 8 minibatches instead of 32
    # (a quarter of the gradient steps), as the learner is the bottleneck on 2 cores.
    fields = dict(env_id="InvertedPendulum-v5", total_timesteps=40_960, num_actors=2, num_envs=4)
    metrics = appo.train(
        appo.Args(num_rollouts=2, num_minibatches=8, log_dir=str(tmp_path), **fields)
    )
    assert metrics["eval/episodic_return"] >= 900
