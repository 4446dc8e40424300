"""PPO for continuous actions on several processes with DistributedDataParallel (CleanRL style).

Proximal Policy Optimization (Schulman et al. 2017, arXiv:1707.06347) with the details that
matter on MuJoCo ("The 37 Implementation Details of PPO", Huang et al. 2022), done correctly:

* time-limit truncation bootstraps from the final observation; termination does not;
* observations are normalized inside the agent, with statistics frozen during rollout and update
  and saved with every checkpoint; rewards are scaled by the std of the discounted return;
* actor and critic have their own learning rates and their own gradient clipping.

Read top to bottom: Args, env, networks, the algorithm (GAE, loss, rollout, update) and train(),
the outline of a run. Below train() come the research extras, then the harness (checkpoints,
resume, signals, evaluation, video, logging), which is the same in every script of the project.

Run:   torchrun --standalone --nproc_per_node 2 ppo_ddp.py --env-id Hopper-v5 (or python ppo_ddp.py)
Help:  python ppo_ddp.py --help; how the ranks work together: benchmarks/README.md (ppo_ddp.py)
"""

import argparse
import contextlib
import dataclasses
import fcntl
import functools
import importlib.util
import io
import itertools
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401 - imported before any group exists, see README (DDP exit)
import torch.nn as nn
import tyro
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.tensorboard import SummaryWriter

SCRIPT_NAME = "ppo_ddp"  # saved in checkpoints: another script's checkpoint is refused
EVAL_SEED_OFFSET = 10_000  # evaluation episodes use seeds the training envs never see
LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
CHECKPOINT_KEYS = ["env_id", "obs_dim", "act_dim", "args", "agent", "optimizers", "reward_rms"]
CHECKPOINT_KEYS += ["rng", "global_step", "iteration", "lr_scale", "best_eval"]


@dataclasses.dataclass
class Args:
    # Algorithm
    env_id: str = "Hopper-v5"  # id of a gymnasium environment with a Box action space
    env_backend: Literal["gymnasium", "envpool"] = "gymnasium"  # envpool: C++ MuJoCo (README)
    total_timesteps: int = 1_000_000  # total environment steps (over all envs)
    learning_rate: float = 3e-4  # of the actor, and of the critic unless --critic-learning-rate
    critic_learning_rate: float | None = None  # of the critic; None: --learning-rate
    num_envs: int = 8  # envs in each rank's vector env (rank r's env i is env r * num_envs + i)
    num_steps: int = 256  # steps per environment per rollout; batch = num_envs * num_steps
    anneal_lr: bool = True  # decay the learning rates linearly to 0 over training
    desired_kl: float | None = None  # adapt the lr to keep the Gaussian KL near this (rsl_rl)
    gamma: float = 0.99  # discount factor
    gae_lambda: float = 0.95  # lambda of generalized advantage estimation
    num_minibatches: int = 8  # minibatches per epoch
    update_epochs: int = 10  # passes over the batch per update
    norm_adv: bool = True  # normalize advantages once per update, over the global batch
    clip_coef: float = 0.2  # surrogate clipping epsilon (both sides unless --clip-low/-high)
    clip_low: float | None = None  # epsilon_low of the range [1 - low, 1 + high]; None: clip-coef
    clip_high: float | None = None  # epsilon_high of the clip range; None: --clip-coef
    clip_vloss: bool = False  # clip the value loss around the old values (as CleanRL; hurts a bit)
    ent_coef: float = 0.0  # entropy bonus coefficient (0: none)
    vf_coef: float = 0.5  # value loss coefficient
    max_grad_norm: float = 0.5  # max gradient norm, applied to actor and critic separately
    target_kl: float | None = None  # stop the epochs of an update once approx_kl exceeds this
    actor_layers: tuple[int, ...] = (64, 64)  # hidden layer sizes of the actor MLP
    critic_layers: tuple[int, ...] = (64, 64)  # hidden layer sizes of the critic MLP
    init_logstd: float = -0.5  # initial log-std of the policy (std 0.61; Andrychowicz et al.: ~0.5)
    optimizer: Literal["adam", "muon"] = "adam"  # muon: on the hidden weight matrices, Adam on rest
    weight_decay: float = 0.0  # decoupled, every group (AdamW, Muon): p -= lr * wd * p per step
    compile: bool = False  # torch.compile the loss computation of the update
    asymmetric_critic: bool = True  # robots: the critic reads privileged_state where the env has it
    privileged_actor: bool = False  # robots: the actor reads it too (a teacher, not deployable)

    # Extras (0: off)
    bounds_loss_coef: float = 0.0  # penalty on the actor mean leaving the action bounds [-1, 1]
    l2c2_coef: float = 0.0  # weight of the L2C2 local smoothness regularizer of the actor
    l2c2_noise: float = 0.1  # half-width of the uniform noise on normalized obs for L2C2
    nonnegative_reward: bool = False  # clamp every reward at 0 from below before GAE
    horizon_scale_reward: bool = False  # multiply every reward by (1 - gamma) before GAE
    robot_reward: Literal["env", "unclipped", "legged-gym"] = "env"  # robots: what they train on
    command_curriculum: bool = False  # robots: narrow velocity commands first, widened as tracked

    # Normalization
    norm_obs: bool = True  # normalize observations with a running mean/std kept in the agent
    norm_reward: bool = True  # scale rewards by the running std of the discounted return
    clip_obs: float = 10.0  # clip normalized observations to [-clip_obs, clip_obs]
    clip_reward: float = 10.0  # clip scaled rewards to [-clip_reward, clip_reward]

    # Run, logging, checkpoints, evaluation and video
    exp_name: str = SCRIPT_NAME  # name of this experiment (part of the run directory name)
    seed: int = 1  # seed of the experiment (env i gets seed + i)
    torch_deterministic: bool = True  # deterministic torch algorithms: same seed, same run
    cuda: bool = False  # the agent on the GPU, rollouts too (slower at the default sizes: README)
    threads: int = 1  # torch CPU threads; 1 is fastest for small networks, the env uses the other
    log_dir: str = "runs"  # runs are written to {log_dir}/{env_id}__{exp_name}__{seed}__{time}
    checkpoint_every: int = 50  # write <run>/checkpoint.pt every N iterations (0: at the end only)
    resume: str | None = None  # continue this checkpoint's run (flags you type override its own)
    init_from: str | None = None  # a new run from this checkpoint's networks and normalizer only
    eval_checkpoint: str | None = None  # only evaluate the policy in this checkpoint, then exit
    eval_every: int = 0  # evaluate every N iterations and keep the best policy as best.pt (0: off)
    eval_episodes: int = 10  # episodes of every evaluation (final, --eval-every, --eval-checkpoint)
    eval_command: tuple[float, float, float] | None = None  # robots: evaluate at vx vy yaw-rate
    capture_video: bool = False  # each evaluation's first episode as MP4 under {video_dir}/<run>
    check_sync_every: int = 50  # check every N iterations (0: at the end only) that ranks agree
    ddp: bool = True  # DistributedDataParallel; --no-ddp: the gradients all-reduced by hand
    video_dir: str = "videos"  # where --capture-video writes its MP4s (software rendering is slow)
    track: bool = False  # also log to Weights & Biases (pip install -r requirements-extras.txt)
    wandb_project_name: str = "single-file-rl"  # the W&B project of --track
    wandb_entity: str | None = None  # the W&B team or user of --track; None: your default


# Environment --------------------------------------------------------------------------------------
def make_envs(env_id: str, num_envs: int, backend: str = "gymnasium", **kwargs):
    """Sync vector env with SAME_STEP autoreset: the obs returned for a finished episode is the
    next episode's first one, and info["final_obs"] holds the last one, to bootstrap from."""
    if backend == "envpool":  # EnvPool's C++ envs, made to keep the same contract (harness)
        return EnvPoolVectorEnv(env_id, num_envs, **kwargs)
    autoreset = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    try:  # each env in a CheckedEnv (harness): flat observations, NaN or inf in one line
        envs = gym.make_vec(env_id, num_envs, "sync", autoreset, [CheckedEnv], **kwargs)
    except (gym.error.DependencyNotInstalled, ImportError) as e:  # ImportError: module:EnvId
        fail(f"cannot make {env_id}: {e}")
    except gym.error.Error as e:
        fail(f"unknown env id {env_id!r} ({type(e).__name__}: {e}){envpool_has(env_id)}")
    return envs


def scale_action(action: np.ndarray, space: gym.spaces.Box) -> np.ndarray:
    """The policy acts in [-1, 1]; clip there (the Gaussian is unbounded), map to the bounds."""
    action = np.clip(action, -1.0, 1.0)
    return space.low + (action + 1.0) * 0.5 * (space.high - space.low)


def to_tensor(x, device) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.float32, device=device)


# Networks and normalization -----------------------------------------------------------------------
def merge_moments(count_a, mean_a, var_a, count_b, mean_b, var_b):
    """Combine the (count, mean, population variance) of two data sets (Chan et al. 1979)."""
    count = count_a + count_b
    delta = mean_b - mean_a
    mean = mean_a + delta * count_b / count
    m2 = var_a * count_a + var_b * count_b + delta**2 * count_a * count_b / count
    return count, mean, m2 / count


class RunningMeanStd(nn.Module):
    """Running mean and variance as buffers, so they are part of the state dict."""

    def __init__(self, shape=()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor):
        x = x.reshape(-1, *self.mean.shape).to(torch.float64)
        moments = merge_moments(self.count, self.mean, self.var, *all_moments(x))  # all ranks alike
        for buffer, value in zip((self.count, self.mean, self.var), moments):
            buffer.copy_(value)


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

    def __init__(self, obs_dim: int, act_dim: int, args: Args, actor_dim: int | None = None):
        super().__init__()
        self.norm_obs, self.clip_obs = args.norm_obs, args.clip_obs
        self.obs_rms = RunningMeanStd((obs_dim,))  # each input dimension its own mean and std
        # Robots: obs is [state | privileged_state]. The actor reads state, what the deployed robot
        # senses. The critic serves only in training, so it may read what only the simulator knows
        # (asymmetric actor-critic, Pinto et al. 2018): better values, the same deployable policy.
        self.actor_dim = obs_dim if actor_dim is None or args.privileged_actor else actor_dim
        privileged = args.asymmetric_critic and self.actor_dim < obs_dim
        self.critic_cols = slice(self.actor_dim, None) if privileged else slice(0, self.actor_dim)
        # A small last layer makes the initial mean ~0 in every state (Andrychowicz et al. 2021).
        self.actor_mean = mlp(self.actor_dim, args.actor_layers, act_dim, out_std=0.01)
        self.actor_logstd = nn.Parameter(torch.full((act_dim,), args.init_logstd))
        self.critic = mlp(len(range(obs_dim)[self.critic_cols]), args.critic_layers, 1, out_std=1.0)

    def actor_parameters(self) -> list[nn.Parameter]:
        return [*self.actor_mean.parameters(), self.actor_logstd]

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        if not self.norm_obs:
            return obs
        x = (obs - self.obs_rms.mean) / torch.sqrt(self.obs_rms.var + 1e-8)
        return x.clamp(-self.clip_obs, self.clip_obs).to(obs.dtype)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.normalize(obs)[..., self.critic_cols]).squeeze(-1)

    def mean_action(self, obs: torch.Tensor) -> torch.Tensor:  # evaluation's action, the export's
        return self.actor_mean(self.normalize(obs)[..., : self.actor_dim])

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """The rollout's one call per step: actions drawn from the Gaussian policy. The actor
        alone: the log-probs and values of the whole rollout come after it, in one batched pass."""
        mean = self.mean_action(obs)
        return torch.normal(mean, self.actor_logstd.expand_as(mean).exp())

    def get_action_and_value(self, obs: torch.Tensor, actions: torch.Tensor):
        """A dict of [batch] tensors: the actions, their log-probs, the entropies, the values, and
        the Gaussian's means and std."""
        x = self.normalize(obs)
        mean = self.actor_mean(x[..., : self.actor_dim])
        logstd = self.actor_logstd.expand_as(mean)
        std = logstd.exp()
        # The diagonal Gaussian's log-density and entropy written out: the same numbers as
        # torch.distributions.Normal, which costs more to build than these small networks.
        logprobs = (-0.5 * ((actions - mean) / std) ** 2 - logstd - LOG_SQRT_2PI).sum(-1)
        entropy = (0.5 + LOG_SQRT_2PI + logstd).sum(-1)
        values = self.critic(x[..., self.critic_cols]).squeeze(-1)
        return {"actions": actions, "logprobs": logprobs, "entropy": entropy, "values": values,
                "means": mean, "std": std}  # fmt: skip

    forward = get_action_and_value  # DDP averages the gradients of passes through its forward only


