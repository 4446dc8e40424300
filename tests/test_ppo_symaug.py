"""Tests of ppo_symaug.py beyond the shared PPO-family tests: the mirror maps against the simulator,
the minibatch augmentation, the mirror loss and the symmetry error.

The simulator is the judge: a state and its mirror image, written here from the joint geometry (not
from the script's observation tables), are set in two copies of an env; the script's observation map
must relate their observations, then and after stepping both with actions a and mirror_act(a).
"""

import gymnasium as gym
import mujoco
import numpy as np
import pytest
import torch
from conftest import run_script, small_args

import ppo_continuous
import ppo_symaug as ps

S_Y = np.diag([1.0, -1.0, 1.0])  # mirror by the plane y = 0 (left <-> right)
S_X = np.diag([-1.0, 1.0, 1.0])  # mirror by the plane x = 0 (the cart-poles move along x)
LIMBS = ("hip_x", "hip_z", "hip_y", "knee", "shoulder1", "shoulder2", "elbow")
# The reflection and the joint partners (by name, from the XML); unnamed joints are their own
# partner.
MIRRORS = {
    "InvertedPendulum-v5": (S_X, {}),
    "InvertedDoublePendulum-v5": (S_X, {}),
    "Swimmer-v5": (S_Y, {}),
    # Both legs lie in the plane y = 0: the reflection is the identity and the symmetry swaps them.
    "Walker2d-v5": (
        S_Y,
        {
            "thigh_joint": "thigh_left_joint",
            "leg_joint": "leg_left_joint",
            "foot_joint": "foot_left_joint",
        },
    ),
    "Ant-v5": (
        S_Y,
        {"hip_1": "hip_4", "ankle_1": "ankle_4", "hip_2": "hip_3", "ankle_2": "ankle_3"},
    ),
    "Humanoid-v5": (S_Y, {f"right_{j}": f"left_{j}" for j in LIMBS}),
}
ENV_IDS = list(MIRRORS)


def make_symmetric(env_id: str, model: mujoco.MjModel):
    """Remove the small asymmetries of the shipped models (found while preparing the issue), so the
    mirror check can be strict (1e-8) instead of absorbing them into a loose tolerance."""
    if env_id == "InvertedPendulum-v5":
        # The pole is fromto="0 0 0 0.001 0 0.6": tilted by 1.7e-3 rad, its centre of mass off the
        # hinge's vertical. Make it upright (inertia frame and geom frame).
        pole, geom = model.body("pole").id, model.geom("cpole").id
        model.body_ipos[pole, 0] = model.geom_pos[geom, 0] = 0.0
        model.body_iquat[pole] = model.geom_quat[geom] = [1.0, 0.0, 0.0, 0.0]
    if env_id == "InvertedDoublePendulum-v5":
        model.opt.gravity[0] = 0.0  # the XML has gravity="1e-5 0 -9.81"
    if env_id == "Humanoid-v5":
        # right_hip_y has armature 0.008 (left: 0.01); left_knee has stiffness 1 (right: 0).
        model.dof_armature[model.joint("right_hip_y").dofadr[0]] = model.dof_armature[
            model.joint("left_hip_y").dofadr[0]
        ]
        model.jnt_stiffness[model.joint("left_knee").id] = model.jnt_stiffness[
            model.joint("right_knee").id
        ]
        # dof_invweight0 (constraint softness) depends on armature
        mujoco.mj_setConst(model, mujoco.MjData(model))
        # PGS stops after 50 sweeps over the contacts in list order, and the mirror lists the left
        # foot's contacts where the right foot's were: the unconverged result differs by ~1e-3
        # within 10 steps. Solved to convergence, the mirrored contact forces agree to ~1e-11.
        model.opt.iterations, model.opt.tolerance = 1000, 0.0


