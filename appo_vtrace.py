"""Asynchronous PPO with actor processes, V-trace and a target network, in one file (CleanRL style).

ppo_continuous.py alternates: collect a rollout, then learn from it, so one core idles while the
other works. Here actor processes step their environments all the time and send rollouts to the
learner, which trains while they act; the learner therefore trains on data from slightly older
policies (the *policy lag*) and corrects for it:

* V-trace (Espeholt et al. 2018, IMPALA, arXiv:1802.01561, eq. 1) turns the off-policy rollouts
  into value targets v_s and policy-gradient advantages, with truncated importance weights;
* IMPACT (Luo et al. 2020, arXiv:1912.00167) keeps PPO's clipped surrogate, with the ratio taken
  against a slowly moving *target network*, so that several epochs per batch stay safe.

Everything else (truncation bootstrap, in-agent observation normalization, reward scaling,
separate actor/critic clipping, checkpoints, evaluation) is ppo_continuous.py's. Runs are not
bit-reproducible: which actor's rollout arrives first depends on timing.

Run:   python appo_vtrace.py --env-id Hopper-v5
Help:  python appo_vtrace.py --help
"""

import copy
import dataclasses
import gc
import math
import os
import pickle
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Optional

import gymnasium as gym
import numpy as np
import torch
import torch.multiprocessing as mp
import torch.nn as nn
import tyro
from torch.utils.tensorboard import SummaryWriter

SCRIPT_NAME = "appo_vtrace"  # stored in checkpoints so that another script's checkpoint is refused
EVAL_SEED_OFFSET = 10_000  # evaluation episodes use seeds the training envs never see
LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclass
class Args:
    exp_name: str = SCRIPT_NAME
    """name of this experiment (part of the run directory name)"""
    seed: int = 1
    """seed of the experiment (env j of actor i gets seed + i * num_envs + j)"""
    cuda: bool = False
    """train on the GPU (the actors always act on the CPU: the networks are tiny)"""
    threads: int = 1
    """torch CPU threads of the learner (each actor uses 1)"""
    log_dir: str = "runs"
    """runs are written to {log_dir}/{env_id}__{exp_name}__{seed}__{time}"""

    # Actors
    env_id: str = "Hopper-v5"
    """id of a gymnasium environment with a Box action space"""
    total_timesteps: int = 1_000_000
    """total environment steps the learner trains on (over all actors)"""
    num_actors: int = 1
    """actor processes; each steps its own vector env with a copy of the policy (1 + the learner fill 2 cores)"""
    num_envs: int = 8
    """environments in each actor's vector env"""
    num_steps: int = 256
    """steps per environment per rollout; one rollout = num_envs * num_steps steps"""
    num_rollouts: int = 1
    """rollouts per learner update (from whichever actors deliver first); batch = num_rollouts * num_envs * num_steps"""

    # Algorithm
    learning_rate: float = 3e-4
    """learning rate of the actor (Adam), and of the critic unless --critic-learning-rate is given"""
    critic_learning_rate: Optional[float] = None
    """learning rate of the critic; None: the same as --learning-rate"""
    weight_decay: float = 0.0
    """weight decay (L2) of every parameter group of the Adam optimizer"""
    anneal_lr: bool = True
    """decay the learning rates linearly to 0 over training"""
    desired_kl: Optional[float] = None
    """if set, adapt the learning rates to keep the Gaussian KL of each step near this value (rsl_rl rule)"""
    lr_decrease_factor: float = 1.5
    """with --desired-kl: divide the learning rate by this when the KL exceeds 2 * desired_kl (> 1)"""
    lr_increase_factor: float = 1.5
    """with --desired-kl: multiply the learning rate by this when the KL is below desired_kl / 2 (> 1)"""
    gamma: float = 0.99
    """discount factor"""
    clip_rho: float = 1.0
    """V-trace rho-bar: truncation of the importance weights in the TD errors and advantages"""
    clip_c: float = 1.0
    """V-trace c-bar: truncation of the trace coefficients (how far off-policy returns propagate)"""
    tau: float = 1.0
    """soft update of the target network: target <- tau * learner + (1 - tau) * target (1: copy)"""
    target_update_freq: int = 1
    """update the target network every N learner updates"""
    num_minibatches: int = 8
    """minibatches per epoch"""
    update_epochs: int = 10
    """passes over the batch per update"""
    norm_adv: bool = True
    """normalize advantages per minibatch"""
    clip_coef: float = 0.2
    """surrogate clipping epsilon of the ratio pi_theta / pi_target"""
    clip_vloss: bool = False
    """clip the value loss around the values at the start of the update"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """max gradient norm, applied to actor and critic separately"""
    actor_layers: tuple[int, ...] = (64, 64)
    """hidden layer sizes of the actor MLP"""
    critic_layers: tuple[int, ...] = (64, 64)
    """hidden layer sizes of the critic MLP"""
    init_logstd: float = -0.5
    """initial log standard deviation of the Gaussian policy in the [-1, 1] action space (std 0.61:
    less random flailing early on; Andrychowicz et al. 2021 recommend an initial std of about 0.5)"""

    # Normalization
    norm_obs: bool = True
    """normalize observations with a running mean/std kept inside the agent (updated by the learner)"""
    norm_reward: bool = True
    """scale rewards by the running std of the discounted return (in the learner)"""
    clip_obs: float = 10.0
    """clip normalized observations to [-clip_obs, clip_obs]"""
    clip_reward: float = 10.0
    """clip scaled rewards to [-clip_reward, clip_reward]"""

    # Checkpoints and evaluation
    checkpoint_every: int = 50
    """write runs/<run>/checkpoint.pt every N updates (0: only at the end, on Ctrl-C and when an actor dies)"""
    resume: Optional[str] = None
    """continue the run saved in this checkpoint (flags you pass override the saved ones)"""
    eval_checkpoint: Optional[str] = None
    """only evaluate the policy in this checkpoint, then exit"""
    eval_every: int = 0
    """evaluate every N updates and keep the best policy as best.pt (0: off)"""
    eval_episodes: int = 10
    """episodes of the deterministic final evaluation"""
    capture_video: bool = False
    """record the first episode of each evaluation as MP4 under {video_dir}/<run>/ (software rendering is slow)"""
    video_dir: str = "videos"
    """where --capture-video writes its MP4 files"""


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------
def fail(message: str):
    """Bad input: one line on stderr and exit code 1, no traceback (SystemExit)."""
    raise SystemExit(f"error: {message}")


def make_envs(env_id: str, num_envs: int, seed: int) -> gym.vector.VectorEnv:
    """A synchronous vector env that resets a finished sub-env in the same step.

    With SAME_STEP autoreset the observation returned for a finished episode is already the first
    one of the next episode, and the last observation of the finished one is in info["final_obs"]:
    exactly what a truncated episode needs to bootstrap from.
    """
    try:
        envs = gym.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        )
    except gym.error.Error as e:
        fail(f"unknown env id {env_id!r} ({type(e).__name__}: {e})")
    if not isinstance(envs.single_action_space, gym.spaces.Box):
        envs.close()
        fail(f"{env_id} has a {type(envs.single_action_space).__name__} action space; this script needs Box (continuous) actions")
    envs.action_space.seed(seed)
    return envs


def mujoco_warning(message: str):
    """MuJoCo's warnings on stderr, less the one gymnasium's HalfCheetah XML gives for every env."""
    if "settotalmass" not in message:
        print(f"MuJoCo warning: {message}", file=sys.stderr)


def import_mujoco() -> Optional[str]:
    """Import MuJoCo, which loads the MUJOCO_GL renderer at import. If that fails (e.g. MUJOCO_GL=
    osmesa without libosmesa6), import it without rendering, so that training still runs, and
    return why (for the --capture-video warning)."""
    error = None
    try:
        import mujoco
    except ModuleNotFoundError:  # no MuJoCo: other gymnasium envs still work
        return None
    except Exception as e:  # noqa: BLE001 - whatever the GL library raised
        error = f"MUJOCO_GL={os.environ.get('MUJOCO_GL')}: {type(e).__name__}: {e}".splitlines()[0]
        os.environ["MUJOCO_GL"] = "disable"
        import mujoco
    mujoco.set_mju_user_warning(mujoco_warning)
    return error


def scale_action(action: np.ndarray, space: gym.spaces.Box) -> np.ndarray:
    """The policy acts in [-1, 1]; clip there (the Gaussian is unbounded) and map to the env's bounds."""
    action = np.clip(action, -1.0, 1.0)
    return space.low + (action + 1.0) * 0.5 * (space.high - space.low)


