"""ppo_teacher_student.py: the teacher stays frozen, DAgger acts with the student, the student's
history is right on real runs, fine-tuning trains what distillation froze, the distillation loss
matches a reference, a whole run round-trips (checkpoint, --resume, --eval-checkpoint, export),
and a student learns InvertedPendulum from a teacher trained here."""

import csv
import dataclasses
import importlib
import json
import os
import sys

import numpy as np
import pytest
import torch
import toy_envs
from conftest import (
    ROOT,
    TOY_ENV,
    RecordingWriter,
    only_checkpoint,
    read_events,
    run_script,
    small_args,
    toy_args,
)

import ppo_continuous as pc
import ppo_teacher_student as ts

sys.path.insert(0, os.path.join(ROOT, "tools"))  # the tool is a script, not a package
import export_onnx  # noqa: E402


@pytest.fixture(scope="module")
def hopper_teacher(tmp_path_factory):
    """A ppo_continuous.py checkpoint of two iterations on Hopper-v5 (11 obs, 3 actions)."""
    log_dir = tmp_path_factory.mktemp("hopper_teacher")
    pc.train(small_args(pc, log_dir, env_id="Hopper-v5"))
    return only_checkpoint(log_dir)


@pytest.fixture(scope="module")
def toy_teacher(tmp_path_factory):
    """A ppo_continuous.py checkpoint of one iteration on CountsSteps (1 obs, 1 action)."""
    log_dir = tmp_path_factory.mktemp("toy_teacher")
    pc.train(toy_args(pc, log_dir))
    return only_checkpoint(log_dir)


def hopper_args(teacher: str, log_dir, **overrides):
    """2 envs x 64 steps of Hopper-v5, 2 iterations of distillation (one epoch of 2 minibatches)."""
    fields = dict(env_id="Hopper-v5", teacher=teacher, history=2)
    return small_args(ts, log_dir, **{**fields, **overrides})


def student_and_teacher(teacher_path: str, env_id: str, history: int, **overrides):
    """The envs, the student and the frozen teacher as train() makes them."""
    args = ts.Args(env_id=env_id, teacher=teacher_path, history=history, num_envs=2, **overrides)
    envs = ts.make_student_envs(env_id, args.num_envs, "gymnasium", history, args.student_obs)
    obs_dim = envs.single_observation_space.shape[0]
    act_dim = envs.single_action_space.shape[0]
    student = ts.Agent(obs_dim, act_dim, args, envs.actor_dim)
    teacher = ts.Teacher(ts.load_checkpoint(teacher_path, ts.TEACHER_SCRIPTS), student, args)
    return args, envs, student, teacher


class RecordingTeacher(ts.Teacher):
    """The Teacher that train() makes, kept in `made` for the test to inspect afterwards."""

    made: list = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        RecordingTeacher.made.append(self)


# ---------------------------------------------------------------------------------------------
# The teacher
# ---------------------------------------------------------------------------------------------
def test_the_teacher_stays_bit_identical_through_both_stages(hopper_teacher, tmp_path, monkeypatch):
    RecordingTeacher.made.clear()
    monkeypatch.setattr(ts, "Teacher", RecordingTeacher)
    # 4 iterations: 2 of distillation, 2 of fine-tuning; the student's normalizer moves.
    ts.train(hopper_args(hopper_teacher, tmp_path, total_timesteps=512, finetune_timesteps=256))
    (teacher,) = RecordingTeacher.made
    saved = torch.load(hopper_teacher, weights_only=True)["agent"]
    state = teacher.agent.state_dict()
    assert sorted(state) == sorted(saved)
    for key, value in saved.items():  # parameters and the normalizer's buffers, bit for bit
        assert torch.equal(state[key], value), key
    assert {"obs_rms.mean", "obs_rms.var", "obs_rms.count"} <= set(state)
    assert not any(p.requires_grad for p in teacher.parameters())
    assert not teacher.agent.training


def test_a_teacher_of_another_env_or_script_is_one_line(hopper_teacher, toy_teacher, tmp_path):
    args = hopper_args(toy_teacher, tmp_path)
    with pytest.raises(SystemExit, match="^error: --teacher .* was trained on toy_envs:Counts"):
        ts.train(args)
    with pytest.raises(SystemExit, match="^error: --teacher is required"):
        ts.train(hopper_args(None, tmp_path))
    for name in ("history", "finetune_timesteps", "dagger_rollouts", "beta_timesteps"):
        with pytest.raises(SystemExit, match=f"^error: --{name.replace('_', '-')} must be >= 0"):
            ts.train(hopper_args(hopper_teacher, tmp_path, **{name: -1}))
    ts.train(hopper_args(hopper_teacher, tmp_path / "student"))
    student = only_checkpoint(tmp_path / "student")
    with pytest.raises(SystemExit, match="not written by ppo_continuous.py or ppo_symaug.py"):
        ts.train(hopper_args(student, tmp_path))


def test_a_ppo_symaug_teacher_on_walker2d(tmp_path):
    """ppo_symaug.py's checkpoints are teachers too; Walker2d's student reads its 8 positions."""
    symaug = importlib.import_module("ppo_symaug")
    symaug.train(small_args(symaug, tmp_path / "teacher"))
    teacher = only_checkpoint(tmp_path / "teacher")
    metrics = ts.train(small_args(ts, tmp_path, teacher=teacher, history=1))
    assert np.isfinite(metrics["distill/action_mse"])
    ckpt = ts.load_checkpoint(only_checkpoint(tmp_path))
    assert ckpt["env_id"] == "Walker2d-v5" and ckpt["actor_dim"] == 8 + 1 * (8 + 6)