def mirror_state(
    model: mujoco.MjModel,
    qpos: np.ndarray,
    qvel: np.ndarray,
    reflection: np.ndarray,
    partners: dict,
):
    """qpos, qvel of the mirror image, derived from the joint geometry at the reference pose.

    Under a reflection S a hinge of axis a turns about an axial vector, mirrored to -S a: if the
    partner's axis is s * S a (s = +-1), the partner's angle is -s times this joint's angle; a slide
    along s * S a moves s times as far. A free joint's position is mirrored as S p, its quaternion
    (w, v) as (w, -S v), its linear velocity as S v and its (local) angular velocity as -S w."""
    partners = {**partners, **{b: a for a, b in partners.items()}}
    ref = mujoco.MjData(model)
    mujoco.mj_kinematics(model, ref)
    new_qpos, new_qvel = qpos.copy(), qvel.copy()
    for j in range(model.njnt):
        name = model.joint(j).name
        p = model.joint(partners.get(name, name)).id
        qa, qb, va, vb = (
            model.jnt_qposadr[j],
            model.jnt_qposadr[p],
            model.jnt_dofadr[j],
            model.jnt_dofadr[p],
        )
        if model.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE:
            new_qpos[qb : qb + 3] = reflection @ qpos[qa : qa + 3]
            new_qpos[qb + 3], new_qpos[qb + 4 : qb + 7] = (
                qpos[qa + 3],
                -reflection @ qpos[qa + 4 : qa + 7],
            )
            new_qvel[vb : vb + 3], new_qvel[vb + 3 : vb + 6] = (
                reflection @ qvel[va : va + 3],
                -reflection @ qvel[va + 3 : va + 6],
            )
            continue
        np.testing.assert_allclose(
            ref.xanchor[p], reflection @ ref.xanchor[j], atol=1e-12, err_msg=name
        )
        s = ref.xaxis[p] @ reflection @ ref.xaxis[j]
        assert abs(abs(s) - 1.0) < 1e-12, f"{name}: the partner's axis is not +-S times this one's"
        sign = np.sign(s) if model.jnt_type[j] == mujoco.mjtJoint.mjJNT_SLIDE else -np.sign(s)
        new_qpos[qb], new_qvel[vb] = sign * qpos[qa], sign * qvel[va]
    return new_qpos, new_qvel


def t64(x) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.float64)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_mirror_maps_match_the_simulator(env_id):
    mirror_obs, mirror_act = ps.make_mirror_fns(env_id)
    reflection, partners = MIRRORS[env_id]
    env, twin = gym.make(env_id).unwrapped, gym.make(env_id).unwrapped
    for e in (env, twin):
        make_symmetric(env_id, e.model)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    qpos, qvel = env.data.qpos.copy(), env.data.qvel.copy() + rng.normal(0.0, 0.1, env.model.nv)
    for e, state in (
        (env, (qpos, qvel)),
        (twin, mirror_state(env.model, qpos, qvel, reflection, partners)),
    ):
        mujoco.mj_resetData(e.model, e.data)  # also the solver's warm start
        e.set_state(*state)
        mujoco.mj_rnePostConstraint(e.model, e.data)  # cfrc_ext, as after a step
    errors = [np.abs(mirror_obs(t64(env._get_obs())).numpy() - twin._get_obs()).max()]
    contacts = 0
    for _ in range(30):
        action = rng.uniform(env.action_space.low, env.action_space.high)
        obs, reward, terminated, _, _ = env.step(action)
        twin_obs, twin_reward, twin_terminated, _, _ = twin.step(mirror_act(t64(action)).numpy())
        errors.append(np.abs(mirror_obs(t64(obs)).numpy() - twin_obs).max())
        assert twin_reward == pytest.approx(reward, abs=1e-9) and twin_terminated == terminated
        contacts = max(contacts, env.data.ncon)
    print(f"{env_id}: max |mirror_obs(o) - o_mirrored| = {max(errors):.1e}, contacts {contacts}")
    assert max(errors) < 1e-8
    if env_id in ("Walker2d-v5", "Ant-v5", "Humanoid-v5"):
        assert contacts > 0, "the check should include ground contacts"
    env.close()
    twin.close()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_mirror_maps_are_involutions_and_commute_with_action_scaling(env_id):
    mirror_obs, mirror_act = ps.make_mirror_fns(env_id)
    env = gym.make(env_id)
    obs_dim, space = env.observation_space.shape[0], env.action_space
    env.close()
    obs, act = (
        torch.randn(5, obs_dim, dtype=torch.float64),
        torch.randn(5, space.shape[0], dtype=torch.float64),
    )
    assert torch.equal(mirror_obs(mirror_obs(obs)), obs) and torch.equal(
        mirror_act(mirror_act(act)), act
    )
    assert not torch.equal(mirror_obs(obs), obs)
    # The policy acts in [-1, 1], the env in [low, high]: mirroring before or after scale_action
    # must agree, so that mirror_act can be applied to the policy's actions and means.
    a = act.clamp(-1, 1).numpy()
    np.testing.assert_allclose(
        ps.scale_action(mirror_act(t64(a)).numpy(), space),
        mirror_act(t64(ps.scale_action(a, space))).numpy(),
        atol=1e-12,
    )