# Distributed: ranks decide alike from shared statistics; alone, each helper is the identity -------
def init_distributed(args: Args):
    """Join the process group torchrun describes in the environment; without one, run alone."""
    missing = [name for name in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not os.getenv(name)]
    if "RANK" in os.environ and missing:  # a RANK left in the shell (a cluster's), not torchrun's
        fail(f"RANK is set but not {', '.join(missing)}: start ranks with torchrun (README), or "
             "one process with RANK unset (env -u RANK python ppo_ddp.py ...)")  # fmt: skip
    if "RANK" in os.environ:  # started by torchrun
        cuda = args.cuda and torch.cuda.is_available()  # else check_args fails in one line
        if cuda:  # one GPU per rank ("cuda" is then this one); NCCL averages the gradients
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo")
        if dist.get_rank() > 0:  # rank 0 alone prints; errors (stderr) show on every rank
            sys.stdout = open(os.devnull, "w")


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def all_reduce_mean(x: torch.Tensor) -> torch.Tensor:
    if world_size() == 1:
        return x
    x = x.clone()
    dist.all_reduce(x)
    return x / world_size()


def all_moments(x: torch.Tensor):
    """(count, mean, population variance) over dim 0 of the same-size batches x of all ranks."""
    mean = all_reduce_mean(x.mean(0))
    var = all_reduce_mean(x.var(0, unbiased=False) + (x.mean(0) - mean) ** 2)  # + var of the means
    return x.shape[0] * world_size(), mean, var


def broadcast_from_rank_0(module: nn.Module):
    """--no-ddp: rank 0's parameters and buffers on every rank, what DDP's constructor does (each
    rank seeds torch with seed + rank, so each made other networks)."""
    for tensor in module.state_dict().values():  # views of the parameters: copied in place
        dist.broadcast(tensor, src=0)


def average_gradients(module: nn.Module):
    """--no-ddp: what DDP does inside backward(), by hand (as CleanRL): sum each gradient over the
    ranks, then divide by their number; the ranks started alike (broadcast_from_rank_0), so they
    stay alike. Never together with DDP: that would average twice."""
    if world_size() == 1:
        return
    for param in module.parameters():
        dist.all_reduce(param.grad)  # a sum
        param.grad /= world_size()


def check_in_sync(agent: nn.Module, reward_rms: nn.Module):
    """Fail in one line unless every rank holds rank 0's parameters and statistics bit for bit:
    rank 0 names the tensors that differ and on how many ranks (every rank exits with code 1)."""
    if world_size() == 1:
        return
    named = {
        **agent.state_dict(),
        **{f"reward_rms.{k}": v for k, v in reward_rms.state_dict().items()},
    }
    state = torch.cat([t.flatten().double().cpu() for t in named.values()])
    reference = state.clone()
    dist.broadcast(reference, src=0)
    sizes = [t.numel() for t in named.values()]
    differs = [
        float(not torch.equal(a, b)) for a, b in zip(state.split(sizes), reference.split(sizes))
    ]
    per_tensor = torch.tensor(differs + [float(any(differs))])
    dist.all_reduce(per_tensor)  # the number of ranks on which each differs; last: any
    if per_tensor[-1] > 0:
        names = [name for name, count in zip(named, per_tensor) if count > 0]
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        fail(f"parameters out of sync: {int(per_tensor[-1])} of {world_size()} ranks differ from "
             f"rank 0 in {', '.join(names[:3])}{more}")  # fmt: skip
    print(f"parameters in sync across {world_size()} ranks", flush=True)


# Algorithm ----------------------------------------------------------------------------------------
def compute_gae(rewards, values, next_values, terminated, dones, gamma: float, gae_lambda: float):
    """Generalized advantage estimation (Schulman et al. 2016, eq. 16), time-major [T, N].

    next_values[t] is V(s_{t+1}) of the same episode (V(final_obs) where it was truncated).
    terminated[t] cuts the bootstrap; dones[t] (terminated or truncated) cuts the trace, because
    s_{t+1} in the buffer belongs to a new episode."""
    delta = rewards + gamma * next_values * (1.0 - terminated) - values
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        last = delta[t] + gamma * gae_lambda * (1.0 - dones[t]) * last
        advantages[t] = last
    return advantages, advantages + values


def clip_range(args: Args) -> tuple[float, float]:
    """(epsilon_low, epsilon_high) of the clip range [1 - epsilon_low, 1 + epsilon_high]."""
    low = args.clip_coef if args.clip_low is None else args.clip_low
    high = args.clip_coef if args.clip_high is None else args.clip_high
    return low, high