# ---------------------------------------------------------------------------------------------
# DAgger
# ---------------------------------------------------------------------------------------------
def test_dagger_acts_with_the_student_and_the_teacher_labels(toy_teacher):
    torch.manual_seed(0)
    args, envs, student, teacher = student_and_teacher(toy_teacher, TOY_ENV, 2, num_steps=10)
    with torch.no_grad():
        student.actor_logstd.fill_(-20.0)  # the student acts (almost) with its mean
        student.actor_mean[-1].bias.fill_(-0.3)
        teacher.agent.actor_mean[-1].bias.fill_(1.5)  # far from it, and beyond the bound 1
    toy_envs.CountsSteps.log.clear()
    carry = ts.start_episodes(envs, 0, args, torch.device("cpu"))
    rollout = ts.collect_rollout(
        student, teacher, False, envs, ts.RunningMeanStd(), carry, 0, RecordingWriter(), args
    )
    envs.close()
    # The env got the student's actions (the envs step in turn: env 0, env 1 at every t).
    sent = torch.tensor(np.array([action for _, action in toy_envs.CountsSteps.log]))
    obs = rollout["obs"].flatten(0, 1)
    with torch.no_grad():
        students, teachers = student.mean_action(obs), teacher.mean_action(obs)
    assert torch.allclose(sent, students, atol=1e-5)
    assert not torch.allclose(sent, teachers, atol=0.1)
    # Every visited state is labelled with the teacher's deterministic action, clipped as the env
    # clips it: beyond 1, any mean acts as 1.
    assert (teachers > 1).all()
    assert torch.equal(rollout["labels"].flatten(0, 1), torch.ones_like(teachers))


def test_the_distillation_loss_matches_a_reference():
    torch.manual_seed(3)
    args = ts.Args(actor_layers=(8, 8))
    student = ts.Agent(9, 2, args, actor_dim=5)
    student.obs_rms.update(torch.randn(50, 9) * 3 + 1)
    obs, labels = torch.randn(16, 9) * 4, torch.rand(16, 2) * 2 - 1
    loss = ts.distill_loss(student, obs, labels).item()
    # numpy: normalize and clip every column, the MLP on the student's 5 columns, the MSE.
    mean, var = student.obs_rms.mean.numpy(), student.obs_rms.var.numpy()
    x = np.clip((obs.numpy() - mean) / np.sqrt(var + 1e-8), -10, 10)[:, :5]
    layers = [m for m in student.actor_mean if isinstance(m, torch.nn.Linear)]
    for i, layer in enumerate(layers):
        x = x @ layer.weight.detach().numpy().T + layer.bias.detach().numpy()
        x = np.tanh(x) if i < len(layers) - 1 else x
    reference = np.mean((x - labels.numpy()) ** 2)
    assert loss == pytest.approx(reference, rel=1e-5)


def test_distillation_trains_the_actor_s_mean_only(hopper_teacher):
    torch.manual_seed(0)
    args, envs, student, teacher = student_and_teacher(hopper_teacher, "Hopper-v5", 2)
    args = ts.Args(**{**vars(args), "num_minibatches": 2, "update_epochs": 2})
    assert not ts.set_stage(student, teacher, 0, 512, args)
    before = {k: v.clone() for k, v in student.state_dict().items()}
    batch = {"obs": torch.randn(64, student.obs_rms.mean.shape[0]), "labels": torch.rand(64, 3)}
    optimizers = ts.make_optimizers(student, args)
    metrics = ts.distill_update(student, optimizers, batch, args)
    assert np.isfinite(metrics["losses/distill_loss"])
    for key, value in student.state_dict().items():
        moved = not torch.equal(value, before[key])
        assert moved == key.startswith("actor_mean."), key
    envs.close()


def test_who_acts_the_student_sampled_or_its_mean_and_the_beta_mixture(hopper_teacher):
    torch.manual_seed(0)
    args, envs, student, teacher = student_and_teacher(hopper_teacher, "Hopper-v5", 2)
    envs.close()
    obs = torch.randn(4000, student.obs_rms.mean.shape[0])
    labels = torch.rand(4000, 3) * 2 - 1
    with torch.no_grad():
        mean = student.mean_action(obs)
        # The default: the student's sample, with its own std.
        noise = ts.behaviour(student, labels, obs, False, 0, args) - mean
        assert noise.std().item() == pytest.approx(student.actor_logstd.exp().mean().item(), 0.05)
        quiet = dataclasses.replace(args, student_noise=False)
        assert torch.equal(ts.behaviour(student, labels, obs, False, 0, quiet), mean)
        # The beta-mixture: whole actions of the teacher, in a share falling from 1 to 0.
        mixed = dataclasses.replace(quiet, beta_timesteps=1000)
        for step, share in ((0, 1.0), (250, 0.75), (500, 0.5), (1000, 0.0), (5000, 0.0)):
            acted = ts.behaviour(student, labels, obs, False, step, mixed)
            teachers = (acted == labels).all(-1)
            assert torch.equal(teachers | (acted == mean).all(-1), torch.ones(4000, dtype=bool))
            assert teachers.float().mean().item() == pytest.approx(share, abs=0.03), step
        # Fine-tuning is PPO: the student's sample whatever the distillation's flags.
        finetuning = ts.behaviour(student, labels, obs, True, 0, mixed)
        assert not (finetuning == labels).all(-1).any()
        assert (finetuning - mean).std().item() == pytest.approx(noise.std().item(), 0.05)