def test_unsupported_env_is_one_line_error_before_training(tmp_path):
    with pytest.raises(
        SystemExit,
        match=r"^error: no mirror map for Hopper-v5; supported: InvertedPendulum-v5.*Humanoid-v5, ",
    ):
        ps.make_mirror_fns("Hopper-v5")
    with pytest.raises(SystemExit, match="no mirror map for Hopper-v5"):
        ps.train(ps.Args(env_id="Hopper-v5", log_dir=str(tmp_path)))
    assert not list(tmp_path.iterdir()), "no run directory: it failed before training"
    result = run_script("ppo_symaug", "--env-id", "Hopper-v5")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith(
        "error: no mirror map"
    )


def test_augment_minibatch_doubles_and_copies():
    mirror_obs, mirror_act = ps.make_mirror_fns("Walker2d-v5")
    n = 6
    mb = {"obs": torch.randn(n, 17), "actions": torch.randn(n, 6), "means": torch.randn(n, 6)}
    copied = ("logprobs", "advantages", "returns", "values")
    mb.update(zip(copied, torch.randn(4, n)))
    out = ps.augment_minibatch(mb, mirror_obs, mirror_act)
    assert set(out) == {"obs", "actions", *copied}  # what ppo_loss reads
    assert torch.equal(out["obs"], torch.cat([mb["obs"], mirror_obs(mb["obs"])]))
    assert torch.equal(out["actions"], torch.cat([mb["actions"], mirror_act(mb["actions"])]))
    for key in copied:
        assert torch.equal(out[key], torch.cat([mb[key], mb[key]]))
    assert mb["obs"].shape == (n, 17)  # the caller's minibatch is left as it was


def test_ppo_loss_reports_the_original_half_and_adds_the_mirror_loss():
    mirror_obs, mirror_act = ps.make_mirror_fns("Walker2d-v5")
    args = ps.Args(norm_obs=False, mirror_loss_coef=0.0)  # augmentation only
    torch.manual_seed(0)
    agent = ps.Agent(17, 6, args)
    with torch.no_grad():
        agent.actor_mean[-1].weight.mul_(100)  # an actor far from symmetric
    n = 8
    obs, actions = torch.randn(n, 17), torch.randn(n, 6)
    with torch.no_grad():
        old = agent.get_action_and_value(obs, actions)
    logprobs = old["logprobs"]
    mb = {"obs": obs, "actions": actions, "logprobs": logprobs, "values": old["values"]}
    mb.update(advantages=torch.randn(n), returns=torch.randn(n), means=old["means"])
    loss, terms, new = ps.ppo_loss(agent, mb, args, mirror_obs, mirror_act)
    assert set(new) == set(old) | {"logratio", "ratio"}
    for key in ("logprobs", "entropy", "values", "logratio", "ratio"):
        assert new[key].shape == (n,), key
    assert new["means"].shape == new["std"].shape == new["actions"].shape == (n, 6)
    assert new["logratio"].abs().max() < 1e-5  # on-policy: the original half reproduces them
    assert terms["approx_kl"].abs() < 1e-6  # the KL statistics are the original half's
    # symmetry_loss is the symmetry error of the minibatch, logged with coefficient 0 too.
    assert terms["symmetry_loss"].item() == pytest.approx(
        ps.symmetry_error(agent, obs, mirror_obs, mirror_act), rel=1e-5
    )
    assert terms["symmetry_loss"].item() > 0
    loss_with, _, _ = ps.ppo_loss(
        agent, mb, ps.Args(norm_obs=False, mirror_loss_coef=2.0), mirror_obs, mirror_act
    )
    assert (loss_with - loss).item() == pytest.approx(2.0 * terms["symmetry_loss"].item(), rel=1e-4)
    # On by default, with weight 1.
    loss_default, _, _ = ps.ppo_loss(agent, mb, ps.Args(norm_obs=False), mirror_obs, mirror_act)
    assert (loss_default - loss).item() == pytest.approx(terms["symmetry_loss"].item(), rel=1e-4)
    # The mirrored half starts off-policy where the actor is not symmetric: its copied old
    # log-probabilities are not pi_old's at the mirrored samples. Its KL and clip fraction say
    # how far.
    with torch.no_grad():
        mirrored = agent.get_action_and_value(mirror_obs(obs), mirror_act(actions))
    mirrored_logprobs = mirrored["logprobs"]
    mirror_logratio = mirrored_logprobs - logprobs
    expected_kl = (mirror_logratio.exp() - 1 - mirror_logratio).mean()
    assert terms["mirror_approx_kl"].item() == pytest.approx(expected_kl.item(), rel=1e-4)
    assert terms["mirror_approx_kl"].item() > 0.01
    outside = (mirror_logratio.exp() - 1).abs() > args.clip_coef
    assert terms["mirror_clipfrac"].item() == pytest.approx(outside.float().mean().item())