# ---------------------------------------------------------------------------------------------
# Networks and normalization
# ---------------------------------------------------------------------------------------------
def merge_moments(count_a, mean_a, var_a, count_b, mean_b, var_b):
    """Combine the (count, mean, population variance) of two data sets (Chan et al. 1979)."""
    count = count_a + count_b
    delta = mean_b - mean_a
    mean = mean_a + delta * count_b / count
    m2 = var_a * count_a + var_b * count_b + delta**2 * count_a * count_b / count
    return count, mean, m2 / count


class RunningMeanStd(nn.Module):
    """Running mean and variance as buffers, so they are part of the state dict (and checkpoints)."""

    def __init__(self, shape=()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor):
        x = x.reshape(-1, *self.mean.shape).to(torch.float64)
        count, mean, var = merge_moments(
            self.count, self.mean, self.var, x.shape[0], x.mean(0), x.var(0, unbiased=False)
        )
        self.count.copy_(count)
        self.mean.copy_(mean)
        self.var.copy_(var)


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int, out_std: float) -> nn.Sequential:
    layers, last = [], in_dim
    for size in hidden:
        layers += [layer_init(nn.Linear(last, size)), nn.Tanh()]
        last = size
    layers.append(layer_init(nn.Linear(last, out_dim), std=out_std))
    return nn.Sequential(*layers)


class Agent(nn.Module):
    """Gaussian actor with a state-independent log-std, a critic, and the observation normalizer."""

    def __init__(self, obs_dim: int, act_dim: int, args: Args):
        super().__init__()
        self.norm_obs, self.clip_obs = args.norm_obs, args.clip_obs
        self.obs_rms = RunningMeanStd((obs_dim,))
        # A small last layer makes the initial mean ~0 for every state (Andrychowicz et al. 2021).
        self.actor_mean = mlp(obs_dim, args.actor_layers, act_dim, out_std=0.01)
        self.actor_logstd = nn.Parameter(torch.full((act_dim,), args.init_logstd))
        self.critic = mlp(obs_dim, args.critic_layers, 1, out_std=1.0)

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        if not self.norm_obs:
            return obs
        std = torch.sqrt(self.obs_rms.var + 1e-8)
        return ((obs - self.obs_rms.mean) / std).clamp(-self.clip_obs, self.clip_obs).to(obs.dtype)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.normalize(obs)).squeeze(-1)

    def get_action_and_value(self, obs: torch.Tensor, action: Optional[torch.Tensor] = None):
        x = self.normalize(obs)
        mean = self.actor_mean(x)
        logstd = self.actor_logstd.expand_as(mean)
        std = logstd.exp()
        if action is None:
            action = torch.normal(mean, std)
        # The diagonal Gaussian's log-density and entropy written out: torch.distributions.Normal gives
        # the same numbers, but building it on every call costs more than these small networks.
        logprob = (-0.5 * ((action - mean) / std) ** 2 - logstd - LOG_SQRT_2PI).sum(-1)
        entropy = (0.5 + LOG_SQRT_2PI + logstd).sum(-1)
        value = self.critic(x).squeeze(-1)
        return action, logprob, entropy, value, mean, std