def test_the_beta_mixture_counts_the_rollout_s_global_steps(toy_teacher):
    """2 envs x 10 steps of CountsSteps: the teacher acts in every env at step 0 and never from
    --beta-timesteps on, in the rollout that starts there."""
    torch.manual_seed(0)
    args, envs, student, teacher = student_and_teacher(
        toy_teacher, TOY_ENV, 2, num_steps=10, beta_timesteps=20, student_noise=False
    )
    with torch.no_grad():
        student.actor_mean[-1].bias.fill_(-0.3)
        teacher.agent.actor_mean[-1].bias.fill_(0.6)  # far from the student's
    carry = ts.start_episodes(envs, 0, args, torch.device("cpu"))
    sent = []
    for step in (0, 20):
        toy_envs.CountsSteps.log.clear()
        rollout = ts.collect_rollout(
            student, teacher, False, envs, ts.RunningMeanStd(), carry, step, RecordingWriter(),
            args,
        )  # fmt: skip
        actions = torch.tensor(np.array([action for _, action in toy_envs.CountsSteps.log]))
        sent.append((actions, rollout["labels"].flatten(0, 1)))
    envs.close()
    (first, first_labels), (second, second_labels) = sent
    assert torch.allclose(first[:2], first_labels[:2], atol=1e-6)  # step 0: beta 1
    assert not torch.isclose(second, second_labels, atol=0.1).any()  # from step 20: the student


def test_dagger_keeps_the_latest_rollouts_in_order_with_their_labels():
    def rollout(i):
        return {"obs": torch.full((6, 4), float(i)), "labels": torch.full((6, 2), -float(i))}

    for kept, expected in ((2, [2, 2, 3, 3]), (0, [1, 1, 2, 2, 3, 3]), (1, [3, 3])):
        args, progress = ts.Args(dagger_rollouts=kept), {}
        for i in (1, 2, 3):
            data = ts.dagger_data(progress, rollout(i), args)
        rows = torch.tensor(expected, dtype=torch.float32).repeat_interleave(3)
        assert torch.equal(data["obs"][:, 0], rows), kept
        assert torch.equal(data["labels"], -data["obs"][:, :2]), kept
        assert ("dagger" in progress) == (kept != 1), kept  # what a checkpoint holds
    # A resumed run's kept rollouts are its start; the default keeps nothing, a resumed one's too.
    resumed = {"dagger": rollout(5)}
    data = ts.dagger_data(resumed, rollout(6), ts.Args(dagger_rollouts=3))
    assert torch.equal(data["obs"][:, 0], torch.tensor([5.0] * 6 + [6.0] * 6))
    assert ts.dagger_data(resumed, rollout(7), ts.Args())["obs"].shape[0] == 6
    assert "dagger" not in resumed