def test_the_mirror_loss_s_gradient_flows_through_both_halves():
    """The gradient that --mirror-loss-coef adds to the actor is that of ||mu(M_o s) - M_a mu(s)||^2
    written out here, through mu(s) and mu(M_o s) both; a half cut off the graph (detached) would
    pull the mirrored mean alone toward the other, or the other alone."""
    mirror_obs, mirror_act = ps.make_mirror_fns("Walker2d-v5")
    torch.manual_seed(0)
    agent = ps.Agent(17, 6, ps.Args(norm_obs=False)).double()  # a difference of gradients: exact
    with torch.no_grad():
        agent.actor_mean[-1].weight.mul_(100)  # an actor far from symmetric
    n = 8
    obs, actions = torch.randn(n, 17).double(), torch.randn(n, 6).double()
    with torch.no_grad():
        old = agent.get_action_and_value(obs, actions)
    mb = {"obs": obs, "actions": actions, "logprobs": old["logprobs"], "values": old["values"]}
    mb.update(advantages=torch.randn(n).double(), returns=torch.randn(n).double())
    mb["means"] = old["means"]
    params = agent.actor_parameters()

    def gradient(loss):
        return torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True)

    grads = {}
    for coef in (0.0, 2.0):
        args = ps.Args(norm_obs=False, mirror_loss_coef=coef)
        grads[coef] = gradient(ps.ppo_loss(agent, mb, args, mirror_obs, mirror_act)[0])
    mean, mirrored = agent.actor_mean(obs), agent.actor_mean(mirror_obs(obs))
    expected = gradient(2.0 * ((mirrored - mirror_act(mean)) ** 2).mean())
    one_half = gradient(2.0 * ((mirrored - mirror_act(mean.detach())) ** 2).mean())
    for with_loss, without, want, half in zip(grads[2.0], grads[0.0], expected, one_half):
        if want is None:  # the log-std: no part in the mean
            continue
        torch.testing.assert_close(with_loss - without, want, rtol=1e-9, atol=1e-12)
        assert not torch.allclose(want, half)  # not vacuous: each half adds its own part


def test_policy_loss_gives_the_mirrored_half_the_same_advantage():
    """(M_o s, M_a a) has the advantage of (s, a): the policy loss is PPO's clipped surrogate over
    both halves with the advantages copied (not negated), normalized together, written out here."""
    mirror_obs, mirror_act = ps.make_mirror_fns("Walker2d-v5")
    args = ps.Args(norm_obs=False)
    torch.manual_seed(0)
    agent = ps.Agent(17, 6, args)
    n = 32
    obs, actions = torch.randn(n, 17), torch.randn(n, 6)
    both_obs = torch.cat([obs, mirror_obs(obs)])
    both_actions = torch.cat([actions, mirror_act(actions)])
    with torch.no_grad():
        logprobs = agent.get_action_and_value(obs, actions)["logprobs"]
        both_logprobs = agent.get_action_and_value(both_obs, both_actions)["logprobs"]
    old_logprobs = logprobs + 0.3 * torch.randn(n)  # ratios on both sides of the clip range
    advantages = torch.randn(n)
    zeros = torch.zeros(n)  # returns and old values: the value loss plays no part here
    mb = {"obs": obs, "actions": actions, "logprobs": old_logprobs, "advantages": advantages}
    mb.update(returns=zeros, values=zeros)
    _, terms, _ = ps.ppo_loss(agent, mb, args, mirror_obs, mirror_act)
    ratio = (both_logprobs - torch.cat([old_logprobs, old_logprobs])).exp()
    adv = torch.cat([advantages, advantages])
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    expected = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
    torch.testing.assert_close(terms["policy_loss"], expected)