# ---------------------------------------------------------------------------------------------
# Algorithm
# ---------------------------------------------------------------------------------------------
def vtrace_advantages(behavior_log_probs, target_log_probs, rewards, values, bootstrap_values, dones,
                      gamma: float = 0.99, clip_rho: float = 1.0, clip_c: float = 1.0):
    """V-trace targets and policy-gradient advantages (IMPALA, Espeholt et al. 2018), time-major [T, N].

    values[t] = V(x_t); bootstrap_values[n] = V(x_T) of the state after the last step; dones[t] = 1
    ends the episode after step t (no value beyond it: a truncated step must already carry
    gamma * V(final_obs) in its reward). With rho_t = min(clip_rho, pi/mu), c_i = min(clip_c, pi/mu):

        v_s = V(x_s) + sum_{t>=s} gamma^{t-s} (prod_{i=s}^{t-1} c_i) delta_t,          (eq. 1)
        delta_t = rho_t (r_t + gamma V(x_{t+1}) - V(x_t)),

    computed backwards as v_s - V(x_s) = delta_s + gamma c_s (v_{s+1} - V(x_{s+1})) (Remark 1).
    The advantage of the policy gradient (section 4.2) is rho_t (r_t + gamma v_{t+1} - V(x_t)).
    Returns (vs, advantages).
    """
    ratio = torch.exp(target_log_probs - behavior_log_probs)
    rho, c = ratio.clamp(max=clip_rho), ratio.clamp(max=clip_c)
    discounts = gamma * (1.0 - dones)  # gamma within an episode, 0 across its end
    next_values = torch.cat([values[1:], bootstrap_values[None]])
    deltas = rho * (rewards + discounts * next_values - values)
    vs_minus_v = torch.zeros_like(values)
    acc = torch.zeros_like(bootstrap_values)
    for t in reversed(range(values.shape[0])):
        acc = deltas[t] + discounts[t] * c[t] * acc
        vs_minus_v[t] = acc
    vs = values + vs_minus_v
    next_vs = torch.cat([vs[1:], bootstrap_values[None]])
    return vs, rho * (rewards + discounts * next_vs - values)


def add_truncation_bootstrap(agent: Agent, rewards, final_obs, terminated, truncated, gamma: float):
    """Add gamma * V(final_obs) to the reward of each step cut off by a time limit (in place).

    Time-limit truncation is not a terminal state: the episode would have gone on, so the value
    of its last observation is folded into the reward, and V-trace can end the trace there (the
    next obs already belongs to a new episode; Pardo et al. 2018, "Time Limits in RL").
    Only where truncated and not terminated: gymnasium's TimeLimit also sets truncated=True on a
    step that terminated exactly at the limit, and a terminal state has no value to add."""
    cut = truncated & ~terminated
    if cut.any():
        rewards[cut] += gamma * agent.get_value(final_obs[cut])


def gaussian_kl(mean_old, std_old, mean_new, std_new) -> torch.Tensor:
    """KL(old || new) of diagonal Gaussians, summed over action dims (analytic, as in rsl_rl)."""
    return (
        torch.log(std_new / std_old) + (std_old**2 + (mean_old - mean_new) ** 2) / (2.0 * std_new**2) - 0.5
    ).sum(-1)


def adapt_learning_rate(lr: float, kl: float, desired_kl: float, decrease: float = 1.5, increase: float = 1.5) -> float:
    """rsl_rl's rule: shrink the step when the policy moved too far, grow it when it barely moved."""
    if kl > 2.0 * desired_kl:
        lr = lr / decrease
    elif kl < desired_kl / 2.0:
        lr = lr * increase
    return min(max(lr, 1e-5), 1e-2)