def test_distillation_draws_a_rollout_s_worth_from_all_the_kept_states(hopper_teacher, monkeypatch):
    torch.manual_seed(0)
    args, envs, student, teacher = student_and_teacher(hopper_teacher, "Hopper-v5", 2)
    envs.close()
    args = dataclasses.replace(args, num_steps=8, num_minibatches=2, update_epochs=3)
    data = {"obs": torch.randn(48, student.obs_rms.mean.shape[0]), "labels": torch.rand(48, 3)}
    data["obs"][:, 0] = torch.arange(48.0)  # the row's index
    drawn, distill_loss = [], ts.distill_loss

    def recording_loss(agent, obs, labels):
        drawn.append(obs[:, 0].long())
        assert torch.equal(labels, data["labels"][obs[:, 0].long()])  # each state its label
        return distill_loss(agent, obs, labels)

    monkeypatch.setattr(ts, "distill_loss", recording_loss)
    ts.distill_update(student, ts.make_optimizers(student, args), data, args)
    # 3 epochs of 2 minibatches of 8: a rollout's 16 states each epoch, all distinct, drawn from
    # the 48 kept (the older rollouts' too).
    assert [len(rows) for rows in drawn] == [8] * 6
    for epoch in range(3):
        assert len(set(torch.cat(drawn[2 * epoch : 2 * epoch + 2]).tolist())) == 16
    assert {row // 16 for row in torch.cat(drawn).tolist()} == {0, 1, 2}  # every rollout kept


# ---------------------------------------------------------------------------------------------
# The history
# ---------------------------------------------------------------------------------------------
def test_history_on_a_real_run_through_truncations():
    """CountsSteps: obs = step of the episode, truncated after 5 steps. Columns: [now | the 2
    previous obs, newest first | the 2 previous actions, newest first | the env's obs]."""
    envs = ts.make_student_envs(TOY_ENV, 2, "gymnasium", 2)
    assert envs.actor_dim == 5 and envs.single_observation_space.shape == (6,)
    obs, _ = envs.reset(seed=0)
    np.testing.assert_array_equal(obs, [[0, 0, 0, 0, 0, 0]] * 2)
    sent = []  # the actions of the episode so far
    for t in range(1, 13):
        actions = np.array([[0.1 * t], [-0.1 * t]])
        obs, _, _, truncated, info = envs.step(actions)
        sent.insert(0, actions[:, 0])  # newest first
        step = t % 5
        if step == 0:  # truncated: the final obs keeps the ended episode's history
            assert truncated.all()
            for i in range(2):
                expected = [5, 4, 3, sent[0][i], sent[1][i], 5]
                np.testing.assert_allclose(info["final_obs"][i], expected)
            sent = []  # the new episode's first obs, and a fresh history
            np.testing.assert_array_equal(obs, [[0, 0, 0, 0, 0, 0]] * 2)
            continue
        assert not truncated.any()
        past_obs = [max(step - 1, 0), max(step - 2, 0)]  # before the episode: its first obs
        for i in range(2):
            past_actions = [sent[j][i] if j < len(sent) else 0.0 for j in range(2)]
            expected = [step, *past_obs, *past_actions, step]
            np.testing.assert_allclose(obs[i], expected, atol=1e-12)
    envs.close()


def test_history_on_a_real_run_through_terminations(hopper_teacher):
    """Hopper-v5 with a random student: its episodes end by falling. At every step the history
    is the last step's shifted by one (the oldest entry gone), or, after an episode's end, the
    new first obs repeated and no actions."""
    torch.manual_seed(1)
    args, envs, student, teacher = student_and_teacher(hopper_teacher, "Hopper-v5", 3)
    args = ts.Args(**{**vars(args), "num_steps": 150})
    carry = ts.start_episodes(envs, 0, args, torch.device("cpu"))
    rollout = ts.collect_rollout(
        student, teacher, False, envs, ts.RunningMeanStd(), carry, 0, RecordingWriter(), args
    )
    envs.close()
    assert rollout["terminated"].any()
    d, a, k = 5, 3, 3  # Hopper-v5's 5 positions, 3 actions, --history 3
    obs = rollout["obs"].numpy()
    now, past_obs = obs[..., :d], obs[..., d : d + k * d].reshape(*obs.shape[:2], k, d)
    past_actions = obs[..., d + k * d : d + k * (d + a)].reshape(*obs.shape[:2], k, a)
    np.testing.assert_array_equal(now, obs[..., -11:-6])  # the positions of the env's obs
    sent = np.clip(rollout["actions"].numpy(), -1, 1)  # Hopper's bounds are [-1, 1]
    dones = rollout["dones"].numpy().astype(bool)
    # The run's start (a reset): the first obs repeated (Hopper's are not 0), no actions.
    assert (now[0] != 0).any()
    np.testing.assert_array_equal(past_obs[0], np.repeat(now[0][:, None], k, 1))
    np.testing.assert_array_equal(past_actions[0], 0.0)
    for t in range(1, args.num_steps):
        for i in range(2):
            if dones[t - 1, i]:
                np.testing.assert_array_equal(past_obs[t, i], np.repeat(now[t, i][None], k, 0))
                np.testing.assert_array_equal(past_actions[t, i], 0.0)
                continue
            np.testing.assert_array_equal(past_obs[t, i, 0], now[t - 1, i])
            np.testing.assert_array_equal(past_obs[t, i, 1:], past_obs[t - 1, i, :-1])
            np.testing.assert_allclose(past_actions[t, i, 0], sent[t - 1, i], atol=1e-6)
            np.testing.assert_array_equal(past_actions[t, i, 1:], past_actions[t - 1, i, :-1])


def test_each_evaluation_wave_starts_the_history_from_its_first_obs(hopper_teacher):
    """17 episodes: two waves (16 envs, then 1), each on envs of its own, reset on its seeds. The
    student's first input of each wave has that wave's first obs repeated as its past, and no
    actions; the episodes are Hopper's own (its first obs are not 0)."""
    args, envs, student, _ = student_and_teacher(hopper_teacher, "Hopper-v5", 3)
    envs.close()
    inputs, mean_action = [], student.mean_action
    student.mean_action = lambda obs: inputs.append(obs) or mean_action(obs)
    returns, _ = ts.evaluate(student, dataclasses.replace(args, eval_episodes=17), None, "waves")
    assert len(returns) == 17
    starts = [inputs[0]] + [now for last, now in zip(inputs, inputs[1:]) if len(now) < len(last)]
    assert [len(obs) for obs in starts] == [16, 1]
    d, a, k = 5, 3, 3
    for obs in starts:
        assert (obs[:, :d] != 0).any()
        assert torch.equal(obs[:, d : d + k * d], obs[:, :d].repeat(1, k))
        assert (obs[:, d + k * d : d + k * (d + a)] == 0).all()


# ---------------------------------------------------------------------------------------------
# Fine-tuning
# ---------------------------------------------------------------------------------------------
def test_fine_tuning_trains_what_distillation_froze(hopper_teacher, tmp_path, monkeypatch):
    seen = []  # per update: requires_grad, and the parameters before and after it

    def recording_update(agent, optimizers, loss_fn, batch, lr_scale, args):
        update = {"requires_grad": {n: p.requires_grad for n, p in agent.named_parameters()}}
        update["before"] = {n: p.detach().clone() for n, p in agent.named_parameters()}
        result = ppo_update(agent, optimizers, loss_fn, batch, lr_scale, args)
        update["after"] = {n: p.detach().clone() for n, p in agent.named_parameters()}
        seen.append(update)
        return result

    ppo_update = ts.ppo_update
    monkeypatch.setattr(ts, "ppo_update", recording_update)
    # One iteration of distillation, then two of fine-tuning.
    ts.train(hopper_args(hopper_teacher, tmp_path, total_timesteps=384, finetune_timesteps=256))
    first, second = seen
    assert all(first["requires_grad"].values()), first["requires_grad"]
    for name in first["before"]:  # the actor's mean, its log-std and the critic: all move
        assert not torch.equal(first["before"][name], first["after"][name]), name
    teacher = torch.load(hopper_teacher, weights_only=True)["agent"]
    critic = [name for name in teacher if name.startswith("critic.")]
    for name in critic:  # the critic started as the teacher's, once: then it goes on learning
        assert torch.equal(first["before"][name], teacher[name]), name
        assert torch.equal(second["before"][name], first["after"][name]), name
    # The critic's columns of the normalizer are the teacher's, means and variances, and stayed
    # frozen (distillation had given them the statistics of the student's own rollouts).
    saved = torch.load(only_checkpoint(tmp_path), weights_only=True)["agent"]
    for key in ("obs_rms.mean", "obs_rms.var"):
        assert torch.equal(saved[key][-11:], teacher[key]), key


# ---------------------------------------------------------------------------------------------
# A whole run
# ---------------------------------------------------------------------------------------------
def test_a_run_round_trips_checkpoint_resume_eval_and_export(hopper_teacher, tmp_path):
    args = hopper_args(hopper_teacher, tmp_path, total_timesteps=512, finetune_timesteps=256)
    metrics = ts.train(args)
    for tag in ("distill/action_mse", "eval/teacher_return", "eval/episodic_return"):
        assert np.isfinite(metrics[tag]), tag
    for tag in ("losses/policy_loss", "losses/value_loss"):  # the last iteration fine-tuned
        assert np.isfinite(metrics[tag]), tag
    # The teacher's return is its own: what its --eval-checkpoint gives on the same episodes.
    teacher = pc.train(pc.Args(eval_checkpoint=hopper_teacher, eval_episodes=1, seed=args.seed))
    assert metrics["eval/teacher_return"] == pytest.approx(teacher["eval/episodic_return"])
    assert metrics["eval/teacher_return"] != pytest.approx(metrics["eval/episodic_return"])
    (run_dir,) = tmp_path.glob("*")
    events = read_events(run_dir)
    for tag in ("losses/distill_loss", "distill/action_mse", "eval/teacher_return"):
        assert all(np.isfinite(e.value) for e in events.Scalars(tag)), tag
    path = only_checkpoint(tmp_path)
    ckpt = ts.load_checkpoint(path)
    assert ckpt["actor_dim"] == 5 + 2 * (5 + 3) and ckpt["obs_dim"] == ckpt["actor_dim"] + 11
    student = ts.Agent(ckpt["obs_dim"], ckpt["act_dim"], ts.saved_args(ckpt), ckpt["actor_dim"])
    student.load_state_dict(ckpt["agent"])
    returns = np.array([episode["return"] for episode in ts.evaluate(student, args, None, "x")[0]])
    assert returns.mean() == pytest.approx(metrics["eval/episodic_return"])
    done = run_script("ppo_teacher_student", "--eval-checkpoint", path, "--eval-episodes", "1")
    assert done.returncode == 0, done.stderr
    assert f"deterministic return {returns.mean():.1f}" in done.stdout
    # The export reads the student's columns only: its deployable obs and history.
    module, _, policy = export_onnx.load_policy(path)
    assert module is ts
    obs = torch.as_tensor(ts.make_student_envs("Hopper-v5", 1, "gymnasium", 2).reset(0)[0])
    obs = obs.float()
    with torch.no_grad():
        exported = policy(obs[:, : ckpt["actor_dim"]])
        # Hopper's bounds are [-1, 1]: the scaling is the identity, up to rounding.
        assert torch.allclose(exported, student.mean_action(obs).clamp(-1, 1), atol=1e-6)
    resumed = ts.train(ts.Args(**{**vars(args), "resume": path, "total_timesteps": 640}))
    assert resumed["global_step"] == 640
    assert torch.load(path, weights_only=True)["global_step"] == 640


def test_the_onnx_export_checks_against_evaluation(hopper_teacher, tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    ts.train(hopper_args(hopper_teacher, tmp_path))
    path = only_checkpoint(tmp_path)
    done = run_script("tools/export_onnx", path, "--check", "1")
    assert done.returncode == 0, done.stderr
    # The graph takes the student's columns (its obs and history), and its metadata say so.
    model = onnx.load(os.path.join(os.path.dirname(path), "policy.onnx"))
    metadata = {prop.key: json.loads(prop.value) for prop in model.metadata_props}
    width = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    assert metadata["obs_dim"] == width == 5 + 2 * (5 + 3)
    typed = ["--eval-checkpoint", path, "--eval-episodes", "1"]  # in this process
    expected = ts.train(ts.parse_args(typed))["eval/episodic_return"]
    assert f"onnxruntime deterministic return {expected:.1f}" in done.stdout


def test_the_student_s_lines_say_its_teacher_s_return_and_the_action_error(
    hopper_teacher, tmp_path, capsys
):
    """Each progress line and the final evaluation line: the teacher's deterministic return on the
    evaluation's episodes and the mean squared action error of the iteration, as logged."""
    metrics = ts.train(hopper_args(hopper_teacher, tmp_path))
    lines = capsys.readouterr().out.splitlines()
    events = read_events(os.path.dirname(only_checkpoint(tmp_path)))
    teacher = [point.value for point in events.Scalars("eval/teacher_return")]
    mse = [point.value for point in events.Scalars("distill/action_mse")]
    progress = [line for line in lines if line.startswith("iter ")]
    assert len(progress) == len(teacher) == len(mse) == 2
    for line, teacher_return, error in zip(progress, teacher, mse):
        assert f" | teacher {teacher_return:.1f} (eval) | action mse {error:.3g} | SPS " in line
    assert teacher[0] == teacher[1] == pytest.approx(metrics["eval/teacher_return"])
    final = f": {metrics['eval/episodic_return']:.1f} | teacher {teacher[1]:.1f} on the same "
    final += f"episodes, action mse {mse[1]:.3g}; checkpoint: "
    assert lines[-1].startswith("deterministic eval over 1 episode") and final in lines[-1]


def test_the_action_error_is_the_last_rollout_s_per_action_mean(
    hopper_teacher, tmp_path, monkeypatch
):
    """distill/action_mse: the acting student's mean against the teacher's labels, averaged over
    the last rollout's states and the action dimensions (not summed over them)."""
    rollouts, collect_rollout = [], ts.collect_rollout
    monkeypatch.setattr(
        ts, "collect_rollout", lambda *a: rollouts.append(collect_rollout(*a)) or rollouts[-1]
    )
    metrics = ts.train(hopper_args(hopper_teacher, tmp_path))
    last = rollouts[-1]
    expected = ((last["means"] - last["labels"]) ** 2).numpy()
    assert metrics["distill/action_mse"] == pytest.approx(float(np.mean(expected)), rel=1e-6)


def test_a_resume_goes_on_distilling(hopper_teacher, tmp_path):
    ts.train(hopper_args(hopper_teacher, tmp_path))
    path = only_checkpoint(tmp_path)
    first = torch.load(path, weights_only=True)
    ts.train(ts.Args(**{**vars(hopper_args(hopper_teacher, tmp_path)), "resume": path,
                        "total_timesteps": 384}))  # fmt: skip
    resumed = torch.load(path, weights_only=True)
    assert resumed["global_step"] == 384
    for key, value in first["agent"].items():  # the actor's mean learns; the rest stays frozen
        moved = not torch.equal(resumed["agent"][key], value)
        assert moved == (key.startswith("actor_mean.") or key.startswith("obs_rms.")), key
    with pytest.raises(SystemExit, match="^error: --history cannot change on resume"):
        ts.train(ts.Args(**{**vars(hopper_args(hopper_teacher, tmp_path)), "resume": path,
                            "total_timesteps": 512, "history": 3}))  # fmt: skip
    # A student's file that is no run's checkpoint.pt (a committed one): a new run goes on from it.
    committed = tmp_path / "students" / "ppo_teacher_student-Hopper-v5.pt"
    committed.parent.mkdir()
    committed.write_bytes(open(path, "rb").read())
    typed = ["--resume", str(committed), "--total-timesteps", "512"]
    ts.train(ts.parse_args([*typed, "--log-dir", str(tmp_path / "runs")]))
    assert list(committed.parent.iterdir()) == [committed]
    assert committed.read_bytes() == open(path, "rb").read()
    assert ts.load_checkpoint(only_checkpoint(tmp_path / "runs"))["global_step"] == 512


def test_the_control_student_reads_the_teacher_s_whole_obs(hopper_teacher, tmp_path):
    """--student-obs full --history 0: nothing hidden, the student's input is the teacher's. The
    run, --eval-checkpoint and the export all read its saved --student-obs; a resume keeps it."""
    args = hopper_args(hopper_teacher, tmp_path, student_obs="full", history=0)
    metrics = ts.train(args)
    path = only_checkpoint(tmp_path)
    ckpt = ts.load_checkpoint(path)
    assert ckpt["actor_dim"] == 11 and ckpt["obs_dim"] == 11 + 11
    obs = ts.make_student_envs("Hopper-v5", 2, "gymnasium", 0, "full").reset(0)[0]
    assert np.array_equal(obs[:, :11], obs[:, 11:])
    with_history = ts.make_student_envs("Hopper-v5", 1, "gymnasium", 2, "full")
    assert with_history.actor_dim == 11 + 2 * (11 + 3)
    checked = ts.train(ts.Args(eval_checkpoint=path, eval_episodes=1, history=3))
    assert checked["eval/episodic_return"] == pytest.approx(metrics["eval/episodic_return"])
    module, _, policy = export_onnx.load_policy(path)
    output = str(tmp_path / "control.onnx")
    export_onnx.export(policy, ckpt, output)
    returns = export_onnx.check(module, output, "Hopper-v5", 1, 1, "gymnasium", ckpt["args"])
    assert np.mean(returns) == pytest.approx(metrics["eval/episodic_return"], rel=1e-3)
    with pytest.raises(SystemExit, match=r"^error: --student-obs cannot change on resume \(saved"):
        ts.train(dataclasses.replace(args, resume=path, total_timesteps=384, student_obs="hidden"))


def test_a_resume_goes_on_with_the_kept_dagger_rollouts(hopper_teacher, tmp_path):
    args = hopper_args(hopper_teacher, tmp_path, dagger_rollouts=3)
    ts.train(args)
    path = only_checkpoint(tmp_path)
    first = torch.load(path, weights_only=True)["dagger"]
    assert first["obs"].shape[0] == first["labels"].shape[0] == 2 * 128  # 2 rollouts of 128
    ts.train(dataclasses.replace(args, resume=path, total_timesteps=512))
    then = torch.load(path, weights_only=True)["dagger"]
    assert then["obs"].shape[0] == 3 * 128
    assert torch.equal(then["obs"][:128], first["obs"][128:])  # the oldest kept one went on
    assert torch.equal(then["labels"][:128], first["labels"][128:])


def test_a_student_saved_before_student_obs_is_a_hidden_one_everywhere(
    hopper_teacher, tmp_path, capsys
):
    metrics = ts.train(hopper_args(hopper_teacher, tmp_path / "run"))
    ckpt = torch.load(only_checkpoint(tmp_path / "run"), weights_only=True)
    for name in ("student_obs", "dagger_rollouts", "student_noise", "beta_timesteps"):
        del ckpt["args"][name]  # an older version's student
    older = str(tmp_path / "older.pt")
    torch.save(ckpt, older)
    checked = ts.train(ts.Args(eval_checkpoint=older, eval_episodes=1))
    assert checked["eval/episodic_return"] == pytest.approx(metrics["eval/episodic_return"])
    export_onnx.main(export_onnx.Args(checkpoint=older, check=1))
    expected = f"onnxruntime deterministic return {metrics['eval/episodic_return']:.1f}"
    assert expected in capsys.readouterr().out
    typed = ["--resume", older, "--total-timesteps", "384", "--log-dir", str(tmp_path / "runs")]
    assert ts.train(ts.parse_args(typed))["global_step"] == 384


def test_robots_py_makes_a_control_student_s_envs_with_the_whole_obs():
    pytest.importorskip("envpool")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import robots

    for student_obs, width in (("full", 48 + 123), ("hidden", 48)):
        ckpt = {"env_id": "Go1JoystickFlatTerrain-v1", "args": {"history": 0}}
        ckpt["args"]["student_obs"] = student_obs
        envs = robots.make(ts, ckpt, 1)
        assert envs.actor_dim == width, student_obs
        envs.close()


def test_go1_student_reads_state_and_history(tmp_path):
    """EnvPool's Go1: the teacher, an ordinary ppo_continuous.py checkpoint, acts on `state` (48);
    the student reads `state` and its history; the critic reads [state | privileged_state]."""
    pytest.importorskip("envpool")
    fields = dict(env_id="Go1JoystickFlatTerrain-v1", env_backend="envpool")
    pc.train(small_args(pc, tmp_path / "teacher", **fields))
    teacher = only_checkpoint(tmp_path / "teacher")
    metrics = ts.train(small_args(ts, tmp_path, teacher=teacher, history=1, **fields))
    assert np.isfinite(metrics["distill/action_mse"])
    ckpt = ts.load_checkpoint(only_checkpoint(tmp_path))
    assert ckpt["actor_dim"] == 48 + 1 * (48 + 12) and ckpt["obs_dim"] == ckpt["actor_dim"] + 171
    with pytest.raises(SystemExit, match="^error: --finetune-timesteps starts the critic"):
        ts.train(small_args(ts, tmp_path, teacher=teacher, finetune_timesteps=128, **fields))


def test_a_go1_teacher_on_privileged_state_is_distilled_and_fine_tuned(tmp_path):
    """#44's robot setting: the teacher's actor reads [state | privileged_state]
    (ppo_continuous.py --privileged-actor), the student state and its history; its critic then
    reads what the teacher's did, so fine-tuning starts from it."""
    pytest.importorskip("envpool")
    fields = dict(env_id="Go1JoystickFlatTerrain-v1", env_backend="envpool")
    pc.train(small_args(pc, tmp_path / "teacher", privileged_actor=True, **fields))
    teacher = only_checkpoint(tmp_path / "teacher")
    assert pc.load_checkpoint(teacher)["actor_dim"] == 48 + 123
    metrics = ts.train(small_args(ts, tmp_path, teacher=teacher, history=1, **fields,
                                  finetune_timesteps=128))  # fmt: skip
    assert np.isfinite(metrics["distill/action_mse"])
    ckpt = ts.load_checkpoint(only_checkpoint(tmp_path))
    assert ckpt["actor_dim"] == 48 + 1 * (48 + 12) and ckpt["obs_dim"] == ckpt["actor_dim"] + 171


# ---------------------------------------------------------------------------------------------
# Learning
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_student_on_positions_learns_inverted_pendulum_from_its_teacher(tmp_path):
    """The teacher reads InvertedPendulum's positions and velocities, the student its 2 positions
    and their history: it reaches 0.8 of its teacher's deterministic return. The teacher, 40,960
    steps of ppo_continuous.py, is shipped: tests/fixtures/make_teacher.py made it."""
    path = os.path.join(ROOT, "tests", "fixtures", "inverted_pendulum_teacher.pt")
    args = ts.Args(env_id="InvertedPendulum-v5", teacher=path, total_timesteps=20_480)
    args.log_dir = str(tmp_path)
    metrics = ts.train(args)
    print(f"teacher {metrics['eval/teacher_return']:.1f}, student "
          f"{metrics['eval/episodic_return']:.1f}")  # fmt: skip
    assert metrics["eval/episodic_return"] >= 0.8 * metrics["eval/teacher_return"]


def test_the_benchmark_appends_a_row_of_real_runs(hopper_teacher, tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import distill

    output = tmp_path / "distill.csv"  # an older one, of fewer columns
    old = "env_id,seed,teacher_eval_return,student_eval_return,action_mse,distill_steps,"
    output.write_text(old + "scratch_eval_return,scratch_steps\nHopper-v5,1,2.0,1.0,0.1,9,3.0,19\n")
    args = distill.Args(teachers=(hopper_teacher,), seeds=(2,), distill_steps=2048, eval_every=0)
    args = dataclasses.replace(args, eval_episodes=1, log_dir=str(tmp_path / "runs"),
                               output=str(output))  # fmt: skip
    with pytest.raises(SystemExit):  # a misspelled flag of the candidate, before any run
        distill.main(dataclasses.replace(args, variant="--dagger-rolouts 2"))
    assert not (tmp_path / "runs").exists()
    variant = "--student-obs full --history 1 --dagger-rollouts 2"
    distill.main(dataclasses.replace(args, variant=variant))
    with open(output) as file:
        earlier, row = list(csv.DictReader(file))
    assert list(row) == distill.COLUMNS
    kept = ["Hopper-v5", "1", "2.0", "1.0", "0.1", "9", "3.0", "19", "", ""]  # new columns empty
    assert earlier == dict(zip(distill.COLUMNS, kept))
    assert (row["student_obs"], row["variant"]) == ("full", variant)
    with open(tmp_path / "distill_curves.csv") as file:  # the curves and the plot: the variant's
        curves = list(csv.DictReader(file))
    assert curves and {point["variant"] for point in curves} == {row["variant"]}
    plot = "distill-Hopper-v5-student-obs-full-history-1-dagger-rollouts-2.png"
    assert os.listdir(tmp_path / "plots") == [plot]
    assert row["env_id"] == "Hopper-v5" and row["seed"] == "2" and row["distill_steps"] == "2048"
    # The teacher's 256 steps and the student's 2048, in the teacher's batches of 2 envs x 64 steps.
    assert int(row["scratch_steps"]) == 256 + 2048
    for name in ("teacher_eval_return", "student_eval_return", "action_mse", "scratch_eval_return"):
        assert np.isfinite(float(row[name])), name
    # The teacher's column is the teacher's return: its --eval-checkpoint on the student's seed.
    teacher = pc.train(pc.Args(eval_checkpoint=hopper_teacher, eval_episodes=1, seed=2))
    assert float(row["teacher_eval_return"]) == pytest.approx(
        teacher["eval/episodic_return"], abs=0.006
    )
    assert row["teacher_eval_return"] != row["student_eval_return"]
    (student,) = (tmp_path / "runs").glob("*/student/*/checkpoint.pt")
    assert torch.load(student, weights_only=True)["args"]["dagger_rollouts"] == 2
    (scratch,) = (tmp_path / "runs").glob("*/scratch/*/checkpoint.pt")
    ckpt = torch.load(scratch, weights_only=True)
    assert ckpt["actor_dim"] == 11 + 1 * (11 + 3)  # the student's observation and history


def test_compare_walks_the_evaluation_s_episodes_and_the_action_error_along_them(
    hopper_teacher, tmp_path, capsys
):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import distill

    metrics = ts.train(hopper_args(hopper_teacher, tmp_path))
    path = only_checkpoint(tmp_path)
    rows = distill.compare(path, 1)
    # The student's and the teacher's runs are the evaluation's own episodes.
    assert rows["student"]["return"] == pytest.approx(metrics["eval/episodic_return"])
    assert rows["teacher"]["return"] == pytest.approx(metrics["eval/teacher_return"])
    ckpt = ts.load_checkpoint(path)
    args = ts.saved_args(ckpt)
    student = ts.Agent(ckpt["obs_dim"], ckpt["act_dim"], args, ckpt["actor_dim"])
    student.load_state_dict(ckpt["agent"])
    teacher = ts.Teacher(ts.load_checkpoint(hopper_teacher, ts.TEACHER_SCRIPTS), student, args)
    (episode,) = ts.evaluate(student, args, None, "x")[0]
    assert rows["student"]["length"] == episode["length"]
    assert rows["student"]["falls"] == int(episode["fell"])
    assert rows["student"]["per_step"] == pytest.approx(episode["return"] / episode["length"])
    (plain,) = distill.walk(student, teacher, args, 1)  # the error's mean by tenth of it
    tenth = [e for t, e in enumerate(plain["errors"]) if 10 * t < len(plain["errors"])]
    assert rows["student"]["error_by_tenth"][0] == pytest.approx(np.mean(tenth))
    # The error: the two policies' clipped actions on the state the student visits (a student
    # pushed beyond the bounds: the env clips its actions, the error too).
    with torch.no_grad():
        student.actor_mean[-1].bias.add_(3.0)
    (walked,) = distill.walk(student, teacher, args, 1)
    obs = ts.to_tensor(ts.make_student_envs("Hopper-v5", 1, "gymnasium", 2).reset(
        seed=args.seed + ts.EVAL_SEED_OFFSET)[0], "cpu")  # fmt: skip
    with torch.no_grad():
        actions = student.mean_action(obs), teacher.mean_action(obs)
    first = (actions[0].clamp(-1, 1) - actions[1].clamp(-1, 1)) ** 2
    assert walked["errors"][0] == pytest.approx(first.mean().item(), rel=1e-5)
    assert max(distill.walk(student, student, args, 1)[0]["errors"]) == 0.0
    assert "student: " in capsys.readouterr().out
    with pytest.raises(SystemExit, match="^error: give --teachers"):
        distill.main(distill.Args())


def test_the_benchmark_trains_a_robot_s_student_and_scratch_run_with_its_teacher_s_recipe(tmp_path):
    """A Go1 teacher of the robot recipe: the student distils on its EnvPool backend, as wide as
    the teacher's actor; the scratch run takes the teacher's flags (not the defaults) but reads
    the student's observation, not privileged_state."""
    pytest.importorskip("envpool")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import distill

    fields = dict(env_id="Go1JoystickFlatTerrain-v1", env_backend="envpool", gamma=0.97)
    pc.train(small_args(pc, tmp_path / "teacher", privileged_actor=True, actor_layers=(32,),
                        **fields))  # fmt: skip
    args = distill.Args(teachers=(only_checkpoint(tmp_path / "teacher"),), seeds=(1,))
    distill.main(dataclasses.replace(args, distill_steps=2048, eval_every=0, eval_episodes=1,
                                     log_dir=str(tmp_path / "runs"),
                                     output=str(tmp_path / "distill.csv")))  # fmt: skip
    (student,) = (tmp_path / "runs").glob("*/student/*/checkpoint.pt")
    assert torch.load(student, weights_only=True)["args"]["actor_layers"] == (32,)
    (scratch,) = (tmp_path / "runs").glob("*/scratch/*/checkpoint.pt")
    ckpt = torch.load(scratch, weights_only=True)
    assert ckpt["actor_dim"] == 48 + 3 * (48 + 12) and not ckpt["args"]["privileged_actor"]
    saved = {name: ckpt["args"][name] for name in ("env_backend", "gamma", "num_envs")}
    assert saved == {"env_backend": "envpool", "gamma": 0.97, "num_envs": 2}
    assert ckpt["args"]["actor_layers"] == (32,) and ckpt["global_step"] == 256 + 2048