def test_symmetry_error_is_zero_for_a_symmetric_actor_of_either_script():
    """InvertedPendulum's maps negate everything; a tanh MLP without biases is odd, hence symmetric
    (as initialized: layer_init sets the biases to 0); with biases it is not."""
    mirror_obs, mirror_act = ps.make_mirror_fns("InvertedPendulum-v5")
    obs = torch.randn(64, 4)
    for module in (ps, ppo_continuous):
        agent = module.Agent(4, 1, module.Args(norm_obs=False))
        with torch.no_grad():
            agent.actor_mean[-1].weight.mul_(100)
        assert ps.symmetry_error(agent, obs, mirror_obs, mirror_act) == 0.0
        with torch.no_grad():
            agent.actor_mean[0].bias.fill_(0.5)
        assert ps.symmetry_error(agent, obs, mirror_obs, mirror_act) > 1e-3


def test_short_run_logs_symmetry_and_keeps_the_normalizer_mirror_invariant(tmp_path):
    args = small_args(ps, tmp_path, update_epochs=2)
    metrics = ps.train(args)
    assert np.isfinite(metrics["losses/symmetry_loss"]) and np.isfinite(
        metrics["charts/symmetry_error"]
    )
    ckpt = ps.load_checkpoint(str(next(tmp_path.glob("*/checkpoint.pt"))))
    agent = ps.Agent(17, 6, args)
    agent.load_state_dict(ckpt["agent"])
    mirror_obs, _ = ps.make_mirror_fns("Walker2d-v5")
    rms = agent.obs_rms
    torch.testing.assert_close(mirror_obs(rms.mean), rms.mean, atol=1e-9, rtol=0)
    torch.testing.assert_close(mirror_obs(rms.var).abs(), rms.var, atol=1e-9, rtol=0)
    obs = torch.randn(32, 17) * 3
    torch.testing.assert_close(
        agent.normalize(mirror_obs(obs)), mirror_obs(agent.normalize(obs)), atol=1e-5, rtol=0
    )


# ---------------------------------------------------------------------------------------------
# --symmetry network: the actor mean, log-std and critic symmetric by construction
# ---------------------------------------------------------------------------------------------
def network_agent(env_id: str):
    """A --symmetry network agent for env_id with every weight, bias and log-std drawn at random
    (far from the initialization, as after training), and a normalizer of random statistics made
    mirror-invariant as the script makes them; with env_id's maps and sizes."""
    env = gym.make(env_id)
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    env.close()
    torch.manual_seed(0)
    agent = ps.Agent(obs_dim, act_dim, ps.Args(env_id=env_id, symmetry="network"))
    mirror_obs, mirror_act = ps.make_mirror_fns(env_id)
    with torch.no_grad():
        for parameter in agent.parameters():
            parameter.normal_(0.0, 0.5)
        data = torch.randn(256, obs_dim) * 3.0 + 1.0
        agent.obs_rms.update(torch.cat([data, mirror_obs(data)]))
    return agent, mirror_obs, mirror_act


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_network_mode_is_symmetric_by_construction(env_id):
    """At initialization and with any weights: mu(M_o s) = M_a mu(s) (the symmetry error, a mean
    of squares, at most 1e-10), V(M_o s) = V(s), and pi(M_a a | M_o s) = pi(a | s)."""
    agent, mirror_obs, mirror_act = network_agent(env_id)
    obs_dim, act_dim = agent.obs_rms.mean.shape[0], agent.actor_logstd.shape[0]
    initial = ps.Agent(obs_dim, act_dim, ps.Args(env_id=env_id, symmetry="network"))
    obs = torch.randn(64, obs_dim) * 2.0 + 1.0
    assert ps.symmetry_error(initial, obs, mirror_obs, mirror_act) <= 1e-10
    assert ps.symmetry_error(agent, obs, mirror_obs, mirror_act) <= 1e-10
    actions = torch.randn(64, act_dim)
    with torch.no_grad():
        policy = agent.get_action_and_value(obs, actions)
        mirrored = agent.get_action_and_value(mirror_obs(obs), mirror_act(actions))
    torch.testing.assert_close(mirrored["values"], policy["values"])
    torch.testing.assert_close(mirrored["logprobs"], policy["logprobs"])


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_network_mode_stays_symmetric_through_training(env_id, tmp_path):
    """Two iterations of training (the normalizer fed the mirrored copies): the symmetry error of
    the policy that acts next, on the whole batch, at most 1e-10 on every mirrored env."""
    metrics = ps.train(small_args(ps, tmp_path, env_id=env_id, symmetry="network"))
    assert metrics["charts/symmetry_error"] <= 1e-10
    assert np.isfinite(metrics["losses/policy_loss"])