def ppo_loss(agent: Agent, obs, actions, target_logprobs, advantages, returns, old_values, args: Args):
    """IMPACT's clipped surrogate, value loss and entropy of a minibatch.

    The data come from behaviour policies mu of several ages. IMPACT writes the importance weight
    pi_theta / mu as (pi_target / mu) * (pi_theta / pi_target): the first factor, truncated to
    min(clip_rho, pi_target / mu), is already inside the V-trace advantages; the second is the ratio
    that PPO's clipping keeps near 1 (PPO paper eq. 7), so the learner cannot move far from the
    slowly moving target network however stale the data are (IMPACT section 3.1).
    Returns the loss to minimize, the log-ratio and ratio, the policy's mean and std, and a dict of
    the loss terms for logging."""
    _, newlogprob, entropy, newvalue, mean, std = agent.get_action_and_value(obs, actions)
    logratio = newlogprob - target_logprobs
    ratio = logratio.exp()
    if args.norm_adv:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    pg_loss = -torch.min(ratio * advantages, ratio.clamp(1.0 - args.clip_coef, 1.0 + args.clip_coef) * advantages).mean()

    if args.clip_vloss:
        v_clipped = old_values + (newvalue - old_values).clamp(-args.clip_coef, args.clip_coef)
        v_loss = 0.5 * torch.max((newvalue - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean()
    entropy_loss = entropy.mean()
    loss = pg_loss - args.ent_coef * entropy_loss + args.vf_coef * v_loss
    return loss, logratio, ratio, mean, std, {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy_loss}


def make_optimizers(agent: Agent, args: Args) -> list[torch.optim.Optimizer]:
    """Actor and critic in separate parameter groups, each remembering its initial learning rate.
    fused=True: Adam updates all parameters in one kernel; with networks this small the per-op
    overhead of the default implementation is a tenth of the whole update's time."""
    critic_lr = args.learning_rate if args.critic_learning_rate is None else args.critic_learning_rate
    groups = [("actor", [*agent.actor_mean.parameters(), agent.actor_logstd], args.learning_rate),
              ("critic", list(agent.critic.parameters()), critic_lr)]
    param_groups = []
    for name, params, lr in groups:
        param_groups.append({"params": params, "lr": lr, "initial_lr": lr, "name": name,
                             "weight_decay": args.weight_decay})
    return [torch.optim.Adam(param_groups, eps=1e-5, fused=True)]


def set_learning_rate(optimizers, scale: float):
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * scale


@torch.no_grad()
def soft_update(target: Agent, agent: Agent, tau: float):
    """Polyak averaging of the parameters; the normalizer is copied (both must see the same inputs)."""
    for p_target, p in zip(target.parameters(), agent.parameters()):
        p_target.lerp_(p, tau)
    target.obs_rms.load_state_dict(agent.obs_rms.state_dict())


# ---------------------------------------------------------------------------------------------
# Actor process
# ---------------------------------------------------------------------------------------------
def actor_process(actor_id: int, args: Args, obs_dim: int, act_dim: int, shared_state: dict, version, conn,
                  stop, start_step: int, parent_pid: int):
    """Step a vector env with the newest published policy and send rollouts to the learner, forever.

    Before each rollout the actor copies the learner's weights and normalizer statistics from shared
    memory if their version changed. It acts with a frozen copy (the learner changes the shared one
    at any time) and sends everything the learner needs to correct for the policy having aged:
    the behaviour log-probs and means, and the version it acted with.
    """
    torch.set_num_threads(1)  # one core per process: more threads only fight over the same cores
    import_mujoco()  # the settotalmass filter, in this process too
    seed = args.seed + actor_id * args.num_envs
    torch.manual_seed(seed + start_step)
    envs = make_envs(args.env_id, args.num_envs, seed)
    agent = Agent(obs_dim, act_dim, args)
    agent.eval()
    my_version = -1
    T, N = args.num_steps, args.num_envs
    obs, _ = envs.reset(seed=seed + start_step)
    running_return, running_length = np.zeros(N), np.zeros(N, dtype=int)
    send_wait = 0.0
    lock = version.get_lock()  # the learner writes weights and version under the same lock
    try:
        while not stop.value and os.getppid() == parent_pid:
            if not lock.acquire(timeout=1.0):
                continue  # the learner may be gone: look at the loop condition again
            try:
                if version.value != my_version:
                    agent.load_state_dict(shared_state)
                    my_version = version.value
            finally:
                lock.release()
            rollout_start = time.time()
            ro = {"obs": np.zeros((T, N, obs_dim), np.float32), "actions": np.zeros((T, N, act_dim), np.float32),
                  "logprobs": np.zeros((T, N), np.float32), "means": np.zeros((T, N, act_dim), np.float32),
                  "rewards": np.zeros((T, N)), "terminated": np.zeros((T, N), bool), "truncated": np.zeros((T, N), bool),
                  "final_obs": np.zeros((T, N, obs_dim), np.float32)}
            episodes = []
            with torch.no_grad():
                for t in range(T):
                    if stop.value or os.getppid() != parent_pid:  # learner stopping or gone: don't outlive it
                        return
                    ro["obs"][t] = obs
                    action, logprob, _, _, mean, _ = agent.get_action_and_value(torch.as_tensor(obs, dtype=torch.float32))
                    ro["actions"][t], ro["logprobs"][t], ro["means"][t] = action.numpy(), logprob.numpy(), mean.numpy()
                    obs, reward, terminated, truncated, info = envs.step(scale_action(action.numpy(), envs.single_action_space))
                    ro["rewards"][t], ro["terminated"][t], ro["truncated"][t] = reward, terminated, truncated
                    if truncated.any():  # the learner bootstraps these from V(final_obs)
                        idx = np.flatnonzero(truncated)
                        ro["final_obs"][t, idx] = np.stack(info["final_obs"][idx])
                    running_return += reward
                    running_length += 1
                    for i in np.flatnonzero(terminated | truncated):
                        episodes.append((running_return[i], running_length[i]))
                        running_return[i], running_length[i] = 0.0, 0
            # send_wait: how long the previous rollout's send() blocked (the learner had not taken it).
            ro.update(actor=actor_id, version=my_version, next_obs=obs.astype(np.float32),
                      std=agent.actor_logstd.detach().exp().numpy(), episodes=episodes,
                      rollout_time=time.time() - rollout_start, send_wait=send_wait)
            # send() blocks while the pipe is full, i.e. until the learner has taken the previous
            # rollout: this back-pressure is what bounds the policy lag.
            t0 = time.time()
            conn.send(ro)
            send_wait = time.time() - t0
    except (BrokenPipeError, ConnectionResetError, EOFError):
        pass  # the learner closed the pipe: it is stopping
    finally:
        envs.close()


def start_actors(ctx, args: Args, obs_dim: int, act_dim: int, shared_state: dict, version, stop, start_step: int):
    """One process and one pipe per actor.

    A pipe per actor rather than one shared queue: an actor killed halfway through writing a message
    would leave a shared queue's pipe and write lock unusable for all actors (the learner would hang
    reading half a message); a private pipe just reaches EOF, and the learner reports that actor.
    """
    actors, conns = [], []
    # Ctrl-C reaches the whole process group: the actors inherit "ignore SIGINT" and the learner
    # alone decides how to stop them.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for i in range(args.num_actors):
            reader, writer = ctx.Pipe(duplex=False)
            p = ctx.Process(target=actor_process, name=f"actor-{i}", daemon=True,
                            args=(i, args, obs_dim, act_dim, shared_state, version, writer, stop, start_step, os.getpid()))
            p.start()
            writer.close()  # only the actor holds the write end: its death means EOF here
            actors.append(p)
            conns.append(reader)
    finally:
        signal.signal(signal.SIGINT, previous)
    return actors, conns


def stop_actors(actors, conns, stop):
    """Ask every actor to stop, unblock those sending, join them; kill any that does not exit."""
    stop.value = 1
    for conn in conns:
        conn.close()  # an actor blocked in send() gets BrokenPipeError
    deadline = time.time() + 5.0
    for p in actors:
        p.join(timeout=max(0.0, deadline - time.time()))
    for p in actors:
        if p.is_alive():
            p.kill()
            p.join()


def describe_exit(p) -> str:
    code = p.exitcode
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def check_actors(actors):
    """Every actor runs until the learner stops it: one that has exited has died."""
    for i, p in enumerate(actors):
        if p.exitcode is not None:
            fail(f"actor {i} (pid {p.pid}) died ({describe_exit(p)})")


def receive_rollouts(actors, conns, count: int) -> list[dict]:
    """Take `count` rollouts, at most one per actor per pass so that no actor waits behind another.

    Waits on the pipes and on the actors' sentinels, so a dead actor is noticed within a second.
    """
    rollouts = []
    while len(rollouts) < count:
        ready = wait(conns + [p.sentinel for p in actors], timeout=1.0)
        check_actors(actors)
        for p, conn in zip(actors, conns):
            if conn in ready and len(rollouts) < count:
                try:
                    rollouts.append(conn.recv())
                except (EOFError, OSError):  # it died while sending (OSError: halfway through a message)
                    p.join(timeout=1.0)
                    check_actors(actors)
    return rollouts


def publish(agent: Agent, shared_state: dict, version, new_version: int, actors):
    """Copy weights and normalizer statistics to shared memory, then bump the version, under the lock."""
    lock = version.get_lock()
    while not lock.acquire(timeout=1.0):
        check_actors(actors)  # an actor killed while copying would hold the lock forever
    try:
        for k, v in agent.state_dict().items():
            shared_state[k].copy_(v)
        version.value = new_version
    finally:
        lock.release()


# ---------------------------------------------------------------------------------------------
# Checkpoints and evaluation
# ---------------------------------------------------------------------------------------------
def catch_ctrl_c(ctrl_c: threading.Event):
    """Make Ctrl-C set the event ctrl_c; train() checks it once per iteration, then saves and exits.

    Stopping between iterations keeps all state consistent. Python's default KeyboardInterrupt can
    land anywhere, also inside TensorBoard's writer, whose close() then waits forever for its thread.
    A second Ctrl-C interrupts at once. Returns the previous handler (None off the main thread,
    where Python cannot install one)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def on_ctrl_c(signum, frame):
        if ctrl_c.is_set():
            raise KeyboardInterrupt
        ctrl_c.set()
        os.write(sys.stderr.fileno(), b"\nCtrl-C: stopping after this iteration (press again to stop at once)\n")

    return signal.signal(signal.SIGINT, on_ctrl_c)


def rng_states() -> dict:
    """The random generators' states as tensors and plain Python values (no pickled objects)."""
    np_state = np.random.get_state()
    numpy_state = [np_state[0], np_state[1].tolist(), np_state[2], np_state[3], np_state[4]]
    return {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}


def set_rng_states(states: dict):
    random.setstate(states["python"])
    name, key, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((name, np.array(key, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(states["torch"])


def save_checkpoint(path: str, state: dict):
    """Write atomically: a crash while saving never leaves a truncated checkpoint behind."""
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str) -> dict:
    """A checkpoint is data: weights_only=True unpickles only tensors and plain Python values, so a
    crafted file cannot run code (a full unpickler runs whatever the file asks for)."""
    if not os.path.isfile(path):
        fail(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        fail(f"refusing {path}: it holds objects other than tensors and plain values")
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same clear message
        fail(f"cannot read checkpoint {path}: {e}".splitlines()[0])
    if not isinstance(ckpt, dict) or ckpt.get("script") != SCRIPT_NAME:
        fail(f"{path} was not written by {SCRIPT_NAME}.py (script: {ckpt.get('script') if isinstance(ckpt, dict) else '?'})")
    return ckpt


def check_spaces(ckpt: dict, env_id: str, obs_dim: int, act_dim: int):
    if (ckpt["obs_dim"], ckpt["act_dim"]) != (obs_dim, act_dim):
        fail(f"the checkpoint holds a policy for {ckpt['env_id']} (obs {ckpt['obs_dim']}, actions {ckpt['act_dim']}); "
             f"{env_id} has obs {obs_dim}, actions {act_dim}")


def render_kwargs(env_id: str, video: bool) -> dict:
    if not video:
        return {}
    # MuJoCo renders on the CPU here (no GPU): a small frame keeps a 1000-step video at about a minute.
    size = {"width": 320, "height": 240} if "mujoco" in str(gym.spec(env_id).entry_point) else {}
    return {"render_mode": "rgb_array", **size}


def rendering_error(env_id: str) -> Optional[str]:
    """Render one frame offscreen; return why that failed, or None if it works."""
    error = None
    # A renderer that fails half-built fails again in its __del__, which Python would print.
    previous_hook = sys.unraisablehook
    sys.unraisablehook = ignore_unraisable
    try:
        import imageio_ffmpeg  # noqa: F401 - the MP4 writer, checked now rather than after training

        env = gym.make(env_id, **render_kwargs(env_id, True))
        env.reset(seed=0)
        if env.render() is None:
            error = "the env rendered no frame"
        env.close()
    except Exception as e:  # noqa: BLE001 - any failure means: no video, say why, keep training
        error = f"{type(e).__name__}: {e}".splitlines()[0]
    env = None
    gc.collect()
    sys.unraisablehook = previous_hook
    return error


def ignore_unraisable(unraisable):
    pass


@torch.no_grad()
def evaluate(agent: Agent, env_id: str, episodes: int, seed: int, device: torch.device,
             video_path: Optional[str] = None) -> list[float]:
    """Run `episodes` episodes with the deterministic (mean) action, one per sub-env, in parallel;
    with video_path, also record the first one as an MP4."""
    envs = gym.make_vec(env_id, num_envs=episodes, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
                        **render_kwargs(env_id, video_path is not None))
    obs, _ = envs.reset(seed=seed)
    frames = [envs.envs[0].render()] if video_path else []
    returns, finished = np.zeros(episodes), np.zeros(episodes, dtype=bool)
    while not finished.all():
        mean = agent.actor_mean(agent.normalize(torch.as_tensor(obs, dtype=torch.float32, device=device)))
        obs, reward, terminated, truncated, _ = envs.step(scale_action(mean.cpu().numpy(), envs.single_action_space))
        done = terminated | truncated
        if video_path and not (finished[0] or done[0]):  # once done, env 0 shows the next episode
            frames.append(envs.envs[0].render())
        returns += reward * ~finished
        finished |= done
    if video_path:
        import imageio

        os.makedirs(os.path.dirname(video_path), exist_ok=True)
        fps = envs.envs[0].metadata.get("render_fps", 30)
        imageio.mimsave(video_path, frames, fps=fps)
    envs.close()
    return returns.tolist()


def evaluate_checkpoint(args: Args) -> dict[str, float]:
    ckpt = load_checkpoint(args.eval_checkpoint)
    agent = Agent(ckpt["obs_dim"], ckpt["act_dim"], saved_args(ckpt))
    agent.load_state_dict(ckpt["agent"])
    returns = evaluate(agent, ckpt["env_id"], args.eval_episodes, args.seed + EVAL_SEED_OFFSET, torch.device("cpu"))
    print(f"{ckpt['env_id']}: deterministic return {np.mean(returns):.1f} ± {np.std(returns):.1f} over {len(returns)} episodes")
    return {"eval/episodic_return": float(np.mean(returns))}


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def check_args(args: Args):
    for name in ("total_timesteps", "num_actors", "num_envs", "num_steps", "num_rollouts", "num_minibatches",
                 "update_epochs", "eval_episodes", "threads", "target_update_freq"):
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    batch_size = args.num_rollouts * args.num_envs * args.num_steps
    if batch_size % args.num_minibatches:
        fail(f"batch size num_rollouts * num_envs * num_steps = {batch_size} is not divisible by --num-minibatches {args.num_minibatches}")
    if args.learning_rate <= 0 or (args.critic_learning_rate is not None and args.critic_learning_rate <= 0):
        fail("learning rates must be positive")
    if args.desired_kl is not None and args.desired_kl <= 0:
        fail(f"--desired-kl must be positive, got {args.desired_kl}")
    for name in ("lr_decrease_factor", "lr_increase_factor"):
        if not getattr(args, name) > 1.0:  # a factor <= 1 would turn the rule around
            fail(f"--{name.replace('_', '-')} must be > 1, got {getattr(args, name)}")
    if not 0.0 <= args.gamma <= 1.0:
        fail("--gamma must lie in [0, 1]")
    if not 0.0 < args.tau <= 1.0:
        fail(f"--tau must lie in (0, 1], got {args.tau}")
    if args.clip_rho <= 0 or args.clip_c <= 0:
        fail("--clip-rho and --clip-c must be positive")
    if args.cuda and not torch.cuda.is_available():
        fail("--cuda is set (typed, or saved in the resumed run) but torch sees no CUDA device")


def saved_args(ckpt: dict) -> Args:
    """The settings a checkpoint was trained with (fields this version lacks are dropped)."""
    names = [field.name for field in dataclasses.fields(Args)]
    return Args(**{name: value for name, value in ckpt["args"].items() if name in names})


def parse_args(argv: Optional[list[str]] = None) -> Args:
    """The command line. With --resume it is parsed a second time with the saved run's settings as
    the defaults, so every flag the user typed wins (even one set back to its default)."""
    args = tyro.cli(Args, args=argv)
    if args.resume is None:
        return args
    return tyro.cli(Args, args=argv, default=saved_args(load_checkpoint(args.resume)))


def train(args: Args) -> dict[str, float]:
    """Train with exactly these settings; with args.resume, continue that checkpoint's run (use
    parse_args to start from the saved settings)."""
    if args.capture_video and not os.environ.get("DISPLAY"):
        os.environ.setdefault("MUJOCO_GL", "egl")  # no screen: render offscreen (read at import)
    gl_error = import_mujoco()
    if args.eval_checkpoint is not None:
        return evaluate_checkpoint(args)
    ckpt = None
    if args.resume is not None:
        ckpt = load_checkpoint(args.resume)
    check_args(args)
    rollout_size = args.num_envs * args.num_steps
    batch_size = args.num_rollouts * rollout_size
    minibatch_size = batch_size // args.num_minibatches
    global_step = 0 if ckpt is None else ckpt["global_step"]
    # Whole batches only, never past --total-timesteps. Iterations count batches of the current
    # size, so a resume with another batch size goes on from the saved step.
    start_iteration = global_step // batch_size + 1
    num_iterations = start_iteration - 1 + (args.total_timesteps - global_step) // batch_size
    if num_iterations < start_iteration:
        fail(f"no whole batch of {batch_size} steps (rollouts x envs x steps) fits between step "
             f"{global_step} and --total-timesteps {args.total_timesteps}")

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.cuda else "cpu")

    probe = make_envs(args.env_id, 1, args.seed)  # bad env ids fail here, before any actor starts
    obs_dim = int(np.prod(probe.single_observation_space.shape))
    act_dim = int(np.prod(probe.single_action_space.shape))
    probe.close()
    agent = Agent(obs_dim, act_dim, args).to(device)
    target_agent = copy.deepcopy(agent)
    optimizers = make_optimizers(agent, args)
    reward_rms = RunningMeanStd()  # of the discounted return, for reward scaling
    # Per actor (its rollouts arrive in order); the envs start fresh episodes on resume.
    discounted_return = np.zeros((args.num_actors, args.num_envs))
    if ckpt is not None:
        check_spaces(ckpt, args.env_id, obs_dim, act_dim)
        agent.load_state_dict(ckpt["agent"])
        target_agent.load_state_dict(ckpt["target_agent"])
        for opt, state in zip(optimizers, ckpt["optimizers"]):
            opt.load_state_dict(state)
        reward_rms.load_state_dict(ckpt["reward_rms"])
        set_rng_states(ckpt["rng"])
        run_dir = os.path.dirname(os.path.abspath(args.resume))
        changed = [f"{k}={v}" for k, v in dataclasses.asdict(args).items()
                   if k != "resume" and ckpt["args"].get(k) != v]
        changed_text = ", ".join(changed) or "none"
        print(f"resuming {args.resume} at step {global_step}; changed: {changed_text}")
    else:
        run_dir = os.path.join(args.log_dir, f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}")
    os.makedirs(run_dir, exist_ok=True)
    writer = SummaryWriter(run_dir)
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in vars(args).items()))
    actor_params = [*agent.actor_mean.parameters(), agent.actor_logstd]
    critic_params = list(agent.critic.parameters())
    lr_scale = ckpt["lr_scale"] if ckpt is not None else 1.0
    best_eval = ckpt["best_eval"] if ckpt is not None else -math.inf

    def checkpoint_state(iteration: int) -> dict:
        return {"script": SCRIPT_NAME, "env_id": args.env_id, "obs_dim": obs_dim, "act_dim": act_dim,
                "args": dataclasses.asdict(args), "agent": agent.state_dict(), "target_agent": target_agent.state_dict(),
                "optimizers": [opt.state_dict() for opt in optimizers], "reward_rms": reward_rms.state_dict(),
                "global_step": global_step, "iteration": iteration, "lr_scale": lr_scale,
                "best_eval": best_eval, "rng": rng_states()}

    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
    video_error = None
    if args.capture_video:
        video_error = gl_error or rendering_error(args.env_id)
    if video_error:
        print(f"warning: --capture-video: cannot render {args.env_id} offscreen ({video_error}); without a screen set "
              "MUJOCO_GL=egl (Debian: apt-get install libegl1 libgl1-mesa-dri) or MUJOCO_GL=osmesa (libosmesa6). "
              "Training continues without video.", file=sys.stderr)

    def video_path() -> Optional[str]:
        if not args.capture_video or video_error:
            return None
        return os.path.join(args.video_dir, os.path.basename(run_dir), f"eval_step{global_step}.mp4")

    # The learner publishes weights + normalizer statistics here after every update; `version`
    # counts updates, so learner version - behaviour version = policy lag in updates.
    shared_state = {k: v.detach().cpu().clone().share_memory_() for k, v in agent.state_dict().items()}
    ctx = mp.get_context("spawn")  # fork would copy the learner's threads and locks in whatever state they are
    version = ctx.Value("q", start_iteration - 1)
    # A lock-free flag, not an Event: an actor killed inside Event.is_set() would hold its lock forever.
    stop = ctx.RawValue("b", 0)
    actors, conns = start_actors(ctx, args, obs_dim, act_dim, shared_state, version, stop, global_step)
    print(f"{args.env_id}: updates {start_iteration}-{num_iterations} of {batch_size} steps "
          f"({args.num_rollouts} rollouts of {args.num_envs} envs x {args.num_steps}), "
          f"minibatch {minibatch_size}; actor pids "
          f"{' '.join(str(p.pid) for p in actors)}; logging to {run_dir}", flush=True)

    episode_returns, episode_lengths = [], []
    metrics: dict[str, float] = {}
    start_time, start_step = time.time(), global_step
    end_step = global_step + (num_iterations - start_iteration + 1) * batch_size
    if end_step != args.total_timesteps:
        print(f"note: training to step {end_step}: --total-timesteps {args.total_timesteps} is not "
              f"reached in whole batches of {batch_size}")
    saved_step = None if ckpt is None else global_step  # the step checkpoint.pt holds
    iteration = start_iteration - 1
    ctrl_c = threading.Event()
    previous_sigint = catch_ctrl_c(ctrl_c)
    try:
        for iteration in range(start_iteration, num_iterations + 1):
            # An actor's death is noticed while the state is that of a whole update: before this
            # update's rollouts arrive (done: iteration - 1), or while publishing its result.
            done_iteration, done_step = iteration - 1, global_step
            if ctrl_c.is_set():  # Ctrl-C: stop between iterations, where all state is consistent
                save_checkpoint(checkpoint_path, checkpoint_state(iteration - 1))
                writer.close()
                print(f"\ninterrupted at step {global_step}; "
                      f"resume with --resume {checkpoint_path}", file=sys.stderr)
                raise SystemExit(130)
            if args.anneal_lr and args.desired_kl is None:
                lr_scale = 1.0 - (iteration - 1.0) / num_iterations
            set_learning_rate(optimizers, lr_scale)

            # --- Receive rollouts from whichever actors are ready. ---
            wait_start = time.time()
            rollouts = receive_rollouts(actors, conns, args.num_rollouts)
            learner_wait = time.time() - wait_start
            global_step += batch_size

            # Batch along the env axis: [T, num_rollouts * num_envs]. Rewards are scaled per actor,
            # whose rollouts arrive in order, so each env's discounted return continues correctly.
            discounted = np.zeros((args.num_steps, len(rollouts) * args.num_envs))
            for k, ro in enumerate(rollouts):
                dr = discounted_return[ro["actor"]]
                for t in range(args.num_steps):
                    dr = dr * args.gamma + ro["rewards"][t]
                    discounted[t, k * args.num_envs:(k + 1) * args.num_envs] = dr
                    dr = np.where(ro["terminated"][t] | ro["truncated"][t], 0.0, dr)
                discounted_return[ro["actor"]] = dr
                for ret, length in ro["episodes"]:
                    episode_returns.append(ret)
                    episode_lengths.append(length)
                    writer.add_scalar("charts/episodic_return", ret, global_step)
                    writer.add_scalar("charts/episodic_length", length, global_step)

            def cat(key, axis=1, dtype=torch.float32):
                return torch.as_tensor(np.concatenate([ro[key] for ro in rollouts], axis=axis), dtype=dtype, device=device)

            obs, actions, behaviour_logprobs, behaviour_means = cat("obs"), cat("actions"), cat("logprobs"), cat("means")
            rewards, final_obs = cat("rewards"), cat("final_obs")
            terminated, truncated = cat("terminated", dtype=torch.bool), cat("truncated", dtype=torch.bool)
            behaviour_std = torch.as_tensor(np.repeat(np.stack([ro["std"] for ro in rollouts]), args.num_envs, axis=0),
                                            device=device).expand_as(behaviour_means)  # [B, A] -> [T, B, A]
            behaviour_version = np.repeat([ro["version"] for ro in rollouts], args.num_envs)
            policy_lag = (iteration - 1) - behaviour_version  # updates done so far - version acted with
            if args.norm_reward:
                reward_rms.update(torch.as_tensor(discounted))
                rewards = (rewards / torch.sqrt(reward_rms.var.float() + 1e-8)).clamp(-args.clip_reward, args.clip_reward)

            # --- V-trace with the current critic and the target policy (normalizer frozen). ---
            agent.eval()
            with torch.no_grad():
                _, _, _, values, start_means, start_std = agent.get_action_and_value(obs, actions)
                bootstrap_values = agent.get_value(cat("next_obs", axis=0))
                add_truncation_bootstrap(agent, rewards, final_obs, terminated, truncated,
                                         args.gamma)
                dones = (terminated | truncated).float()
                target_logprobs = target_agent.get_action_and_value(obs, actions)[1]
                vs, advantages = vtrace_advantages(behaviour_logprobs, target_logprobs, rewards, values, bootstrap_values,
                                                   dones, args.gamma, args.clip_rho, args.clip_c)
                rho = torch.exp(target_logprobs - behaviour_logprobs)
                behaviour_kl = gaussian_kl(behaviour_means, behaviour_std, start_means, start_std).mean().item()

            # --- Update: PPO epochs on the IMPACT surrogate; the normalizer stays frozen. ---
            agent.train()
            b_obs, b_actions = obs.reshape(-1, obs_dim), actions.reshape(-1, act_dim)
            b_target_logprobs, b_advantages, b_vs, b_values = (
                x.reshape(-1) for x in (target_logprobs, advantages, vs, values))
            b_means, b_std = start_means.reshape(-1, act_dim), start_std.reshape(-1, act_dim)
            stats: dict[str, list[torch.Tensor]] = {}
            for epoch in range(args.update_epochs):
                perm = torch.randperm(batch_size, device=device)
                for start in range(0, batch_size, minibatch_size):
                    mb = perm[start:start + minibatch_size]
                    loss, logratio, ratio, mean, std, terms = ppo_loss(
                        agent, b_obs[mb], b_actions[mb], b_target_logprobs[mb], b_advantages[mb], b_vs[mb], b_values[mb], args)
                    for opt in optimizers:
                        opt.zero_grad(set_to_none=True)
                    loss.backward()
                    gn_actor = nn.utils.clip_grad_norm_(actor_params, args.max_grad_norm, foreach=True)
                    gn_critic = nn.utils.clip_grad_norm_(critic_params, args.max_grad_norm, foreach=True)
                    for opt in optimizers:
                        opt.step()
                    with torch.no_grad():
                        kl = ((ratio - 1) - logratio).mean()  # Schulman's low-variance estimator
                        if args.desired_kl is not None:
                            # How far this update has moved the policy so far (from where it started).
                            gkl = gaussian_kl(b_means[mb], b_std[mb], mean, std).mean().item()
                            lr_scale = adapt_learning_rate(lr_scale * args.learning_rate, gkl, args.desired_kl,
                                                           args.lr_decrease_factor, args.lr_increase_factor) / args.learning_rate
                            set_learning_rate(optimizers, lr_scale)
                        for key, value in (*terms.items(), ("approx_kl", kl),
                                           ("clipfrac", ((ratio - 1.0).abs() > args.clip_coef).float().mean()),
                                           ("actor_grad_norm", gn_actor), ("critic_grad_norm", gn_critic),
                                           ("grad_norm", torch.sqrt(gn_actor**2 + gn_critic**2))):
                            stats.setdefault(key, []).append(value.detach())

            with torch.no_grad():
                stats = {k: torch.stack(v).float().mean().item() for k, v in stats.items()}
                var_y = b_vs.var()
                explained_var = (1 - (b_vs - b_values).var() / var_y).item() if var_y > 0 else float("nan")
                if args.norm_obs:  # learned from the rollouts after the update that used them
                    agent.obs_rms.update(b_obs)
                if iteration % args.target_update_freq == 0:
                    soft_update(target_agent, agent, args.tau)
                else:
                    target_agent.obs_rms.load_state_dict(agent.obs_rms.state_dict())
            done_iteration, done_step = iteration, global_step
            publish(agent, shared_state, version, iteration, actors)

            sps = int((global_step - start_step) / (time.time() - start_time))
            actor_time = sum(ro["rollout_time"] + ro["send_wait"] for ro in rollouts)
            metrics = {
                **{f"losses/{k}": v for k, v in stats.items()},
                "charts/learning_rate": optimizers[0].param_groups[0]["lr"], "charts/SPS": sps,
                "losses/explained_variance": explained_var,
                "losses/behaviour_kl": behaviour_kl,
                "losses/rho_clipfrac": (rho > args.clip_rho).float().mean().item(),
                "losses/rho_p99": torch.quantile(rho.flatten().double(), 0.99).item(),
                "charts/policy_lag_mean": float(policy_lag.mean()), "charts/policy_lag_max": float(policy_lag.max()),
                "charts/learner_wait_time": learner_wait,
                "charts/actor_wait_time": float(np.mean([ro["send_wait"] for ro in rollouts])),
                "charts/actor_wait_frac": sum(ro["send_wait"] for ro in rollouts) / max(actor_time, 1e-9),
                "charts/advantage_mean": b_advantages.mean().item(), "charts/advantage_std": b_advantages.std().item(),
                "charts/value_mean": b_values.mean().item(), "charts/policy_std": start_std.mean().item(),
            }
            for key, value in metrics.items():
                writer.add_scalar(key, value, global_step)
            shown_return = "-"  # until the first episode ends
            if episode_returns:
                metrics["charts/episodic_return"] = float(np.mean(episode_returns[-10:]))
                metrics["charts/episodic_length"] = float(np.mean(episode_lengths[-10:]))
                shown_return = f"{metrics['charts/episodic_return']:.1f}"
            eta = (end_step - global_step) / max(sps, 1)
            print(f"iter {iteration}/{num_iterations} | step {global_step} | "
                  f"return {shown_return} | SPS {sps} | lag "
                  f"{metrics['charts/policy_lag_mean']:.1f} | learner wait {learner_wait:.2f}s | "
                  f"ETA {int(eta // 60)}m{int(eta % 60):02d}s", flush=True)

            if args.eval_every and iteration % args.eval_every == 0:
                eval_return = float(np.mean(evaluate(agent, args.env_id, args.eval_episodes, args.seed + EVAL_SEED_OFFSET,
                                                     device, video_path())))
                writer.add_scalar("eval/periodic_return", eval_return, global_step)
                if eval_return > best_eval:
                    best_eval = eval_return
                    save_checkpoint(os.path.join(run_dir, "best.pt"), checkpoint_state(iteration))
            if args.checkpoint_every and iteration % args.checkpoint_every == 0:
                save_checkpoint(checkpoint_path, checkpoint_state(iteration))
                saved_step = global_step
    except KeyboardInterrupt:  # a second Ctrl-C: the state may be half-updated, so none is saved
        last = "none yet" if saved_step is None else f"{checkpoint_path} (step {saved_step})"
        print(f"\nstopped at once, without saving; last checkpoint: {last}", file=sys.stderr)
        raise SystemExit(130)
    except SystemExit as e:
        if e.code == 130:  # Ctrl-C, saved above
            raise
        # An actor died: keep what was learned, then report it.
        global_step = done_step
        save_checkpoint(checkpoint_path, checkpoint_state(done_iteration))
        writer.close()
        raise SystemExit(f"{e.code}; stopped at step {global_step}, resume with --resume {checkpoint_path}") from None
    finally:
        stop_actors(actors, conns, stop)  # every way out: no actor outlives the learner
        if previous_sigint is not None:
            signal.signal(signal.SIGINT, previous_sigint)

    save_checkpoint(checkpoint_path, checkpoint_state(iteration))
    try:  # the actors are stopped: a second Ctrl-C now only skips the evaluation
        eval_seed = args.seed + EVAL_SEED_OFFSET
        eval_returns = evaluate(agent, args.env_id, args.eval_episodes, eval_seed, device,
                                video_path())
    except KeyboardInterrupt:
        print(f"\nstopped before the final evaluation; checkpoint: {checkpoint_path}",
              file=sys.stderr)
        raise SystemExit(130) from None
    metrics["eval/episodic_return"] = float(np.mean(eval_returns))
    metrics["global_step"] = global_step
    writer.add_scalar("eval/episodic_return", metrics["eval/episodic_return"], global_step)
    writer.close()
    print(f"deterministic eval over {args.eval_episodes} episodes: {metrics['eval/episodic_return']:.1f}; "
          f"checkpoint: {checkpoint_path}")
    return metrics


if __name__ == "__main__":
    train(parse_args())