def ppo_loss(agent: Agent, mb: dict, args: Args):
    """Clipped surrogate (PPO paper eq. 7, asymmetric range), value loss and entropy of one
    minibatch. Returns the loss to minimize, the loss terms (for logging) and the new policy's
    outputs (get_action_and_value's dict, with the log-ratio and the ratio)."""
    new = agent(mb["obs"], mb["actions"])  # through the DDP wrapper: its gradients are averaged
    new["logratio"] = new["logprobs"] - mb["logprobs"]
    ratio = new["ratio"] = new["logratio"].exp()
    advantages = mb["advantages"]
    low, high = clip_range(args)
    clipped = ratio.clamp(1.0 - low, 1.0 + high)
    pg_loss = -torch.min(ratio * advantages, clipped * advantages).mean()
    values, returns, old_values = new["values"], mb["returns"], mb["values"]
    if args.clip_vloss:
        v_clipped = old_values + (values - old_values).clamp(-args.clip_coef, args.clip_coef)
        v_loss = 0.5 * torch.max((values - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((values - returns) ** 2).mean()
    entropy_loss = new["entropy"].mean()
    loss = pg_loss - args.ent_coef * entropy_loss + args.vf_coef * v_loss
    terms = {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy_loss}
    # Extras, each off at 0.
    if args.bounds_loss_coef > 0:
        terms["bounds_loss"] = bounds_loss(new["means"])
        loss = loss + args.bounds_loss_coef * terms["bounds_loss"]
    if args.l2c2_coef > 0:
        terms["l2c2_loss"] = l2c2_loss(agent, mb["obs"], new["means"], args.l2c2_noise)
        loss = loss + args.l2c2_coef * terms["l2c2_loss"]
    with torch.no_grad():  # how far the policy has moved: KL estimates, clipped fractions
        terms["approx_kl"] = ((ratio - 1) - new["logratio"]).mean()  # Schulman's estimator
        terms["old_approx_kl"] = (-new["logratio"]).mean()
        terms["clipfrac"] = ((ratio < 1 - low) | (ratio > 1 + high)).float().mean()
        terms["clipfrac_high"] = (ratio > 1 + high).float().mean()
        terms["clipfrac_low"] = (ratio < 1 - low).float().mean()
    return loss, terms, new


def start_episodes(envs, global_step: int, args: Args, device, options=None) -> dict:
    """Reset the envs (options: EnvPool's make-time ones, a robot's command ranges); returns what
    carries over from one rollout to the next: the last obs, the episodes' running sums and the
    record of every finished episode. (A resume starts fresh episodes.)"""
    seed = args.seed + rank() * args.num_envs + global_step
    first_obs, _ = envs.reset(seed=seed, options=options)
    return {
        "obs": to_tensor(first_obs, device),
        "return": np.zeros(args.num_envs),
        "length": np.zeros(args.num_envs, dtype=int),
        "discounted": np.zeros(args.num_envs),
        "episodes": [],
    }


@torch.no_grad()
def collect_rollout(agent, envs, reward_rms, carry: dict, step: int, writer, args: Args) -> dict:
    """args.num_steps steps of every env with the frozen policy and normalizer, from global step
    `step` on: a dict of time-major [T, N] tensors. carry holds what runs on across rollouts."""
    device = carry["obs"].device
    shape = (args.num_steps, args.num_envs)
    buf = {"obs": [], "actions": []}
    rewards, discounted = np.zeros(shape), np.zeros(shape)
    terminated, truncated = np.zeros(shape, dtype=bool), np.zeros(shape, dtype=bool)
    final_obs = np.zeros((*shape, carry["obs"].shape[-1]), dtype=np.float32)  # where truncated
    for t in range(args.num_steps):
        actions = agent.act(carry["obs"])
        buf["obs"].append(carry["obs"])
        buf["actions"].append(actions)
        env_action = scale_action(actions.cpu().numpy(), envs.single_action_space)
        next_obs, rewards[t], terminated[t], truncated[t], info = envs.step(env_action)
        carry["obs"] = to_tensor(next_obs, device)
        carry["return"] += rewards[t]
        carry["length"] += 1
        carry["discounted"] = carry["discounted"] * args.gamma + rewards[t]
        discounted[t] = carry["discounted"]
        done = terminated[t] | truncated[t]
        for i in np.flatnonzero(done):  # robots: each reward term's mean per step of the episode
            terms = {name: means[i] for name, means in info.get("reward_terms", {}).items()}
            carry["episodes"].append({"return": carry["return"][i], "length": carry["length"][i],
                                      "fell": terminated[t, i], "terms": terms})  # fmt: skip
            end = step + (t + 1) * args.num_envs * world_size()
            if writer is None:  # rank 0 alone logs (its own episodes)
                continue
            writer.add_scalar("charts/episodic_return", carry["return"][i], end)
            writer.add_scalar("charts/episodic_length", carry["length"][i], end)
            for name, mean in terms.items():
                writer.add_scalar(f"reward_terms/{name}", mean, end)
        for key in ("return", "length", "discounted"):  # the next episodes start from 0
            carry[key][done] = 0
        # The obs returned for a finished episode is already the next one's reset obs: a truncated
        # episode bootstraps from V(final_obs); a terminated one needs no value.
        for i in np.flatnonzero(truncated[t]):
            final_obs[t, i] = info["final_obs"][i]
    rollout = {key: torch.stack(values) for key, values in buf.items()}
    # The policy was frozen: the log-probs, values and means of all the steps in one batched pass.
    policy = agent.get_action_and_value(rollout["obs"], rollout["actions"])
    rollout.update(logprobs=policy["logprobs"], values=policy["values"], means=policy["means"])
    # V(s_{t+1}) of the same episode: the next step's value, or V(final_obs) after a truncation.
    next_values = torch.cat((rollout["values"][1:], agent.get_value(carry["obs"])[None]))
    truncated_mask = torch.as_tensor(truncated, device=device)
    final_values = agent.get_value(to_tensor(final_obs, device))
    rollout["next_values"] = torch.where(truncated_mask, final_values, next_values)
    rollout["rewards"] = to_tensor(rewards, device)
    if args.norm_reward:  # scale by the std of the discounted return, this rollout included
        reward_rms.update(torch.as_tensor(discounted))
        scaled = rollout["rewards"] / torch.sqrt(reward_rms.var.float() + 1e-8)
        rollout["rewards"] = scaled.clamp(-args.clip_reward, args.clip_reward)
    if args.nonnegative_reward or args.horizon_scale_reward:  # Extras, on the scaled reward
        rollout["rewards"] = shape_rewards(rollout["rewards"], args)
    rollout["terminated"] = to_tensor(terminated, device)
    rollout["dones"] = to_tensor(terminated | truncated, device)
    return rollout


def ppo_update(agent, optimizers, loss_fn, batch: dict, lr_scale: float, args: Args):
    """args.update_epochs passes of minibatch gradient steps over the flat batch, the normalizer
    frozen. Returns the logged statistics and the lr scale (the desired-KL rule changes it)."""
    ddp_agent = agent  # the loss's passes go through the DDP wrapper (if any); the rest does not
    agent = getattr(agent, "module", agent)
    advantages = batch["advantages"]
    if args.norm_adv:  # once per update, with the global batch's moments: alike on every rank
        _, adv_mean, adv_var = all_moments(advantages.double())
        advantages = (advantages - adv_mean.float()) / (adv_var.float().sqrt() + 1e-8)
    batch_size = batch["obs"].shape[0]
    minibatch_size = batch_size // args.num_minibatches
    old_std = agent.actor_logstd.detach().exp()
    # Actor and critic each clipped to the norm on their own.
    clip = functools.partial(nn.utils.clip_grad_norm_, max_norm=args.max_grad_norm, foreach=True)
    stats = {}
    for _ in range(args.update_epochs):
        last_epoch_ratios = []
        perm = torch.randperm(batch_size, device=batch["obs"].device)
        for start in range(0, batch_size, minibatch_size):
            idx = perm[start : start + minibatch_size]
            mb = {key: value[idx] for key, value in batch.items()}
            mb["advantages"] = advantages[idx]
            loss, terms, new = loss_fn(ddp_agent, mb, args)
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            loss.backward()
            if ddp_agent is agent:  # --no-ddp (or one process): no wrapper averaged the gradients
                average_gradients(agent)
            actor_norm = clip(agent.actor_parameters())
            critic_norm = clip(agent.critic.parameters())
            for opt in optimizers:
                opt.step()
            if args.desired_kl is not None:  # Extra: the lr follows the KL of every step
                lr_scale = adapt_lr_scale(optimizers, mb, old_std, new, lr_scale, args)
            terms.update(actor_grad_norm=actor_norm, critic_grad_norm=critic_norm)
            for key, value in terms.items():
                stats.setdefault(key, []).append(value.detach())
            last_epoch_ratios.append(new["ratio"].detach())
        kl = terms["approx_kl"]
        if args.target_kl is not None and all_reduce_mean(kl).item() > args.target_kl:
            break
    metrics = {f"losses/{k}": torch.stack(v).float().mean().item() for k, v in stats.items()}
    metrics.update(diagnostics(agent, batch, torch.cat(last_epoch_ratios), args))
    return metrics, lr_scale


def make_optimizers(agent: Agent, args: Args) -> list[torch.optim.Optimizer]:
    """Actor and critic in their own parameter groups, each remembering its initial lr; with
    --optimizer muon, Muon takes the hidden weight matrices (muon_params). fused AdamW: one kernel
    for all."""
    critic_lr = args.critic_learning_rate or args.learning_rate  # None: the actor's (0 refused)
    groups = [
        ("actor", agent.actor_parameters(), args.learning_rate),
        ("critic", list(agent.critic.parameters()), critic_lr),
    ]
    hidden = muon_params(agent) if args.optimizer == "muon" else set()
    muon_groups, adam_groups = [], []
    for name, params, lr in groups:
        group = {"lr": lr, "initial_lr": lr, "name": name, "weight_decay": args.weight_decay}
        muon_groups.append({**group, "params": [p for p in params if id(p) in hidden]})
        adam_groups.append({**group, "params": [p for p in params if id(p) not in hidden]})
    muon_groups = [group for group in muon_groups if group["params"]]
    optimizers = [torch.optim.AdamW(adam_groups, eps=1e-5, fused=True)]  # decoupled decay
    if muon_groups:  # "match_rms_adamw" scales Muon's step so that it can share Adam's lr
        optimizers.append(torch.optim.Muon(muon_groups, adjust_lr_fn="match_rms_adamw"))
    return optimizers


def set_learning_rate(optimizers, scale: float):
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * scale


# Training -----------------------------------------------------------------------------------------
def train(args: Args) -> dict[str, float]:
    """Train with exactly these settings; with args.resume, go on with that checkpoint's run."""
    check_args(args)  # Harness: bad input in one line, before anything runs
    torch.set_num_threads(args.threads)  # evaluation's too: other threads, other float sums
    can_film = start_mujoco(args)  # Harness: before any env loads MuJoCo; one frame, if filmed
    if args.eval_checkpoint is not None:  # Harness: only evaluate a saved policy
        return evaluate_checkpoint(args, can_film)
    ckpt = load_checkpoint(args.resume) if args.resume is not None else None  # Harness: to resume
    init_distributed(args)  # Distributed: one process per rank (torchrun), or alone
    is_main = rank() == 0  # rank 0 alone does the run's I/O: logs, checkpoints, evaluation, video
    plan = plan_run(args, ckpt)  # Harness: whole batches only; a resume goes on from its step
    torch.manual_seed(args.seed + rank())  # each rank its own noise; rank 0's weights: below
    torch.use_deterministic_algorithms(args.torch_deterministic, warn_only=True)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if args.cuda else "cpu")
    envs = make_envs(args.env_id, args.num_envs, args.env_backend, **train_options(args))
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    act_dim = int(np.prod(envs.single_action_space.shape))
    agent = Agent(obs_dim, act_dim, args, getattr(envs, "actor_dim", obs_dim)).to(device)
    if args.init_from is not None:  # Harness: a new run from a checkpoint's weights
        init_from(agent, args)
    optimizers = make_optimizers(agent, args)
    reward_rms = RunningMeanStd()  # of the discounted return, for reward scaling
    progress = {"global_step": 0, "iteration": 0, "lr_scale": 1.0, "best_eval": -math.inf,
                "command_scale": CURRICULUM[0] if args.command_curriculum else 1.0}  # fmt: skip
    if ckpt is not None:  # Harness: resume the saved state and progress
        progress = resume_run(ckpt, args, agent, optimizers, reward_rms)
    wrap = dist.is_initialized() and args.ddp  # Distributed: DDP, or by hand (--no-ddp)
    ddp_agent = DDP(agent) if wrap else agent  # DDP copies rank 0's weights to every rank
    if dist.is_initialized() and not wrap:  # --no-ddp: so do we
        broadcast_from_rank_0(agent)
    state = {"agent": agent, "optimizers": optimizers, "reward_rms": reward_rms, "args": args,
             "progress": progress}  # fmt: skip  # Harness: what a checkpoint holds, by name
    loss_fn = torch.compile(ppo_loss) if args.compile else ppo_loss
    carry = start_episodes(envs, progress["global_step"], args, device, curriculum(args, progress))
    run = {"writer": None, "checkpoint": "", "dir": ""}  # Harness: rank 0's, below; none else
    run = start_run(args, plan, can_film) if is_main else run  # and the clock
    last = plan["last_iteration"]
    with run_guard(run, args) as signals:  # Harness: TensorBoard; a signal stops after an iteration
        for iteration in range(plan["first_iteration"], last + 1):
            if args.anneal_lr and args.desired_kl is None:
                progress["lr_scale"] = 1.0 - (iteration - 1.0) / last
            set_learning_rate(optimizers, progress["lr_scale"])
            rollout = collect_rollout(
                agent, envs, reward_rms, carry, progress["global_step"], run["writer"], args
            )
            rollout["advantages"], rollout["returns"] = compute_gae(
                rollout["rewards"], rollout["values"], rollout["next_values"],
                rollout["terminated"], rollout["dones"], args.gamma, args.gae_lambda,
            )  # fmt: skip
            batch = {key: value.flatten(0, 1) for key, value in rollout.items()}
            metrics, progress["lr_scale"] = ppo_update(
                ddp_agent, optimizers, loss_fn, batch, progress["lr_scale"], args
            )
            if args.norm_obs:  # the normalizer learns from the rollout after the update
                agent.obs_rms.update(batch["obs"])
            progress["global_step"] += plan["batch_size"]
            progress["iteration"] = iteration
            if iteration == last or args.check_sync_every and not iteration % args.check_sync_every:
                check_in_sync(agent, reward_rms)

            check_finite(run, metrics, agent, progress)  # Harness: every rank, all alike
            stop = signals["signum"] if iteration < last else 0  # Harness: the signal, if any
            any_rank = all_reduce_mean(torch.tensor(float(stop))).item() > 0  # one stops: all do
            stop = (stop or signal.SIGTERM) if any_rank else 0
            if is_main:  # Harness: rank 0 alone logs, evaluates and saves
                metrics = log_iteration(run, metrics, optimizers, carry, progress)
            if args.command_curriculum and widen_commands(carry, progress, args):  # Extra
                commands = curriculum(args, progress)  # new envs, wider commands
                carry = start_episodes(envs, progress["global_step"], args, device, commands)
            if is_main:  # Harness
                stop = evaluate_and_save(run, state, stop)
            if stop:  # Harness
                break
        del ddp_agent  # before destroy_process_group, even after a stop (README: DDP exit)
        envs.close()
        if not is_main:  # rank 0 alone evaluates and reports
            return metrics
        return finish_run(run, state, metrics, stop)  # Harness: final evaluation, or exit 128+n


# Extras: research options and diagnostics, each called from one marked place above ---------------
def shape_rewards(rewards: torch.Tensor, args: Args) -> torch.Tensor:
    """--nonnegative-reward: max(r, 0); --horizon-scale-reward: (1 - gamma) r, so that a return
    averages the rewards over the horizon 1 / (1 - gamma). Applied to the scaled reward (the same
    as to the raw one: the scale is positive); --norm-reward's statistics and the logged returns
    stay the env's."""
    if args.nonnegative_reward:
        rewards = rewards.clamp_min(0.0)
    if args.horizon_scale_reward:
        rewards = rewards * (1.0 - args.gamma)
    return rewards


# Robots: training options for EnvPool's joystick tasks (evaluation always runs the stock task).
CURRICULUM = (0.5, 0.25, 0.75)  # --command-curriculum: first range, step, tracking to widen
COMMAND_RANGES = ["command_a0", "command_a1"]  # Go1's linear command bounds (vx, vy), +-
COMMAND_RANGES += ["lin_vel_x_min", "lin_vel_x_max", "lin_vel_y_min", "lin_vel_y_max"]  # others'


def train_options(args: Args) -> dict:
    """make_envs's options for training (not evaluation's): the reward the robot trains on."""
    return {"reward": args.robot_reward} if args.robot_reward != "env" else {}


def robot_reward(info: dict, env_reward: np.ndarray, mode: str, dt: float) -> np.ndarray:
    """--robot-reward, from the terms EnvPool reports. The env's reward is clip(dt * their sum,
    0, 1e4), so a step whose penalties outweigh its tracking teaches nothing (most exploring
    steps: a dead zone). unclipped: dt * the sum (mjlab); legged-gym: the sum without the
    termination term clipped at 0, then the term added (legged_gym: a fall still costs)."""
    terms = {key: value for key, value in info.items() if key.startswith("reward_")}
    total = dt * sum(terms.values())
    inside = (env_reward > 0) & (env_reward < 1e4)  # not clipped there: the two must agree
    if not np.allclose(total[inside], env_reward[inside], rtol=1e-4, atol=1e-5):
        fail(f"--robot-reward: this task's reward is not {dt} x the sum of its reward terms")
    if mode == "legged-gym":
        termination = dt * terms.get("reward_termination", 0.0)
        total = np.maximum(total - termination, 0.0) + termination
    return total


def check_robot_options(args: Args):
    """--robot-reward and --command-curriculum: for EnvPool's joystick tasks only, in one line."""
    robots = args.env_backend == "envpool" and commands_at(args.env_id, 1.0)
    if (args.robot_reward != "env" or args.command_curriculum) and not robots:
        fail("--robot-reward and --command-curriculum train EnvPool's joystick robots, not "
             f"{args.env_id} on {args.env_backend}")  # fmt: skip


def commands_at(env_id: str, scale: float) -> dict:
    """The task's linear velocity command ranges times scale, as EnvPool's make-time options."""
    config = importlib.import_module("envpool").make_spec(env_id).config._asdict()
    return {key: config[key] * scale for key in COMMAND_RANGES if key in config}


def curriculum(args: Args, progress: dict) -> dict | None:
    """The envs' make-time options of --command-curriculum: the task's ranges at its scale now."""
    return commands_at(args.env_id, progress["command_scale"]) if args.command_curriculum else None


def widen_commands(carry: dict, progress: dict, args: Args) -> bool:
    """--command-curriculum (legged_gym's): the linear commands start at half the task's ranges,
    where a step toward a commanded velocity pays in every direction (at 1.5 m/s, the tracking
    term exp(-err^2 / 0.25) is flat near standing still); once the last num_envs episodes at this
    range track them at >= 0.75 per step on average (standing still: 0.59), they widen by a
    quarter, up to the task's own. Returns whether they widened (new envs then)."""
    _, step, threshold = CURRICULUM
    tracking = [episode["terms"]["tracking_lin_vel"] for episode in carry["episodes"]]
    enough = len(tracking) >= args.num_envs  # each rank its own episodes; all decide alike:
    mean = np.mean(tracking[-args.num_envs :]) if enough else 0.0  # on the mean over the ranks
    enough, mean = all_reduce_mean(torch.tensor([float(enough), mean])).tolist()
    if progress["command_scale"] >= 1.0 or enough < 1.0 or mean < threshold:
        return False
    progress["command_scale"] = min(progress["command_scale"] + step, 1.0)
    return True


def robot_measures(episodes: list[dict]) -> str:
    """What a robot can do, for the progress and evaluation lines: the episodes' per-step tracking
    of the linear and yaw commands, their falls (terminated) and mean length; "" for other tasks."""
    if not episodes or "tracking_lin_vel" not in episodes[0]["terms"]:
        return ""
    lin = np.mean([episode["terms"]["tracking_lin_vel"] for episode in episodes])
    yaw = np.mean([episode["terms"]["tracking_ang_vel"] for episode in episodes])
    falls, length = sum(e["fell"] for e in episodes), np.mean([e["length"] for e in episodes])
    return (f" | tracking lin {lin:.3f} yaw {yaw:.3f} | falls {falls} of {len(episodes)} | "
            f"length {length:.0f}")  # fmt: skip


# Robots: evaluation (--eval-command: the stock task, told another command), video and the
# adapter's robot side under EnvPool.
# --eval-command: where a task's observation holds its velocity command (vx, vy, yaw rate), in
# state and again in privileged_state (which starts with state), and where privileged_state holds
# what the env's tracking terms compare it with: the local vx, vy and the gyro's yaw rate, not
# noised (envpool/mujoco/playground/go1.h FillObs; the rough terrain's robot and observation are
# the flat terrain's).
GO1_COMMAND = {"slots": slice(45, 48), "measured": [57, 58, 50]}
COMMAND_SLOTS = {f"Go1Joystick{floor}Terrain-v1": GO1_COMMAND for floor in ("Flat", "Rough")}
COMMANDED = list(COMMAND_SLOTS)  # EnvPool's other names of them, below
COMMAND_SLOTS |= {f"MuJoCoPlayground/{task}": slots for task, slots in COMMAND_SLOTS.items()}


def check_envpool(args: Args):
    """--env-backend envpool: EnvPool installed, with the task, and --eval-command's slots known
    (the adapter says why not); then the robots' training options. Before anything runs."""
    if args.env_backend == "envpool":
        EnvPoolVectorEnv(args.env_id, 1, **eval_options(args)).close()
    elif args.eval_command is not None:
        fail(f"--eval-command commands EnvPool's robots ({', '.join(COMMANDED)}), not "
             f"{args.env_id} on {args.env_backend}")  # fmt: skip
    check_robot_options(args)


def is_robot(args: Args) -> bool:
    """One of EnvPool's joystick robots, whose pools take seconds to make (a model for each env)."""
    return args.env_backend == "envpool" and bool(commands_at(args.env_id, 1.0))


def eval_options(args: Args) -> dict:
    """make_envs's options for evaluation: --eval-command's command, which the adapter writes."""
    return {} if args.eval_command is None else {"command": args.eval_command}


def fixed_command(env_id: str, command) -> dict | None:
    """--eval-command's values, the task's slots of them and of what tracks them, and its tracking
    terms' scales and sigma (make-time settings); None without one."""
    if command is None:
        return None
    if env_id not in COMMAND_SLOTS:
        fail(f"--eval-command: where {env_id}'s observation holds its command is not known (known: "
             f"{', '.join(COMMANDED)})")  # fmt: skip
    if not np.isfinite(command).all():
        fail(f"--eval-command must be 3 finite numbers (vx vy yaw-rate), got {command}")
    config = importlib.import_module("envpool").make_spec(env_id).config
    scales = {"lin": config.tracking_lin_vel_scale, "yaw": config.tracking_ang_vel_scale}
    return {**COMMAND_SLOTS[env_id], **scales, "values": command, "sigma": config.tracking_sigma}


def with_command(obs, command: dict | None):
    """The pool's observation with --eval-command's values in its command slots, before it is laid
    flat (and before a student's history is made of it): the policy sees only that command."""
    for key in ("state", "privileged_state") if command is not None else ():
        obs[key][:, command["slots"]] = command["values"]
    return obs


def command_tracking(command: dict, privileged: np.ndarray) -> dict:
    """The env's two tracking terms, measured against --eval-command's command instead of the env's
    own: scale x exp(-error^2 / sigma) of the error in (vx, vy) and in the yaw rate (Go1: 1.0 x
    and 0.5 x, sigma 0.25), from privileged_state after the step, as the env computes them."""
    vx, vy, yaw = (privileged[:, i] for i in command["measured"])
    want_vx, want_vy, want_yaw = command["values"]
    lin_error, yaw_error = (want_vx - vx) ** 2 + (want_vy - vy) ** 2, (want_yaw - yaw) ** 2
    return {"tracking_lin_vel": command["lin"] * np.exp(-lin_error / command["sigma"]),
            "tracking_ang_vel": command["yaw"] * np.exp(-yaw_error / command["sigma"])}  # fmt: skip


class RobotSteps:
    """The adapter's robot side: --robot-reward's reward, --eval-command's command, and each reward
    term's sum over each env's episode (sums: new with each pool), whose means per step an ended
    episode reports (info["reward_terms"]), with --eval-command's tracking in place of the env's.
    Other tasks report no terms."""

    def __init__(self, config, reward: str, command: dict | None):
        self.config, self.reward, self.command, self.sums = config, reward, command, {}

    def step(self, raw: dict, rewards: np.ndarray, obs, done: np.ndarray):
        """The step's rewards and info, from the pool's raw info and (Dict) observation."""
        if self.reward != "env":  # Extra: --robot-reward
            rewards = robot_reward(raw, rewards, self.reward, self.config.ctrl_dt)
        terms = {key[7:]: value for key, value in raw.items() if key.startswith("reward_")}
        if self.command is not None:
            terms.update(command_tracking(self.command, obs["privileged_state"]))
        for name, value in terms.items():
            self.sums[name] = self.sums.get(name, 0.0) + value
        if not done.any():
            return rewards, {}
        length = raw["elapsed_step"]  # the episode's steps, this one included
        means = {name: sums / length for name, sums in self.sums.items()}
        for sums in self.sums.values():  # the next episodes start from 0
            sums[done] = 0
        return rewards, {"reward_terms": means}


def filming(env_id: str, kwargs: dict):
    """--capture-video under EnvPool: (a GL context, made current; the frames per second), or
    (None, {}). EnvPool's MuJoCo renders env 0 (480 x 480) in the thread's current GL context,
    which MuJoCo's own provides (MUJOCO_GL: egl, osmesa); the envs keep it while they film. In
    software a robot's frame takes about 0.5 s: its scene's shadow map is 8192 pixels wide."""
    if kwargs.get("render_mode") is None:
        return None, {}
    context = importlib.import_module("mujoco").GLContext(480, 480)
    context.make_current()
    config = importlib.import_module("envpool").make_spec(env_id).config
    if hasattr(config, "ctrl_dt"):  # a robot: its control steps a second
        return context, {"render_fps": round(1 / config.ctrl_dt)}
    try:  # gymnasium's task of that id knows its rate (EnvPool's MuJoCo ones: Hopper's 125)
        env = gym.make(env_id)
    except gym.error.Error:
        return context, {}  # evaluate's 30 frames a second
    env.close()
    return context, {"render_fps": env.metadata.get("render_fps", 30)}


def envpool_has(env_id: str) -> str:
    """The hint that ends gymnasium's "unknown env id" where EnvPool has that id (a robot's)."""
    if importlib.util.find_spec("envpool") is None:
        return ""
    known = env_id in importlib.import_module("envpool").list_all_envs()
    return "; EnvPool has it: add --env-backend envpool" if known else ""


def other_ids(env_id: str, envpool) -> str:
    """The hint that ends "EnvPool has no <id>": its closest ids, and the gymnasium backend where
    gymnasium has the id (a registered one, or module:Id, which gymnasium imports)."""
    ids = [i for i in envpool.list_all_envs() if "/" in env_id or "/" not in i]  # one name each
    close = importlib.import_module("difflib").get_close_matches(env_id, ids, n=3)
    hint = f"; closest: {', '.join(close)}" if close else ""
    if ":" in env_id or env_id in gym.registry:
        hint += "; gymnasium has it: use --env-backend gymnasium"
    return hint


def gaussian_kl(mean_old, std_old, mean_new, std_new) -> torch.Tensor:
    """KL(old || new) of diagonal Gaussians, summed over action dims (analytic, as in rsl_rl)."""
    ratio_term = (std_old**2 + (mean_old - mean_new) ** 2) / (2.0 * std_new**2)
    return (torch.log(std_new / std_old) + ratio_term - 0.5).sum(-1)


def adapt_learning_rate(lr: float, kl: float, desired_kl: float) -> float:
    """rsl_rl's rule: shrink the step when the policy moved too far, grow it when it barely did."""
    if kl > 2.0 * desired_kl:
        lr = lr / 1.5
    elif kl < desired_kl / 2.0:
        lr = lr * 1.5
    return min(max(lr, 1e-5), 1e-2)


@torch.no_grad()
def adapt_lr_scale(optimizers, mb: dict, old_std, new: dict, lr_scale: float, args: Args):
    """--desired-kl after a minibatch step: the rule applied to the Gaussian KL between the
    rollout's policy and the new one; returns the new lr scale, already set on every group."""
    kl = all_reduce_mean(gaussian_kl(mb["means"], old_std, new["means"], new["std"]).mean()).item()
    new_lr = adapt_learning_rate(lr_scale * args.learning_rate, kl, args.desired_kl)
    lr_scale = new_lr / args.learning_rate
    set_learning_rate(optimizers, lr_scale)
    return lr_scale


def bounds_loss(mean: torch.Tensor) -> torch.Tensor:
    """sum_j max(mu_j - 1, 0)^2 + min(mu_j + 1, 0)^2, batch mean: keeps the mean inside the action
    bounds, where the env's clipping would otherwise hide how far out it has drifted."""
    return ((mean - 1.0).clamp_min(0.0) ** 2 + (mean + 1.0).clamp_max(0.0) ** 2).sum(-1).mean()


def l2c2_loss(agent: Agent, obs: torch.Tensor, mean: torch.Tensor, noise: float) -> torch.Tensor:
    """L2C2 (Kobayashi 2022): mean ||mu(s + eps) - mu(s)||^2 / mean ||eps||^2 for uniform eps on
    the normalized observation; a Lipschitz-like penalty that makes the policy locally smooth."""
    agent = getattr(agent, "module", agent)  # around DDP is fine: it averages complete gradients
    x = agent.normalize(obs)[..., : agent.actor_dim]
    eps = (torch.rand_like(x) * 2.0 - 1.0) * noise
    change = ((agent.actor_mean(x + eps) - mean) ** 2).sum(-1).mean()
    return change / ((eps**2).sum(-1).mean() + 1e-8).detach()


def muon_params(agent: Agent) -> set[int]:
    """ids of the hidden weight matrices, whose updates Muon (Jordan et al. 2024) orthogonalizes;
    the first and last layers, the biases and the log-std stay with Adam."""
    hidden = set()
    for net in (agent.actor_mean, agent.critic):
        hidden |= {id(m.weight) for m in list(net)[2:-1] if isinstance(m, nn.Linear)}
    return hidden


def effective_rank(features: torch.Tensor) -> float:
    """exp(entropy of the normalized singular values) (Roy & Vetterli 2007): how many feature
    directions the actor really uses; a collapsing rank is a sign of lost plasticity."""
    if not torch.isfinite(features).all():  # a diverged update, which check_finite reports
        return math.nan
    s = torch.linalg.svdvals(features.double())
    p = s / s.sum().clamp_min(1e-12)
    return float(torch.exp(-(p * torch.log(p.clamp_min(1e-12))).sum()))


def dormant_fraction(activations: list[torch.Tensor], tau: float = 0.025) -> float:
    """The fraction of hidden units that are dormant (Sokar et al. 2023, "The Dormant Neuron
    Phenomenon in Deep RL"): whose mean |activation| over the batch, divided by the mean of that
    over its layer, is at most tau. Units that have stopped responding, which training rarely
    revives: another sign of lost plasticity."""
    scores = [h.abs().mean(0) / h.abs().mean().clamp_min(1e-12) for h in activations]
    return torch.cat(scores).le(tau).float().mean().item() if scores else 0.0  # a linear actor


@torch.no_grad()
def diagnostics(agent: Agent, batch: dict, ratios: torch.Tensor, args: Args) -> dict:
    """After the update: the ratios of its last epoch, the surrogate gain it achieved on the whole
    batch, the actor's effective rank, dormant units and std, and how well the critic explains the
    returns."""
    low, high = clip_range(args)
    outside = (ratios < 1 - low) | (ratios > 1 + high)
    new = agent.get_action_and_value(batch["obs"], batch["actions"])
    gain = (new["logprobs"] - batch["logprobs"]).exp() * batch["advantages"]
    x = agent.normalize(batch["obs"][:4096])[:, : agent.actor_dim]  # the actor's input
    hidden = []  # the actor's hidden activations
    for layer in agent.actor_mean[:-1]:
        x = layer(x)
        if isinstance(layer, nn.Tanh):
            hidden.append(x)
    var_y = batch["returns"].var()
    unexplained = (batch["returns"] - batch["values"]).var() / var_y
    return {
        "losses/ratio_dev_mean": (ratios - 1.0).abs().mean().item(),
        "losses/ratio_dev_max": (ratios - 1.0).abs().max().item(),
        "losses/ratio_outside_frac": outside.float().mean().item(),
        "charts/policy_gain": gain.mean().item(),
        "charts/actor_effective_rank": effective_rank(x),  # the last layer's input: its features
        "charts/actor_dormant_fraction": dormant_fraction(hidden),
        "charts/policy_std": new["std"].mean().item(),
        "losses/explained_variance": (1 - unexplained).item() if var_y > 0 else math.nan,
        "charts/advantage_mean": batch["advantages"].mean().item(),
        "charts/advantage_std": batch["advantages"].std().item(),
        "charts/value_mean": batch["values"].mean().item(),
    }


# Harness: checkpoints, resume, signals, evaluation, video, logging --------------------------------
def fail(message: str):
    """Bad input: one line on stderr and exit code 1, no traceback: rank 0's, under torchrun. The
    other ranks wait first: torchrun stops every rank once one exits, which could stop rank 0
    before it has printed; a rank that fails alone says why after the wait. torchrun's SIGTERM
    ends the wait at once: rank 0 has said why (the run's handler would wait for an iteration)."""
    rank_ = os.environ.get("RANK", "0") if "WORLD_SIZE" in os.environ else "0"  # RANK alone: none
    if rank_ != "0":
        with contextlib.suppress(ValueError):  # signals can be set on the main thread only
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        time.sleep(10.0)
    raise SystemExit(f"error: {message}" if rank_ == "0" else f"error (rank {rank_}): {message}")


def flag(name: str) -> str:
    """The command-line spelling of an Args field: learning_rate is --learning-rate."""
    return "--" + name.replace("_", "-")


def check_args(args: Args):
    """Bad input in one line, before anything runs: every number finite and in its range."""
    positive = ["total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs"]
    positive += ["eval_episodes", "threads", "learning_rate", "critic_learning_rate", "desired_kl"]
    positive += ["clip_coef", "clip_low", "clip_high", "max_grad_norm", "target_kl", "clip_obs"]
    positive += ["clip_reward", "l2c2_noise"]
    at_least_0 = ["seed", "ent_coef", "vf_coef", "weight_decay", "bounds_loss_coef", "l2c2_coef"]
    at_least_0 += ["checkpoint_every", "eval_every", "check_sync_every"]
    for name in [name for name in positive + at_least_0 if getattr(args, name) is not None]:
        value = getattr(args, name)  # (None: the flag's documented default applies)
        if isinstance(value, int) and value >= 2**63:  # torch's seed, TensorBoard's step: int64
            fail(f"{flag(name)} must lie in [{int(name in positive)}, 2**63 - 1], got {value}")
        if not math.isfinite(value) or value < 0 or (value == 0 and name in positive):
            fail(f"{flag(name)} must be {'positive' if name in positive else '>= 0'}, got {value}")
    for name in ("actor_layers", "critic_layers"):
        if not all(size > 0 for size in getattr(args, name)):
            fail(f"{flag(name)} must be positive sizes, got {getattr(args, name)}")
    check_envpool(args)  # Extras: EnvPool has the task (and --eval-command's slots); robot options
    if not (0.0 <= args.gamma <= 1.0 and 0.0 <= args.gae_lambda <= 1.0):
        fail("--gamma and --gae-lambda must lie in [0, 1]")
    if not math.isfinite(args.init_logstd):
        fail(f"--init-logstd must be a finite number, got {args.init_logstd}")
    if len(os.fsencode(f"{args.env_id}__{args.exp_name}")) > 200:  # a folder's name: 255 bytes
        fail(f"--exp-name is too long ({len(args.exp_name)} characters) for the run's folder name")
    if args.init_from is not None and args.resume is not None:
        fail("--init-from starts a new run from a checkpoint's weights, --resume goes on with its "
             "run: one or the other")  # fmt: skip
    if args.cuda and not torch.cuda.is_available():
        fail("--cuda is set (typed, or saved in the resumed run) but torch sees no CUDA device")
    if args.track and importlib.util.find_spec("wandb") is None:
        fail("--track needs wandb: pip install -r requirements-extras.txt")
    folders = {"--log-dir": args.log_dir} if args.eval_checkpoint is None else {}
    if args.resume is not None and os.path.exists(args.resume) and run_dir_of(args.resume, True):
        folders = {"--resume": run_dir_of(args.resume)}  # it goes on in its own folder
    folders.update({"--video-dir": args.video_dir} if args.capture_video else {})
    for name, path in folders.items():  # made now, and written to: os.access says yes to root
        try:
            os.makedirs(path, exist_ok=True)
            open(os.path.join(path, f".write-check-{os.getpid()}"), "w").close()
            os.remove(os.path.join(path, f".write-check-{os.getpid()}"))
        except OSError as e:
            fail(f"{name} {path}: cannot write there ({e.strerror})")


def plan_run(args: Args, ckpt: dict | None) -> dict:
    """The iterations to run, in whole batches up to --total-timesteps (a resume: from its step)."""
    global_step = 0 if ckpt is None else ckpt["global_step"]
    if ckpt is not None:
        if ckpt["env_id"] != args.env_id:
            fail(f"the checkpoint holds a policy for {ckpt['env_id']}, not for {args.env_id}")
        for name in ("actor_layers", "critic_layers", "optimizer", "asymmetric_critic",
                     "privileged_actor"):  # fmt: skip
            saved = ckpt["args"].get(name, False)  # privileged_actor: absent in older checkpoints
            if getattr(args, name) != saved:
                fail(f"{flag(name)} cannot change on resume (saved: {saved})")
    batch_size = args.num_envs * args.num_steps  # of one rank, in its minibatches
    if batch_size % args.num_minibatches:
        fail(f"batch size {batch_size} is not divisible by --num-minibatches "
             f"{args.num_minibatches}")  # fmt: skip
    if args.norm_adv and batch_size // args.num_minibatches < 2:
        fail("minibatches of one sample: the advantages of one sample cannot be normalized")
    batch_size *= world_size()  # of all ranks
    first_iteration = global_step // batch_size + 1
    last_iteration = first_iteration - 1 + (args.total_timesteps - global_step) // batch_size
    if last_iteration < first_iteration:
        if ckpt and ckpt["args"]["total_timesteps"] == args.total_timesteps:  # none typed
            fail(f"the run of {args.resume} is complete at step {global_step}; to train on, "
                 f"resume with a larger --total-timesteps (e.g. {2 * global_step})")  # fmt: skip
        fail(f"no whole batch of {batch_size} steps (ranks x envs x steps) fits between step "
             f"{global_step} and --total-timesteps {args.total_timesteps}")  # fmt: skip
    end_step = global_step + (last_iteration - first_iteration + 1) * batch_size
    if args.num_envs >= 256 or is_robot(args):  # gymnasium: 100 a second; EnvPool: 10 robots
        say(f"making {args.num_envs} envs")
    return {"first_iteration": first_iteration, "last_iteration": last_iteration,
            "batch_size": batch_size, "start_step": global_step, "end_step": end_step}  # fmt: skip


def start_run(args: Args, plan: dict, can_film: bool) -> dict:
    """The run's directory (a resume's own, if it has one), video folder, clock, start line."""
    run_dir = (args.resume and run_dir_of(args.resume, resume=True)) or new_run_dir(args)
    run = {**plan, "dir": run_dir, "checkpoint": os.path.join(run_dir, "checkpoint.pt")}
    run["videos"] = os.path.join(args.video_dir, os.path.basename(run_dir)) if can_film else None
    run["start_time"], run["eval_seconds"], note = time.time(), 0.0, ""
    if plan["end_step"] != args.total_timesteps and args.total_timesteps != Args.total_timesteps:
        note = f"note: training to step {plan['end_step']}: --total-timesteps "
        note += f"{args.total_timesteps} is not reached in whole batches of {plan['batch_size']}\n"
    if args.compile:
        note += "note: --compile: the first update compiles the loss first (about a minute)\n"
    run["start_line"] = (f"{note}{args.env_id}: iterations {plan['first_iteration']}-"
        f"{plan['last_iteration']} (batches of {plan['batch_size']} steps: {world_size()} rank"
        f"{'s' * (world_size() > 1)} x {args.num_envs} envs x {args.num_steps}) to step "
        f"{plan['end_step']}; logging to {run_dir}")  # fmt: skip
    return run


def new_run_dir(args: Args) -> str:
    """A folder of its own, made atomically (-2, -3, ... for runs started in the same second)."""
    name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    base = os.path.join(os.path.abspath(args.log_dir), re.sub(r"[^\w.-]", "_", name))  # ':' -> _
    for suffix in itertools.count(1):
        path = base if suffix == 1 else f"{base}-{suffix}"
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
            return path


def run_dir_of(path: str, resume: bool = False) -> str | None:
    """The run directory of a checkpoint (or the directory itself); resume: None if not a run's."""
    if os.path.isdir(path) or not resume or os.path.basename(path) in ("checkpoint.pt", "best.pt"):
        return os.path.abspath(path if os.path.isdir(path) else os.path.dirname(path))


def open_run(run: dict, args: Args):
    """Locks the run dir (freed at any exit), says the start line, opens TensorBoard (and W&B)."""
    file = open(os.open(os.path.join(run["dir"], ".lock"), os.O_RDWR | os.O_CREAT), "r+")
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fail(f"{run['dir']} is in use by process {file.read().strip()}; wait for it, or stop it")
    file.truncate(0)
    print(os.getpid(), file=file, flush=True)
    run["lock"] = file
    say(run["start_line"])
    if args.track:  # Extra: W&B mirrors every TensorBoard tag; a resumed run goes on in its run
        wandb, name = importlib.import_module("wandb"), os.path.basename(run["dir"])
        run_id = re.sub(r"[^A-Za-z0-9_-]", "-", name)[-64:]
        settings = dict(project=args.wandb_project_name, entity=args.wandb_entity, resume="allow")
        try:  # W&B's files: $WANDB_DIR or ./wandb (in the run directory it would sync its copies)
            wandb.init(id=run_id, name=name, config=vars(args), sync_tensorboard=True, **settings)
        except wandb.errors.UsageError as e:  # no login (no key, no terminal to ask on)
            fail(f"--track: {e} Or track offline: WANDB_MODE=offline (wandb sync uploads it later)")
    run["writer"] = SummaryWriter(run["dir"])
    table = "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
    run["writer"].add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")


def log_iteration(run: dict, metrics: dict, optimizers, carry: dict, progress: dict) -> dict:
    """The iteration's scalars to TensorBoard and its progress line; returns what was written."""
    step, logged, now = progress["global_step"], dict(metrics), time.time()
    seconds = now - run["start_time"] - run["eval_seconds"]  # training time only
    logged["charts/SPS"] = int((step - run["start_step"]) / seconds)
    if progress["iteration"] == run["first_iteration"]:  # the SPS and ETA from here: not warm-up's
        run["start_time"], run["start_step"] = now, step
    logged["charts/learning_rate"] = optimizers[0].param_groups[0]["lr"]
    logged["charts/command_scale"] = progress["command_scale"]  # robots: --command-curriculum
    for key, value in logged.items():
        run["writer"].add_scalar(key, value, step)
    shown, recent = "-", carry["episodes"][-10:]  # "-": until the first episode ends
    if recent:
        logged["charts/episodic_return"] = float(np.mean([e["return"] for e in recent]))
        logged["charts/episodic_length"] = float(np.mean([e["length"] for e in recent]))
        shown = f"{logged['charts/episodic_return']:.1f}{robot_measures(recent)}"
    eta = (run["end_step"] - step) / max(logged["charts/SPS"], 1)
    eta = f"{int(eta // 86400)}d {time.strftime('%H:%M:%S', time.gmtime(eta % 86400))}"
    say(f"iter {progress['iteration']}/{run['last_iteration']} | step {step} | return {shown} | "
        f"SPS {logged['charts/SPS']} | ETA {eta}")  # fmt: skip
    return logged


def check_finite(run: dict, metrics: dict, agent, progress: dict):
    """A NaN or inf loss, gradient norm or parameter ends the run in one line, before a save."""
    bad = [k for k, v in metrics.items() if k.startswith("losses/") and not math.isfinite(v)]
    bad = [k for k in bad if k != "losses/explained_variance"]  # NaN for constant returns
    bad += [name for name, p in agent.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        last = run["checkpoint"] if os.path.exists(run["checkpoint"]) else "none yet"
        fail(f"iteration {progress['iteration']} diverged ({', '.join(bad[:3])} not finite); try a "
             f"lower --learning-rate or --max-grad-norm; last good checkpoint: {last}")  # fmt: skip


def evaluate_and_save(run: dict, state: dict, stop: int) -> int:
    """--eval-every's evaluation (best.pt), checkpoint.pt; a signal in them: returned as stop."""
    agent, args, progress = state["agent"], state["args"], state["progress"]
    iteration, step = progress["iteration"], progress["global_step"]
    if args.eval_every and iteration % args.eval_every == 0:
        start = time.time()
        episodes, _ = evaluate(agent, args, run["videos"], f"eval_step{step}", run["signals"])
        run["eval_seconds"] += time.time() - start  # not training: left out of the SPS
        if episodes is None:  # a signal cut it short: stop after this iteration
            stop = run["signals"]["signum"]
        else:
            mean_return = float(np.mean([episode["return"] for episode in episodes]))
            say(f"eval at step {step}: {mean_return:.1f} over {len(episodes)} episode"
                f"{'s' * (len(episodes) != 1)}{robot_measures(episodes)} ({time.time() - start:.0f}"
                " s)")  # fmt: skip
            run["writer"].add_scalar("eval/periodic_return", mean_return, step)
            if mean_return > progress["best_eval"]:
                progress["best_eval"] = mean_return
                save_checkpoint(os.path.join(run["dir"], "best.pt"), **state)
    periodic = args.checkpoint_every > 0 and iteration % args.checkpoint_every == 0
    if periodic or stop or iteration == run["last_iteration"]:
        save_checkpoint(run["checkpoint"], **state)
    return stop


def finish_run(run: dict, state: dict, metrics: dict, stop: int) -> dict:
    """The last metrics with the final deterministic evaluation; after a signal, exit 128 + n."""
    agent, args, progress = state["agent"], state["args"], state["progress"]
    step, signals = progress["global_step"], run["signals"]
    if not stop:
        episodes, video = evaluate(agent, args, run["videos"], f"eval_step{step}", signals)
        stop = signals["signum"] if episodes is None else 0
    if stop:
        close_writer(run, args)
        then = f"resume with: {resume_command(run['checkpoint'])}"
        if step == run["end_step"]:  # stopped in the final evaluation: nothing left to train
            then = f"the run is complete; evaluate it with --eval-checkpoint {run['checkpoint']}"
        print(f"\n{signal.Signals(stop).name}: stopped at step {step}; {then}", file=sys.stderr)
        raise SystemExit(128 + stop)
    mean_return = float(np.mean([episode["return"] for episode in episodes]))
    metrics = {**metrics, "eval/episodic_return": mean_return, "global_step": step}
    run["writer"].add_scalar("eval/episodic_return", mean_return, step)
    close_writer(run, args, video)
    say(f"deterministic eval over {args.eval_episodes} episode{'s' * (args.eval_episodes != 1)}: "
        f"{mean_return:.1f}{robot_measures(episodes)}; checkpoint: "
        f"{run['checkpoint']}")  # fmt: skip
    return metrics


def close_writer(run: dict, args: Args, video: str | None = None):
    run["writer"].close()
    if args.track:  # Extra: the final video to W&B too
        wandb = importlib.import_module("wandb")
        if video and os.path.exists(video):
            wandb.log({"eval/video": wandb.Video(video, format="mp4")})
        wandb.finish()
        wandb.teardown()  # finish() may return before wandb's service has written the run out


def resume_command(checkpoint_path: str) -> str:
    launcher = f"torchrun --nproc_per_node {world_size()}" if world_size() > 1 else "python"
    return f"{launcher} {SCRIPT_NAME}.py --resume {os.path.normpath(checkpoint_path)}"


@contextlib.contextmanager
def run_guard(run: dict, args: Args):
    """open_run; a first SIGINT or SIGTERM sets "signum" (yielded), checked between iterations and
    evaluation steps (a KeyboardInterrupt can hang the writer's close()); a second stops at once."""
    stop, previous = {"signum": 0}, {}  # signal handlers can only be set on the main thread
    run["signals"], run["lock"] = stop, None
    if threading.current_thread() is threading.main_thread():
        handler = functools.partial(on_signal, stop)
        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    thread_hook, threading.excepthook = threading.excepthook, quiet_write_errors
    try:
        if run["dir"]:  # ppo_ddp: rank 0's
            open_run(run, args)
        yield stop
    except KeyboardInterrupt:  # the state may be half-updated, so none is saved
        last = run["checkpoint"] if os.path.exists(run["checkpoint"]) else "none yet"
        print(f"\nstopped at once, without saving; last checkpoint: {last}", file=sys.stderr)
        raise SystemExit(128 + (stop["signum"] or signal.SIGINT))
    except OSError as e:  # TensorBoard's log or a video
        fail(f"{(e.strerror or str(e)).lower()} while writing {e.filename or run['dir']}")
    except RuntimeError as e:  # Distributed: a collective whose peer has gone (killed, no memory)
        if not re.search(r"gloo|NCCL|[Cc]onnection", str(e)):  # a collective's error, or not
            raise
        why = re.sub(r"^\[[^\]]*\] ", "", str(e)).split(". ")[0]  # gloo's: "Read error ...: ..."
        last = run["checkpoint"] if os.path.exists(run["checkpoint"]) else "<run>/checkpoint.pt"
        who = "error" if rank() == 0 else f"error (rank {rank()})"
        line = f"{who}: another rank died ({why}); resume with: {resume_command(last)}"
        print(line, file=sys.stderr, flush=True)  # now: torchrun's SIGTERM may end it before exit
        raise SystemExit(1)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        threading.excepthook = thread_hook
        if run["lock"]:  # now, not when collected: train() may run again in this process
            run["lock"].close()


def say(line: str):
    """A progress line. A closed stdout (`| head`) never ends a run: devnull then, said once."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print("note: stdout is closed; the run goes on without progress lines", file=sys.stderr)


def on_signal(stop: dict, signum: int, frame):
    """run_guard's handler: the first signal is noted in stop, a second interrupts at once."""
    if stop["signum"]:
        raise KeyboardInterrupt
    stop["signum"] = signum
    os.write(2, f"\n{signal.Signals(signum).name}: stopping after this iteration\n".encode())


def quiet_write_errors(hook_args):
    """No traceback when TensorBoard's writer thread dies of a write error: run_guard says it."""
    if not issubclass(hook_args.exc_type, OSError):
        threading.__excepthook__(hook_args)


def save_checkpoint(path: str, agent, optimizers, reward_rms, args: Args, progress: dict):
    """Atomic: a crash or full disk keeps the last one (no .tmp). Envs reseed: torch's RNG only."""
    state = {"script": SCRIPT_NAME, "env_id": args.env_id, "args": dataclasses.asdict(args),
             "obs_dim": agent.obs_rms.mean.shape[0], "act_dim": agent.actor_logstd.shape[0],
             "actor_dim": agent.actor_dim,
             "agent": agent.state_dict(), "reward_rms": reward_rms.state_dict(),
             "optimizers": [opt.state_dict() for opt in optimizers],
             "rng": {"torch": torch.get_rng_state()}, **progress}  # fmt: skip
    data = io.BytesIO()  # serialized first: a full disk then fails in write(), with its errno
    torch.save(state, data)
    try:
        with open(f"{path}.tmp", "wb") as file:
            file.write(data.getbuffer())
        os.replace(f"{path}.tmp", path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(f"{path}.tmp")
        fail(f"{(e.strerror or str(e)).lower()} while writing {path}")


def load_checkpoint(path: str) -> dict:
    """weights_only: tensors and plain values, no code; a run directory means its checkpoint.pt."""
    path = os.path.join(path, "checkpoint.pt") if os.path.isdir(path) else path
    if not os.path.exists(path):
        fail(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except OSError as e:
        fail(f"cannot read checkpoint {path}: {e.strerror}")
    except Exception as e:  # noqa: BLE001 - torch raises many kinds for a file that is not its own
        if "GLOBAL" in str(e):  # a class or function to import: what a crafted file needs
            fail(f"refusing {path}: it holds objects other than tensors and plain values")
        fail(f"{path} is not a torch checkpoint (empty, corrupt or truncated)")
    script = ckpt.get("script") if isinstance(ckpt, dict) else None
    if script != SCRIPT_NAME:
        fail(f"{path} was not written by {SCRIPT_NAME}.py (script: {script})")
    missing = [key for key in CHECKPOINT_KEYS if key not in ckpt]
    if missing:
        fail(f"{path} is not a complete checkpoint (missing: {', '.join(missing)})")
    return ckpt


def resume_run(ckpt: dict, args: Args, agent, optimizers, reward_rms) -> dict:
    """Load the saved state into the new objects; return the run's progress."""
    agent.load_state_dict(ckpt["agent"])
    for opt, state in zip(optimizers, ckpt["optimizers"]):  # flags given now win over saved ones
        settings = [{k: v for k, v in group.items() if k != "params"} for group in opt.param_groups]
        opt.load_state_dict(state)
        for group, setting in zip(opt.param_groups, settings):
            group.update(setting)
    reward_rms.load_state_dict(ckpt["reward_rms"])
    if rank() == 0:  # the other ranks keep their own noise
        torch.set_rng_state(ckpt["rng"]["torch"])
    typed = {k: v for k, v in vars(args).items() if k not in ("resume", "log_dir", "init_from")}
    changed = ", ".join(f"{k}={v}" for k, v in typed.items() if ckpt["args"].get(k) != v) or "none"
    print(f"resuming {args.resume} at step {ckpt['global_step']}; changed: {changed}")
    if not run_dir_of(args.resume, resume=True):  # no run's checkpoint.pt or best.pt: committed
        print(f"note: {args.resume} stays as it is: a new run goes on from it (under --log-dir)")
    elif args.log_dir != ckpt["args"]["log_dir"]:
        print(f"note: --log-dir is ignored on resume: the run goes on in {run_dir_of(args.resume)}")
    keys = ("global_step", "iteration", "lr_scale", "best_eval", "command_scale")
    progress = {key: ckpt.get(key, 1.0) for key in keys}  # command_scale: 1.0 in older ones
    if not args.anneal_lr and args.desired_kl is None:  # a constant rate: the one typed now
        progress["lr_scale"] = 1.0
    return progress


def init_from(agent, args: Args):
    """--init-from: a checkpoint's networks and normalizer (not its optimizer, step or scaler)."""
    ckpt, path = load_checkpoint(args.init_from), args.init_from
    for name in ("actor_layers", "critic_layers"):
        saved = " ".join(map(str, ckpt["args"][name]))
        typed = " ".join(map(str, getattr(args, name)))
        if saved != typed:
            fail(f"--init-from {path}: its {flag(name)} are {saved}, not {typed}")
    dims = (agent.obs_rms.mean.shape[0], agent.actor_logstd.shape[0])
    if (ckpt["obs_dim"], ckpt["act_dim"]) != dims:
        fail(f"--init-from {path}: {ckpt['env_id']} has {ckpt['obs_dim']} observations and "
             f"{ckpt['act_dim']} actions, {args.env_id} {dims[0]} and {dims[1]}")  # fmt: skip
    try:
        agent.load_state_dict(ckpt["agent"])
    except RuntimeError as e:  # other state, e.g. a checkpoint edited by hand
        fail(f"--init-from {path}: other networks ({str(e).splitlines()[1].strip()})")
    other = f"; it was trained on {ckpt['env_id']}" if ckpt["env_id"] != args.env_id else ""
    print(f"note: starting from the networks and observation normalizer of {path} (step "
          f"{ckpt['global_step']}){other}")  # fmt: skip


def saved_args(ckpt: dict) -> Args:
    """A checkpoint's settings, less the fields this version lacks and --init-from (a start's)."""
    names = [field.name for field in dataclasses.fields(Args) if field.name != "init_from"]
    return Args(**{name: value for name, value in ckpt["args"].items() if name in names})


def parse_args(argv: list[str] | None = None) -> Args:
    """A --resume run's settings (--eval-checkpoint's env) are the defaults: a typed flag wins."""
    paths = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    paths.add_argument("--resume")
    paths.add_argument("--eval-checkpoint")
    found, default = paths.parse_known_args(argv)[0], Args()
    if found.eval_checkpoint is not None:  # its env, on the backend it was trained on
        saved = load_checkpoint(found.eval_checkpoint)["args"]
        default.env_id, default.env_backend = saved["env_id"], saved.get("env_backend", "gymnasium")
    elif found.resume is not None:
        default = saved_args(load_checkpoint(found.resume))
    about = f"{__doc__.splitlines()[0]}\n{{None}}|FLOAT: a number, or None (the default it names)."
    args = tyro.cli(Args, args=argv, default=default, description=about)
    if args.eval_checkpoint is not None and args.env_id != default.env_id:
        fail(f"{args.eval_checkpoint} holds a policy for {default.env_id}, not for {args.env_id}")
    return args


@torch.no_grad()
def evaluate(agent: Agent, args: Args, videos: str | None, name: str, stop: dict | None = None):
    """--eval-episodes with the mean action, in waves of 16 envs (bounded memory): the record of
    each (return, length, fell, robots' reward terms: as the rollout's), in order."""
    device, seed, episodes = agent.actor_logstd.device, args.seed + EVAL_SEED_OFFSET, []
    video, frames, fps = videos and f"{videos}/{name}.mp4", [], None
    if args.eval_episodes > 16:  # in waves: it takes a while, so say it
        say(f"evaluating {args.eval_episodes} episodes in waves of 16")
    for first in range(0, args.eval_episodes, 16):
        n, film = min(16, args.eval_episodes - first), bool(video) and first == 0
        render = render_kwargs(args.env_id, args.env_backend) if film else {}
        envs = make_envs(args.env_id, n, args.env_backend, **render, **eval_options(args))
        obs, _ = envs.reset(seed=seed + first)
        frames += [envs.envs[0].render()] if film else []
        wave, finished = [None] * n, np.zeros(n, dtype=bool)
        returns, lengths = np.zeros(n), np.zeros(n, dtype=int)
        while not finished.all() and not (stop and stop["signum"]):
            mean = agent.mean_action(to_tensor(obs, device))
            action = scale_action(mean.cpu().numpy(), envs.single_action_space)
            obs, reward, terminated, truncated, info = envs.step(action)
            done = terminated | truncated
            if film and not (finished[0] or done[0]):  # once done, env 0 shows the next episode
                frames.append(envs.envs[0].render())
            returns, lengths = returns + reward * ~finished, lengths + ~finished
            for i in np.flatnonzero(done & ~finished):  # each env's first episode only
                terms = {name: means[i] for name, means in info.get("reward_terms", {}).items()}
                wave[i] = {"return": returns[i], "length": lengths[i], "fell": terminated[i],
                           "terms": terms}  # fmt: skip
            finished |= done
        fps = envs.envs[0].metadata.get("render_fps", 30) if film else fps  # the first wave's
        envs.close()
        if not finished.all():  # stopped by a signal
            return None, video
        episodes += wave
    if video:
        os.makedirs(os.path.dirname(video), exist_ok=True)
        importlib.import_module("imageio").mimsave(video, frames, fps=fps)
        say(f"wrote {video}")
    return episodes, video


def evaluate_checkpoint(args: Args, can_film: bool) -> dict[str, float]:
    """--eval-checkpoint: the saved policy's deterministic return; with --capture-video, filmed."""
    ckpt = load_checkpoint(args.eval_checkpoint)
    agent = Agent(ckpt["obs_dim"], ckpt["act_dim"], saved_args(ckpt), ckpt.get("actor_dim"))
    agent.load_state_dict(ckpt["agent"])
    videos = os.path.join(args.video_dir, os.path.basename(run_dir_of(args.eval_checkpoint)))
    args = dataclasses.replace(args, env_id=ckpt["env_id"])
    say(f"evaluating {args.eval_checkpoint} (step {ckpt['global_step']}) on {args.env_id}: "
        f"{args.eval_episodes} episode{'s' * (args.eval_episodes != 1)}")  # fmt: skip
    name = f"eval_checkpoint_step{ckpt['global_step']}_{int(time.time())}"  # a re-film: new file
    episodes, _ = evaluate(agent, args, videos if can_film else None, name)
    returns = np.array([episode["return"] for episode in episodes])
    say(f"{args.env_id}: deterministic return {returns.mean():.1f} ± {returns.std():.1f} over "
        f"{len(returns)} episode{'s' * (len(returns) != 1)}{robot_measures(episodes)}")  # fmt: skip
    return {"eval/episodic_return": float(returns.mean())}


class CheckedEnv(gym.wrappers.FlattenObservation):
    """Each env of make_envs: observations flattened, Box actions, a NaN or inf: one line."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        if not isinstance(self.observation_space, gym.spaces.Box):  # a Graph or Sequence inside
            fail(f"{env.spec.id}: its observation space cannot be flattened into a vector")
        if not isinstance(self.action_space, gym.spaces.Box):
            fail(f"{env.spec.id} has a {type(env.action_space).__name__} action space; this "
                 "script needs Box (continuous) actions")  # fmt: skip
        if not np.isfinite([self.action_space.low, self.action_space.high]).all():
            fail(f"{env.spec.id}: its action Box has infinite bounds ({self.action_space}); they "
                 "must be finite (actions are scaled to them), or wrap it to rescale")  # fmt: skip
        self.steps = 0

    def observation(self, obs):  # reset()'s and step()'s, before flattening
        space = self.env.observation_space
        if isinstance(space, gym.spaces.Box) and np.shape(obs) != space.shape:
            fail(f"{self.spec.id} returned an observation of shape {np.shape(obs)} at its step "
                 f"{self.steps}; its observation space declares {space.shape}")  # fmt: skip
        return super().observation(obs)

    def step(self, action):
        self.steps += 1
        obs, reward, terminated, truncated, info = super().step(action)
        if not (math.isfinite(reward) and np.isfinite(obs).all()):
            fail(f"{self.spec.id} returned a non-finite observation or reward at its step "
                 f"{self.steps} (reward {reward})")  # fmt: skip
        return obs, reward, terminated, truncated, info


class EnvPoolVectorEnv:
    """--env-backend envpool in make_envs's contract: a done env is reset by id at once (EnvPool's
    NEXT_STEP: a step later), reset(seed=s) makes a new seeded pool; a Dict obs is laid flat."""

    def __init__(self, env_id: str, num_envs: int, reward: str = "env", command=None, **kwargs):
        if importlib.util.find_spec("envpool") is None:
            fail("--env-backend envpool needs EnvPool: pip install -r requirements-envpool.txt")
        envpool = importlib.import_module("envpool")
        if env_id not in envpool.list_all_envs():  # its version too: Hopper-v4 is not Hopper-v5
            fail(f"EnvPool has no {env_id} (envpool.list_all_envs()){other_ids(env_id, envpool)}")
        make = envpool.make_gymnasium  # one thread: one core for each process
        self.make = functools.partial(make, env_id, num_envs=num_envs, num_threads=1, **kwargs)
        self.num_envs, self.pool, self.reward, self.envs = num_envs, self.make(), reward, [self]
        self.robot = RobotSteps(self.pool.spec.config, reward, fixed_command(env_id, command))
        self.gl, self.metadata = filming(env_id, kwargs)  # Extra: --capture-video's GL context, fps
        space, self.single_action_space = self.pool.observation_space, self.pool.action_space
        self.keys = list(getattr(space, "spaces", {}))  # a robot's: state, privileged_state
        sizes = [space[key].shape for key in self.keys] if self.keys else [space.shape]
        vectors = {len(size) for size in sizes} == {1}  # not pixels, not a board
        seen, acts = self.keys or space.shape, type(self.single_action_space).__name__
        if not vectors or self.keys not in ([], ["state", "privileged_state"]) or acts != "Box":
            fail(f"EnvPool's {env_id} observes {seen}, acts in {acts}: the scripts need a vector "
                 "or Dict(state, privileged_state), and Box actions")  # fmt: skip
        self.actor_dim = sizes[0][0]  # the Agent's actor reads these first columns
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (sum(s[0] for s in sizes),))

    def flat(self, obs):
        obs = with_command(obs, self.robot.command)  # Extra: --eval-command's, in its slots
        return np.concatenate([obs[key] for key in self.keys], -1) if self.keys else obs

    def reset(self, seed: int, options: dict | None = None):  # options: make-time ones
        self.pool.close()
        seeds = [(seed + i) % 2**31 for i in range(self.num_envs)]  # int32
        self.pool = self.make(seed=seeds, **(options or {}))
        self.robot.sums = {}  # Extras: each reward term's sum per env, over its episode
        return self.flat(self.pool.reset()[0]), {}

    def step(self, actions: np.ndarray):
        obs, rewards, terminated, truncated, raw = self.pool.step(actions)
        rewards, info = self.robot.step(raw, rewards, obs, terminated | truncated)  # Extras
        obs, done = self.flat(obs), np.flatnonzero(terminated | truncated)
        if done.size:  # SAME_STEP: the next episode's first obs in place, the last one kept
            info["final_obs"] = obs.copy()
            obs[done] = self.flat(self.pool.reset(env_id=done)[0])
        return obs, rewards, terminated, truncated, info

    def render(self):  # --capture-video: env 0's frame (evaluate films envs[0]: the adapter)
        return self.pool.render()[0]

    def close(self):
        self.pool.close()


def start_mujoco(args: Args) -> bool:
    """MUJOCO_GL before any env loads MuJoCo; whether to film (a frame rendered, or why not)."""
    if args.capture_video and not os.environ.get("DISPLAY"):
        os.environ.setdefault("MUJOCO_GL", "egl")
    error = rendering_error(args.env_id, args.env_backend) if args.capture_video else None
    try:
        importlib.import_module("mujoco").set_mju_user_warning(mujoco_warning)
    except ModuleNotFoundError:  # no MuJoCo: other gymnasium envs still work
        pass
    except Exception as e:  # noqa: BLE001 - the GL library failed (osmesa without libosmesa6)
        error = error or f"MUJOCO_GL={os.environ.get('MUJOCO_GL')}: {type(e).__name__}: {e}"
        os.environ["MUJOCO_GL"] = "disable"
        importlib.import_module("mujoco").set_mju_user_warning(mujoco_warning)
    if args.capture_video and error:
        print(f"warning: --capture-video: cannot render {args.env_id} offscreen ({error}); set "
              "MUJOCO_GL=egl (apt-get install libegl1 libgl1-mesa-dri) or MUJOCO_GL=osmesa "
              "(libosmesa6). Training continues without video.", file=sys.stderr)  # fmt: skip
    return args.capture_video and not error


def mujoco_warning(message: str):
    """MuJoCo's warnings, less the one gymnasium's HalfCheetah XML gives for every env."""
    if "settotalmass" not in message:
        print(f"MuJoCo warning: {message}", file=sys.stderr)


def render_kwargs(env_id: str, backend: str) -> dict:
    # MuJoCo renders on the CPU: a small frame keeps a 1000-step video at about a minute.
    mujoco = backend == "gymnasium" and "mujoco" in str(gym.spec(env_id).entry_point)
    return {"render_mode": "rgb_array", **({"width": 320, "height": 240} if mujoco else {})}


def rendering_error(env_id: str, backend: str) -> str | None:
    """A frame rendered in a child (a failing GL library can kill its process): None, or why not."""
    probe = f"import os, sys\nsys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
    probe += f"try:\n    import imageio_ffmpeg, {SCRIPT_NAME} as s\n    a = {[env_id, backend]}\n"
    probe += "    envs = s.make_envs(a[0], 1, a[1], **s.render_kwargs(*a))\n"
    probe += "    envs.reset(seed=0)\n    assert envs.envs[0].render() is not None, 'no frame'\n"
    probe += "except Exception as e:\n    print(f'{type(e).__name__}: {e}'.splitlines()[0])\n"
    probe += "    os._exit(1)  # no __del__ of a half-built renderer"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    error = result.stdout.strip() or f"exit code {result.returncode}"
    return f"MUJOCO_GL={os.environ.get('MUJOCO_GL')}: {error}" if result.returncode else None


if __name__ == "__main__":
    try:
        train(parse_args())
    except KeyboardInterrupt:  # Ctrl-C outside a run (start-up, --eval-checkpoint): nothing to save
        raise SystemExit(128 + signal.SIGINT)
    except BrokenPipeError:  # `--help | head`: the reader has gone (a run's lines go through say)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1)
    finally:  # also after an error: the other ranks see this one leave instead of waiting for it
        if dist.is_initialized():
            traceback.clear_frames(sys.exc_info()[2])  # an error's train() frame held its DDP
            dist.destroy_process_group()  # stops gloo's threads before Python shuts down (README)