def test_network_mode_averages_each_network_with_its_mirror_image():
    """The formulas, against f and g (the layers inside the symmetric modules) called directly:
    mu = (f(x) + M_a f(M_o x)) / 2, V = (g(x) + g(M_o x)) / 2 and log-std (p + |M_a| p) / 2."""
    agent, mirror_obs, mirror_act = network_agent("Walker2d-v5")
    f, g = torch.nn.Sequential(*agent.actor_mean), torch.nn.Sequential(*agent.critic)
    x = torch.randn(16, 17)
    p = agent.actor_logstd
    with torch.no_grad():
        torch.testing.assert_close(agent.actor_mean(x), (f(x) + mirror_act(f(mirror_obs(x)))) / 2)
        torch.testing.assert_close(agent.critic(x), (g(x) + g(mirror_obs(x))) / 2)
        permuted = mirror_act(p) * mirror_act(torch.ones_like(p))  # the signs squared away
        torch.testing.assert_close(agent.logstd(), (p + permuted) / 2)
        assert not torch.allclose(agent.actor_mean(x), f(x), atol=1e-3)  # f alone is not it


def test_network_mode_does_not_double_the_minibatch(monkeypatch):
    agent, mirror_obs, mirror_act = network_agent("Walker2d-v5")
    sizes, original = [], agent.get_action_and_value

    def recording(obs, actions=None):
        sizes.append(len(obs))
        return original(obs, actions)

    monkeypatch.setattr(agent, "get_action_and_value", recording)
    obs, actions = torch.randn(16, 17), torch.randn(16, 6)
    with torch.no_grad():
        logprobs = original(obs, actions)["logprobs"]
    mb = {"obs": obs, "actions": actions, "logprobs": logprobs, "advantages": torch.randn(16)}
    mb.update(returns=torch.zeros(16), values=torch.zeros(16), means=torch.zeros(16, 6))
    args = ps.Args(symmetry="network", mirror_loss_coef=5.0)  # ignored: identically zero
    _, terms, new = ps.ppo_loss(agent, mb, args, mirror_obs, mirror_act)
    assert sizes == [16] and len(new["ratio"]) == 16
    assert "symmetry_loss" not in terms and "mirror_approx_kl" not in terms


def test_network_mode_trains_evaluates_as_trained_and_keeps_its_mode_on_resume(tmp_path):
    metrics = ps.train(small_args(ps, tmp_path, symmetry="network", update_epochs=2))
    assert metrics["charts/symmetry_error"] <= 1e-10
    assert all(np.isfinite(v) for k, v in metrics.items() if k != "losses/explained_variance")
    path = str(next(tmp_path.glob("*/checkpoint.pt")))
    evaluated = ps.train(ps.Args(eval_checkpoint=path, eval_episodes=1))  # the run's eval seeds
    assert evaluated["eval/episodic_return"] == metrics["eval/episodic_return"]
    typed = ["--resume", path, "--symmetry", "augment", "--total-timesteps", "384"]
    with pytest.raises(SystemExit) as stopped:
        ps.train(ps.parse_args(typed))
    assert str(stopped.value.code) == "error: --symmetry cannot change on resume (saved: network)"
