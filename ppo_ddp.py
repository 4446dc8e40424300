"""PPO for continuous actions on several processes with DistributedDataParallel (CleanRL style).

A copy of ppo_continuous.py; `diff ppo_continuous.py ppo_ddp.py` shows the distributed code. Every
process (rank) steps its own vector env, and DDP averages the gradients of each minibatch over the
ranks, so all ranks take the same optimizer step on a global batch of world_size x num_envs x num_steps:
* the agent is wrapped in DDP once; the update's forward pass goes through the wrapper (DDP only
  averages the gradients of passes through it), and checkpoints hold the plain agent's state;
* the normalizers merge their statistics over the ranks after every rollout, and advantages are
  normalized with the mean and std of the global batch, so every rank computes the same thing;
* rank 0 alone logs, prints, evaluates and writes checkpoints (loadable with any world size);
* the ranks check now and then that their parameters and statistics are still bit-identical.

Proximal Policy Optimization (Schulman et al. 2017, arXiv:1707.06347) with the details that
matter on MuJoCo ("The 37 Implementation Details of PPO", Huang et al. 2022), done correctly:

* time-limit truncation bootstraps from the final observation; termination does not;
* observation normalization lives inside the agent, uses one running mean/var for the whole
  vector batch, is frozen during rollout and update, and is saved with every checkpoint;
* rewards are scaled by the running std of the discounted return (state saved too);
* actor and critic have their own learning rates and their own gradient clipping.

Run:   torchrun --standalone --nproc_per_node 2 ppo_ddp.py --env-id Hopper-v5
       python ppo_ddp.py --env-id Hopper-v5    (one process, no process group)
Help:  python ppo_ddp.py --help
"""

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
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, Optional

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
# Imported before any process group exists: imported later (DDP does, through torch._dynamo), its
# default arguments would keep the group alive, and destroy_process_group() could not stop gloo's
# threads (see __main__).
import torch.distributed.nn  # noqa: F401
import torch.nn as nn
import tyro
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.tensorboard import SummaryWriter

SCRIPT_NAME = "ppo_ddp"  # stored in checkpoints so that another script's checkpoint is refused
EVAL_SEED_OFFSET = 10_000  # evaluation episodes use seeds the training envs never see
LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
# A rank waits at most this long for the others (e.g. while rank 0 evaluates or saves); a dead peer
# normally breaks the connection at once and torchrun stops the job, this is the last resort.
DIST_TIMEOUT = timedelta(minutes=10)


@dataclass
class Args:
    exp_name: str = SCRIPT_NAME
    """name of this experiment (part of the run directory name)"""
    seed: int = 1
    """seed of the experiment (env i of rank r gets seed + r * num_envs + i)"""
    torch_deterministic: bool = True
    """use deterministic torch algorithms, so the same seed gives the same run"""
    cuda: bool = False
    """train on the GPU of the local rank, gradients averaged with NCCL (rollouts stay on the CPU)"""
    threads: int = 1
    """torch CPU threads; 1 is fastest for small networks, the env uses the other core"""
    log_dir: str = "runs"
    """runs are written to {log_dir}/{env_id}__{exp_name}__{seed}__{time}"""

    # Algorithm
    env_id: str = "Hopper-v5"
    """id of a gymnasium environment with a Box action space"""
    total_timesteps: int = 1_000_000
    """total environment steps (over all envs of all ranks)"""
    learning_rate: float = 3e-4
    """learning rate of the actor (Adam), and of the critic unless --critic-learning-rate is given"""
    critic_learning_rate: Optional[float] = None
    """learning rate of the critic; None: the same as --learning-rate"""
    num_envs: int = 8
    """number of parallel environments in the vector env of each rank"""
    num_steps: int = 256
    """steps per environment per rollout; batch = num_envs * num_steps per rank, x world_size in all"""
    anneal_lr: bool = True
    """decay the learning rates linearly to 0 over training"""
    desired_kl: Optional[float] = None
    """if set, adapt the learning rates to keep the Gaussian KL near this value (rsl_rl rule)"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """lambda of generalized advantage estimation"""
    num_minibatches: int = 8
    """minibatches per epoch (each rank takes the same number from its share of the batch)"""
    update_epochs: int = 10
    """passes over the batch per update"""
    norm_adv: bool = True
    """normalize advantages once per update, with the mean and std of the global batch (all ranks)"""
    clip_coef: float = 0.2
    """surrogate clipping epsilon (both sides unless --clip-low / --clip-high are set)"""
    clip_low: Optional[float] = None
    """epsilon_low of an asymmetric clip range [1 - clip_low, 1 + clip_high]; None: --clip-coef"""
    clip_high: Optional[float] = None
    """epsilon_high of an asymmetric clip range; None: --clip-coef"""
    clip_vloss: bool = False
    """clip the value loss around the old values (CleanRL does; it usually hurts slightly)"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """max gradient norm, applied to actor and critic separately"""
    target_kl: Optional[float] = None
    """stop the epochs of an update early once approx_kl exceeds this"""
    actor_layers: tuple[int, ...] = (64, 64)
    """hidden layer sizes of the actor MLP"""
    critic_layers: tuple[int, ...] = (64, 64)
    """hidden layer sizes of the critic MLP"""
    init_logstd: float = -0.5
    """initial log standard deviation of the Gaussian policy in the [-1, 1] action space (std 0.61:
    less random flailing early on; Andrychowicz et al. 2021 recommend an initial std of about 0.5)"""
    optimizer: Literal["adam", "muon"] = "adam"
    """adam, or muon: torch.optim.Muon on the 2-D hidden weights and Adam on the rest"""
    weight_decay: float = 0.0
    """weight decay of every parameter group of both optimizers (Adam: L2; Muon: decoupled)"""
    compile: bool = False
    """torch.compile the loss computation of the update"""
    bounds_loss_coef: float = 0.0
    """penalty on the actor mean leaving the action bounds [-1, 1] (0: off)"""
    l2c2_coef: float = 0.0
    """weight of the L2C2 local smoothness regularizer of the actor (0: off)"""
    l2c2_noise: float = 0.1
    """half-width of the uniform noise added to normalized observations for L2C2"""

    # Normalization
    norm_obs: bool = True
    """normalize observations with a running mean/std kept inside the agent"""
    norm_reward: bool = True
    """scale rewards by the running std of the discounted return"""
    clip_obs: float = 10.0
    """clip normalized observations to [-clip_obs, clip_obs]"""
    clip_reward: float = 10.0
    """clip scaled rewards to [-clip_reward, clip_reward]"""

    # Checkpoints and evaluation
    checkpoint_every: int = 50
    """write runs/<run>/checkpoint.pt every N iterations (0: only at the end and on Ctrl-C)"""
    resume: Optional[str] = None
    """continue the run saved in this checkpoint (the flags you type override the saved ones)"""
    eval_checkpoint: Optional[str] = None
    """only evaluate the policy in this checkpoint, then exit"""
    eval_every: int = 0
    """evaluate every N iterations and keep the best policy as best.pt (0: off)"""
    eval_episodes: int = 10
    """episodes of the deterministic final evaluation"""
    capture_video: bool = False
    """record the first episode of each evaluation as MP4 under {video_dir}/<run>/ (software rendering is slow)"""
    video_dir: str = "videos"
    """where --capture-video writes its MP4 files"""

    # Distributed
    check_sync_every: int = 50
    """check every N iterations (and at the end) that all ranks hold identical parameters (0: only at the end)"""


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
# Distributed: every helper is the identity without a process group (plain `python ppo_ddp.py`)
# ---------------------------------------------------------------------------------------------
def init_distributed(args: Args) -> tuple[int, int, torch.device]:
    """Join the process group torchrun describes in RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT;
    without them run alone (rank 0 of 1, no process group). Returns rank, world size, device."""
    if "RANK" not in os.environ:
        return 0, 1, torch.device("cuda" if args.cuda else "cpu")
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cpu")
    if args.cuda:
        if local_rank >= torch.cuda.device_count():
            fail(f"local rank {local_rank} has no GPU (torch sees {torch.cuda.device_count()}); lower --nproc-per-node")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        # NCCL for DDP's CUDA gradients; gloo for the small CPU tensors and objects (statistics, episodes).
        dist.init_process_group("cpu:gloo,cuda:nccl" if args.cuda else "gloo", timeout=DIST_TIMEOUT)
    return dist.get_rank(), dist.get_world_size(), device


def all_reduce_mean(x: torch.Tensor) -> torch.Tensor:
    """Mean of x over the ranks."""
    if not dist.is_initialized():
        return x
    x = x.clone()
    dist.all_reduce(x)
    return x / dist.get_world_size()


def gather_objects(items: list) -> list:
    """Every rank's list, concatenated in rank order, on every rank."""
    if not dist.is_initialized():
        return items
    lists = [None] * dist.get_world_size()
    dist.all_gather_object(lists, items)
    return [item for rank_items in lists for item in rank_items]


def broadcast_from_rank0(value: float) -> float:
    """Rank 0's value on every rank (for results only rank 0 computes, such as the evaluation)."""
    if not dist.is_initialized():
        return value
    x = torch.tensor([value], dtype=torch.float64)
    dist.broadcast(x, src=0)
    return x.item()


def check_in_sync(*modules: nn.Module):
    """Fail loudly unless all ranks hold bit-identical parameters and normalizer statistics. DDP only
    keeps them identical if every rank takes the same steps with the same averaged gradients: a forward
    pass that bypasses the wrapper, or a per-rank decision (early stop, learning rate), breaks that."""
    if not dist.is_initialized():
        return
    state = torch.cat([t.detach().reshape(-1).double().cpu() for m in modules for t in m.state_dict().values()])
    reference = state.clone()
    dist.broadcast(reference, src=0)
    differ = torch.tensor([float(not torch.equal(state, reference))])
    dist.all_reduce(differ)  # every rank learns the verdict, so all fail together instead of some hanging
    if differ.item() > 0:
        raise RuntimeError(f"parameters out of sync: {int(differ.item())} of {dist.get_world_size()} ranks differ from rank 0")
    if dist.get_rank() == 0:
        print(f"parameters in sync across {dist.get_world_size()} ranks", flush=True)


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


def merge_rank_moments(counts: torch.Tensor, means: torch.Tensor, vars_: torch.Tensor):
    """(count, mean, population variance) of the union of R data sets from their stacked moments
    (counts [R], means and vars_ [R, ...]): the parallel-variance formula for R sets at once,
    M2 = sum_r M2_r + n_r (mean_r - mean)^2, with M2_r = n_r var_r."""
    n = counts.reshape(-1, *[1] * (means.dim() - 1))
    count = counts.sum()
    mean = (n * means).sum(0) / count
    m2 = (n * vars_ + n * (means - mean) ** 2).sum(0)
    return count, mean, m2 / count


def gather_moments(count: torch.Tensor, mean: torch.Tensor, var: torch.Tensor):
    """Every rank's (count, mean, var), stacked [world_size, ...], on every rank, with one all-reduce:
    each rank fills its own row of a zero matrix, so the sum is the stack (exact: x + 0 = x)."""
    if not dist.is_initialized():
        return count.reshape(1), mean[None], var[None]
    k = mean.numel()
    rows = torch.zeros(dist.get_world_size(), 1 + 2 * k, dtype=torch.float64, device=mean.device)
    rows[dist.get_rank()] = torch.cat([count.reshape(1), mean.reshape(-1), var.reshape(-1)]).double()
    dist.all_reduce(rows)
    return rows[:, 0], rows[:, 1:1 + k].reshape(-1, *mean.shape), rows[:, 1 + k:].reshape(-1, *mean.shape)


class RunningMeanStd(nn.Module):
    """Running mean and variance as buffers, so they are part of the state dict (and checkpoints)."""

    def __init__(self, shape=()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor):
        """Merge in the batch x of every rank, so that all ranks keep identical statistics."""
        x = x.reshape(-1, *self.mean.shape).to(torch.float64)
        n = torch.tensor(float(x.shape[0]), dtype=torch.float64, device=x.device)
        batch = merge_rank_moments(*gather_moments(n, x.mean(0), x.var(0, unbiased=False)))
        count, mean, var = merge_moments(self.count, self.mean, self.var, *batch)
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

    def forward(self, obs: torch.Tensor, action: torch.Tensor):
        """The update's pass: called through the DDP wrapper, whose gradient averaging is armed only by
        its own forward (a direct agent.get_action_and_value would leave the gradients local)."""
        return self.get_action_and_value(obs, action)

    def actor_features(self, obs: torch.Tensor) -> torch.Tensor:
        """Output of the actor's last hidden layer (for the effective-rank diagnostic)."""
        return self.actor_mean[:-1](self.normalize(obs))


# ---------------------------------------------------------------------------------------------
# Algorithm
# ---------------------------------------------------------------------------------------------
def compute_gae(rewards, values, next_values, terminated, dones, gamma: float, gae_lambda: float):
    """Generalized advantage estimation (Schulman et al. 2016, eq. 16), time-major [T, N].

    next_values[t] is V(s_{t+1}) of the same episode (V(final_obs) where it was truncated).
    terminated[t] cuts the bootstrap (no value after a terminal state); dones[t] = terminated or
    truncated cuts the trace, because s_{t+1} in the buffer belongs to a new episode.
    """
    delta = rewards + gamma * next_values * (1.0 - terminated) - values
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        last = delta[t] + gamma * gae_lambda * (1.0 - dones[t]) * last
        advantages[t] = last
    return advantages, advantages + values


def gaussian_kl(mean_old, std_old, mean_new, std_new) -> torch.Tensor:
    """KL(old || new) of diagonal Gaussians, summed over action dims (analytic, as in rsl_rl)."""
    return (
        torch.log(std_new / std_old) + (std_old**2 + (mean_old - mean_new) ** 2) / (2.0 * std_new**2) - 0.5
    ).sum(-1)


def adapt_learning_rate(lr: float, kl: float, desired_kl: float) -> float:
    """rsl_rl's rule: shrink the step when the policy moved too far, grow it when it barely moved."""
    if kl > 2.0 * desired_kl:
        lr = lr / 1.5
    elif kl < desired_kl / 2.0:
        lr = lr * 1.5
    return min(max(lr, 1e-5), 1e-2)


def bounds_loss(mean: torch.Tensor) -> torch.Tensor:
    """sum_j max(mu_j - 1, 0)^2 + min(mu_j + 1, 0)^2, batch mean: keeps the Gaussian's mean inside the
    action bounds, where the env's clipping would otherwise hide how far out it has drifted."""
    return ((mean - 1.0).clamp_min(0.0) ** 2 + (mean + 1.0).clamp_max(0.0) ** 2).sum(-1).mean()


def l2c2_loss(agent: Agent, obs: torch.Tensor, mean: torch.Tensor, noise: float) -> torch.Tensor:
    """L2C2 (Kobayashi 2022): mean ||mu(s + eps) - mu(s)||^2 / mean ||eps||^2 for uniform eps on the
    normalized observation; a Lipschitz-like penalty that makes the policy locally smooth."""
    x = agent.normalize(obs)
    eps = (torch.rand_like(x) * 2.0 - 1.0) * noise
    change = ((agent.actor_mean(x + eps) - mean) ** 2).sum(-1).mean()
    return change / ((eps**2).sum(-1).mean() + 1e-8).detach()


def ppo_loss(agent: Agent, obs, actions, old_logprobs, advantages, returns, old_values, args: Args):
    """Clipped surrogate (PPO paper eq. 7, asymmetric range), value loss and entropy of a minibatch.

    agent is the DDP-wrapped agent (the plain one without a process group); the advantages come
    normalized with global statistics (see train). Returns the loss to minimize, the log-ratio and
    ratio, the policy's mean and std, and a dict of the loss terms for logging."""
    _, newlogprob, entropy, newvalue, mean, std = agent(obs, actions)
    logratio = newlogprob - old_logprobs
    ratio = logratio.exp()
    clip_low = args.clip_coef if args.clip_low is None else args.clip_low
    clip_high = args.clip_coef if args.clip_high is None else args.clip_high
    pg_loss = -torch.min(ratio * advantages, ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages).mean()

    if args.clip_vloss:
        v_clipped = old_values + (newvalue - old_values).clamp(-args.clip_coef, args.clip_coef)
        v_loss = 0.5 * torch.max((newvalue - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean()
    entropy_loss = entropy.mean()
    loss = pg_loss - args.ent_coef * entropy_loss + args.vf_coef * v_loss
    terms = {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy_loss}
    if args.bounds_loss_coef > 0:
        terms["bounds_loss"] = bounds_loss(mean)
        loss = loss + args.bounds_loss_coef * terms["bounds_loss"]
    if args.l2c2_coef > 0:
        # A second actor pass outside the wrapper is fine: DDP averages a parameter's gradient once it is
        # complete (all uses of the parameter summed), and its forward above armed the hooks.
        terms["l2c2_loss"] = l2c2_loss(getattr(agent, "module", agent), obs, mean, args.l2c2_noise)
        loss = loss + args.l2c2_coef * terms["l2c2_loss"]
    return loss, logratio, ratio, mean, std, terms


def effective_rank(features: torch.Tensor) -> float:
    """exp(entropy of the normalized singular values) (Roy & Vetterli 2007): how many feature
    directions the actor really uses; a collapsing rank is a sign of lost plasticity."""
    s = torch.linalg.svdvals(features.double())
    p = s / s.sum().clamp_min(1e-12)
    return float(torch.exp(-(p * torch.log(p.clamp_min(1e-12))).sum()))


def make_optimizers(agent: Agent, args: Args) -> list[torch.optim.Optimizer]:
    """Actor and critic in separate parameter groups, each remembering its initial learning rate.
    fused=True: Adam updates all parameters in one kernel; with networks this small the per-op
    overhead of the default implementation is a tenth of the whole update's time."""
    critic_lr = args.learning_rate if args.critic_learning_rate is None else args.critic_learning_rate
    groups = [("actor", [*agent.actor_mean.parameters(), agent.actor_logstd], args.learning_rate),
              ("critic", list(agent.critic.parameters()), critic_lr)]
    # Muon orthogonalizes the update of hidden weight matrices; first/last layers, biases and the
    # log-std stay with Adam (Jordan et al. 2024). "match_rms_adamw" lets it share Adam's lr.
    hidden = set()
    if args.optimizer == "muon":
        for net in (agent.actor_mean, agent.critic):
            hidden |= {id(m.weight) for m in list(net)[2:-1] if isinstance(m, nn.Linear)}
    muon_groups, adam_groups = [], []
    for name, params, lr in groups:
        group = {"lr": lr, "initial_lr": lr, "name": name, "weight_decay": args.weight_decay}
        muon_groups.append({**group, "params": [p for p in params if id(p) in hidden]})
        adam_groups.append({**group, "params": [p for p in params if id(p) not in hidden]})
    muon_groups = [g for g in muon_groups if g["params"]]
    optimizers = [torch.optim.Adam(adam_groups, eps=1e-5, fused=True)]
    if muon_groups:
        optimizers.append(torch.optim.Muon(muon_groups, adjust_lr_fn="match_rms_adamw"))
    return optimizers


def set_learning_rate(optimizers, scale: float):
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * scale


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
    for name in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "eval_episodes", "threads"):
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches:
        fail(f"batch size num_envs * num_steps = {batch_size} is not divisible by --num-minibatches {args.num_minibatches}")
    if args.learning_rate <= 0 or (args.critic_learning_rate is not None and args.critic_learning_rate <= 0):
        fail("learning rates must be positive")
    if args.desired_kl is not None and args.desired_kl <= 0:
        fail(f"--desired-kl must be positive, got {args.desired_kl}")
    if not (0.0 <= args.gamma <= 1.0 and 0.0 <= args.gae_lambda <= 1.0):
        fail("--gamma and --gae-lambda must lie in [0, 1]")
    if args.cuda and not torch.cuda.is_available():
        fail("--cuda is set (typed, or saved in the resumed run) but torch sees no CUDA device")
    if args.check_sync_every < 0:
        fail(f"--check-sync-every must be >= 0, got {args.check_sync_every}")


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
    rank, world_size, device = init_distributed(args)
    batch_size = args.num_envs * args.num_steps  # per rank; the optimizer steps on world_size times as much
    global_batch_size = world_size * batch_size
    minibatch_size = batch_size // args.num_minibatches
    global_step = 0 if ckpt is None else ckpt["global_step"]
    # Whole batches only, never past --total-timesteps. Iterations count global batches of the
    # current size, so a resume with another world or batch size goes on from the saved step.
    start_iteration = global_step // global_batch_size + 1
    num_iterations = start_iteration - 1 + (args.total_timesteps - global_step) // global_batch_size
    if num_iterations < start_iteration:
        fail(f"no whole batch of {global_batch_size} steps (ranks x envs x steps) fits between "
             f"step {global_step} and --total-timesteps {args.total_timesteps}")

    # Each rank explores with its own envs and noise (env seeds do not overlap between ranks); the
    # initial weights are rank 0's all the same, because DDP broadcasts them when it wraps the agent.
    seed = args.seed + rank * args.num_envs
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(args.torch_deterministic, warn_only=True)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    envs = make_envs(args.env_id, args.num_envs, seed)
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    act_dim = int(np.prod(envs.single_action_space.shape))
    agent = Agent(obs_dim, act_dim, args).to(device)
    optimizers = make_optimizers(agent, args)
    reward_rms = RunningMeanStd()  # of the discounted return, for reward scaling
    # Per-env discounted return; the envs start fresh episodes on resume, so it starts at zero.
    discounted_return = np.zeros(args.num_envs)
    if ckpt is not None:
        check_spaces(ckpt, args.env_id, obs_dim, act_dim)
        agent.load_state_dict(ckpt["agent"])
        for opt, state in zip(optimizers, ckpt["optimizers"]):
            opt.load_state_dict(state)
        reward_rms.load_state_dict(ckpt["reward_rms"])
        if rank == 0:  # the checkpoint holds rank 0's generators; the other ranks keep their own seeds
            set_rng_states(ckpt["rng"])
        run_dir = os.path.dirname(os.path.abspath(args.resume))
        changed = [f"{k}={v}" for k, v in dataclasses.asdict(args).items()
                   if k != "resume" and ckpt["args"].get(k) != v]
        if rank == 0:
            changed_text = ", ".join(changed) or "none"
            print(f"resuming {args.resume} at step {global_step}; changed: {changed_text}")
    else:
        run_dir = os.path.join(args.log_dir, f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}")
    # DDP wraps the agent in place: the optimizers and checkpoints keep using the same parameters through
    # the plain `agent` (checkpoint keys without "module.", so any world size can load them). Wrapping the
    # whole agent, not actor_mean and critic apart, also covers actor_logstd.
    # broadcast_buffers=False: DDP never copies rank 0's buffers; the normalizers merge their
    # statistics over the ranks in RunningMeanStd.update.
    # DDP averages the gradients during loss.backward(), in buckets overlapped with the backward pass. The
    # manual alternative, without DDP, would be after loss.backward():
    #     for p in agent.parameters(): dist.all_reduce(p.grad); p.grad /= world_size
    # Never both: the gradients would be averaged twice (double the traffic for nothing) and, if the
    # manual step summed without dividing, scaled by world_size.
    ddp_agent = agent
    if dist.is_initialized():
        with warnings.catch_warnings():  # torch 2.13 deprecates the keyword; torch 2.x all take it
            warnings.filterwarnings("ignore", "`broadcast_buffers` is deprecated", FutureWarning)
            ddp_agent = DDP(agent, device_ids=[device.index] if args.cuda else None,
                            broadcast_buffers=False)
    writer = None
    if rank == 0:
        os.makedirs(run_dir, exist_ok=True)
        writer = SummaryWriter(run_dir)
        writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in vars(args).items()))
    loss_fn = torch.compile(ppo_loss) if args.compile else ppo_loss
    actor_params = [*agent.actor_mean.parameters(), agent.actor_logstd]
    critic_params = list(agent.critic.parameters())
    lr_scale = ckpt["lr_scale"] if ckpt is not None else 1.0
    best_eval = ckpt["best_eval"] if ckpt is not None else -math.inf

    # Rollout storage (time-major [T, N]); observations are stored raw, the agent normalizes.
    obs_buf = torch.zeros((args.num_steps, args.num_envs, obs_dim), device=device)
    actions_buf = torch.zeros((args.num_steps, args.num_envs, act_dim), device=device)
    logprobs_buf, values_buf, final_values_buf = (torch.zeros((args.num_steps, args.num_envs), device=device) for _ in range(3))
    means_buf = torch.zeros((args.num_steps, args.num_envs, act_dim), device=device)
    # What the env returns stays in numpy until the rollout ends: one conversion instead of one per step.
    rewards_np, discounted_np = np.zeros((args.num_steps, args.num_envs)), np.zeros((args.num_steps, args.num_envs))
    terminated_np, truncated_np = (np.zeros((args.num_steps, args.num_envs), dtype=bool) for _ in range(2))

    def checkpoint_state(iteration: int) -> dict:
        return {"script": SCRIPT_NAME, "env_id": args.env_id, "obs_dim": obs_dim, "act_dim": act_dim,
                "args": dataclasses.asdict(args), "agent": agent.state_dict(),
                "optimizers": [opt.state_dict() for opt in optimizers], "reward_rms": reward_rms.state_dict(),
                "global_step": global_step, "iteration": iteration,
                "lr_scale": lr_scale, "best_eval": best_eval,
                "rng": rng_states()}

    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
    video_error = None
    if args.capture_video and rank == 0:
        video_error = gl_error or rendering_error(args.env_id)
    if video_error:
        print(f"warning: --capture-video: cannot render {args.env_id} offscreen ({video_error}); without a screen set "
              "MUJOCO_GL=egl (Debian: apt-get install libegl1 libgl1-mesa-dri) or MUJOCO_GL=osmesa (libosmesa6). "
              "Training continues without video.", file=sys.stderr)

    def video_path() -> Optional[str]:
        if not args.capture_video or video_error:
            return None
        return os.path.join(args.video_dir, os.path.basename(run_dir), f"eval_step{global_step}.mp4")
    episode_returns, episode_lengths = [], []
    running_return, running_length = np.zeros(args.num_envs), np.zeros(args.num_envs, dtype=int)
    next_obs_np, _ = envs.reset(seed=seed + global_step)
    next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32, device=device)
    metrics: dict[str, float] = {}
    start_time, start_step = time.time(), global_step
    end_step = global_step + (num_iterations - start_iteration + 1) * global_batch_size
    iteration = start_iteration - 1
    if rank == 0:
        print(f"{args.env_id}: iterations {start_iteration}-{num_iterations} of "
              f"{global_batch_size} steps ({world_size} ranks x {args.num_envs} envs x "
              f"{args.num_steps}; {batch_size} per rank), minibatch {minibatch_size} per rank "
              f"({world_size * minibatch_size} in all); logging to {run_dir}", flush=True)
        if end_step != args.total_timesteps:
            print(f"note: training to step {end_step}: --total-timesteps {args.total_timesteps} is "
                  f"not reached in whole batches of {global_batch_size}")
    saved_step = None if ckpt is None else global_step  # the step checkpoint.pt holds
    ctrl_c = threading.Event()
    previous_sigint = catch_ctrl_c(ctrl_c)
    try:
        for iteration in range(start_iteration, num_iterations + 1):
            # Ctrl-C (torchrun passes it on to every rank): all ranks stop between the same two
            # iterations, where all state is consistent, and none waits in a collective for one
            # that has left.
            if all_reduce_mean(torch.tensor([float(ctrl_c.is_set())])).item() > 0:
                envs.close()
                if rank == 0:
                    save_checkpoint(checkpoint_path, checkpoint_state(iteration - 1))
                    writer.close()
                    print(f"\ninterrupted at step {global_step}; "
                          f"resume with --resume {checkpoint_path}", file=sys.stderr)
                raise SystemExit(130)
            if args.anneal_lr and args.desired_kl is None:
                lr_scale = 1.0 - (iteration - 1.0) / num_iterations
            set_learning_rate(optimizers, lr_scale)

            # --- Rollout: the policy and the normalizer are frozen. ---
            agent.eval()
            finished_episodes = []
            with torch.no_grad():
                for step in range(args.num_steps):
                    global_step += args.num_envs * world_size
                    obs_buf[step] = next_obs
                    action, logprob, _, value, mean, _ = agent.get_action_and_value(next_obs)
                    actions_buf[step], logprobs_buf[step], values_buf[step], means_buf[step] = action, logprob, value, mean
                    next_obs_np, reward, terminated, truncated, info = envs.step(
                        scale_action(action.cpu().numpy(), envs.single_action_space))
                    done = terminated | truncated
                    next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32, device=device)
                    rewards_np[step], terminated_np[step], truncated_np[step] = reward, terminated, truncated

                    running_return += reward
                    running_length += 1
                    for i in np.flatnonzero(done):
                        finished_episodes.append((global_step, running_return[i], running_length[i]))
                    running_return[done], running_length[done] = 0.0, 0

                    discounted_return = discounted_return * args.gamma + reward
                    discounted_np[step] = discounted_return
                    discounted_return[done] = 0.0
                    # The obs returned for a finished episode is already the reset obs of the next one, so a
                    # truncated episode bootstraps from V(final_obs); a terminated one needs no value.
                    if truncated.any():
                        idx = np.flatnonzero(truncated)
                        final_obs = torch.as_tensor(np.stack(info["final_obs"][idx]), dtype=torch.float32, device=device)
                        final_values_buf[step, idx] = agent.get_value(final_obs)
                # V(s_{t+1}) of the same episode is the value the next step computed anyway (one critic pass
                # per step), except after a truncation, where it is V(final_obs).
                next_values = torch.cat((values_buf[1:], agent.get_value(next_obs)[None]))
                next_values = torch.where(torch.as_tensor(truncated_np, device=device), final_values_buf, next_values)
            rewards_buf = torch.as_tensor(rewards_np, dtype=torch.float32, device=device)
            terminated_buf = torch.as_tensor(terminated_np, dtype=torch.float32, device=device)
            dones_buf = torch.as_tensor(terminated_np | truncated_np, dtype=torch.float32, device=device)

            # The episodes of all ranks:
            for episode_end, episode_return, episode_length in gather_objects(finished_episodes):
                episode_returns.append(episode_return)
                episode_lengths.append(episode_length)
                if rank == 0:
                    writer.add_scalar("charts/episodic_return", episode_return, episode_end)
                    writer.add_scalar("charts/episodic_length", episode_length, episode_end)

            if args.norm_reward:  # scale by the std of the discounted return, this rollout included
                reward_rms.update(torch.as_tensor(discounted_np))
                rewards_buf = (rewards_buf / torch.sqrt(reward_rms.var.float() + 1e-8)).clamp(-args.clip_reward, args.clip_reward)
            advantages, returns = compute_gae(rewards_buf, values_buf, next_values, terminated_buf, dones_buf,
                                              args.gamma, args.gae_lambda)
            # Advantages are normalized once, with the mean and std of the global batch: every rank scales
            # its share the same way (per-minibatch normalization would need an all-reduce per minibatch).
            norm_advantages = advantages
            if args.norm_adv:
                adv_count = torch.tensor(float(advantages.numel()), dtype=torch.float64, device=device)
                _, adv_mean, adv_var = merge_rank_moments(*gather_moments(
                    adv_count, advantages.double().mean(), advantages.double().var(unbiased=False)))
                norm_advantages = (advantages - adv_mean.float()) / (adv_var.float().sqrt() + 1e-8)

            # --- Update: the normalizer stays frozen; it learns from this rollout afterwards. ---
            agent.train()
            b_obs, b_actions = obs_buf.reshape(-1, obs_dim), actions_buf.reshape(-1, act_dim)
            b_logprobs, b_advantages, b_returns, b_values, b_norm_advantages = (
                x.reshape(-1) for x in (logprobs_buf, advantages, returns, values_buf, norm_advantages))
            b_means, b_std = means_buf.reshape(-1, act_dim), agent.actor_logstd.detach().exp().expand(batch_size, act_dim).clone()
            stats: dict[str, list[torch.Tensor]] = {}
            clip_low = args.clip_coef if args.clip_low is None else args.clip_low
            clip_high = args.clip_coef if args.clip_high is None else args.clip_high
            for epoch in range(args.update_epochs):
                last_epoch_ratios = []
                perm = torch.randperm(batch_size, device=device)
                for start in range(0, batch_size, minibatch_size):
                    mb = perm[start:start + minibatch_size]
                    loss, logratio, ratio, mean, std, terms = loss_fn(ddp_agent, b_obs[mb], b_actions[mb], b_logprobs[mb],
                                                                      b_norm_advantages[mb], b_returns[mb], b_values[mb], args)
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
                            # Averaged over the ranks: a per-rank learning rate would pull the parameters apart.
                            gkl = all_reduce_mean(gaussian_kl(b_means[mb], b_std[mb], mean, std).mean()).item()
                            lr_scale = adapt_learning_rate(lr_scale * args.learning_rate, gkl, args.desired_kl) / args.learning_rate
                            set_learning_rate(optimizers, lr_scale)
                        for key, value in (*terms.items(), ("approx_kl", kl), ("old_approx_kl", (-logratio).mean()),
                                           ("clipfrac", ((ratio < 1 - clip_low) | (ratio > 1 + clip_high)).float().mean()),
                                           ("clipfrac_high", (ratio > 1 + clip_high).float().mean()),
                                           ("clipfrac_low", (ratio < 1 - clip_low).float().mean()),
                                           ("actor_grad_norm", gn_actor), ("critic_grad_norm", gn_critic)):
                            stats.setdefault(key, []).append(value.detach())
                        last_epoch_ratios.append(ratio.detach())
                # All ranks must stop at the same epoch: one that went on would wait forever for the others.
                if args.target_kl is not None and all_reduce_mean(kl).item() > args.target_kl:
                    break

            with torch.no_grad():
                stats = {k: torch.stack(v).float().mean().item() for k, v in stats.items()}
                last_ratios = torch.cat(last_epoch_ratios)
                ratio_dev = (last_ratios - 1.0).abs()
                # After the update: the surrogate gain the update achieved, on the whole batch.
                _, newlogprob, _, newvalues, _, policy_std = agent.get_action_and_value(b_obs, b_actions)
                policy_gain = ((newlogprob - b_logprobs).exp() * b_advantages).mean().item()
                erank = effective_rank(agent.actor_features(b_obs[: min(batch_size, 4096)]))
                var_y = b_returns.var()
                explained_var = (1 - (b_returns - b_values).var() / var_y).item() if var_y > 0 else float("nan")
                if args.norm_obs:
                    agent.obs_rms.update(b_obs)

            sps = int((global_step - start_step) / (time.time() - start_time))
            metrics = {
                **{f"losses/{k}": v for k, v in stats.items()},
                "charts/learning_rate": optimizers[0].param_groups[0]["lr"], "charts/SPS": sps,
                "losses/explained_variance": explained_var, "losses/ratio_dev_mean": ratio_dev.mean().item(),
                "losses/ratio_dev_max": ratio_dev.max().item(),
                "losses/ratio_outside_frac": ((last_ratios < 1 - clip_low) | (last_ratios > 1 + clip_high)).float().mean().item(),
                "charts/advantage_mean": b_advantages.mean().item(), "charts/advantage_std": b_advantages.std().item(),
                "charts/value_mean": b_values.mean().item(), "charts/policy_std": policy_std.mean().item(),
                "charts/policy_gain": policy_gain, "charts/actor_effective_rank": erank,
            }
            # Each rank measured its own share of the batch: log the mean over the ranks.
            rank_mean = all_reduce_mean(torch.tensor(list(metrics.values()), dtype=torch.float64))
            metrics = dict(zip(metrics, rank_mean.tolist()))
            for key, value in metrics.items():
                if rank == 0:
                    writer.add_scalar(key, value, global_step)
            shown_return = "-"  # until the first episode ends
            if episode_returns:
                metrics["charts/episodic_return"] = float(np.mean(episode_returns[-10:]))
                metrics["charts/episodic_length"] = float(np.mean(episode_lengths[-10:]))
                shown_return = f"{metrics['charts/episodic_return']:.1f}"
            eta = (end_step - global_step) / max(sps, 1)
            if rank == 0:
                print(f"iter {iteration}/{num_iterations} | step {global_step} | "
                      f"return {shown_return} | SPS {sps} | "
                      f"ETA {int(eta // 60)}m{int(eta % 60):02d}s", flush=True)
            if args.check_sync_every and iteration % args.check_sync_every == 0:
                check_in_sync(agent, reward_rms)

            # Rank 0 alone evaluates and saves; the others run on and wait for it at the next collective.
            if rank == 0 and args.eval_every and iteration % args.eval_every == 0:
                eval_return = float(np.mean(evaluate(agent, args.env_id, args.eval_episodes, args.seed + EVAL_SEED_OFFSET,
                                                     device, video_path())))
                writer.add_scalar("eval/periodic_return", eval_return, global_step)
                if eval_return > best_eval:
                    best_eval = eval_return
                    save_checkpoint(os.path.join(run_dir, "best.pt"), checkpoint_state(iteration))
            if rank == 0 and args.checkpoint_every and iteration % args.checkpoint_every == 0:
                save_checkpoint(checkpoint_path, checkpoint_state(iteration))
                saved_step = global_step
    except KeyboardInterrupt:  # a second Ctrl-C: the state may be half-updated, so none is saved
        last = "none yet" if saved_step is None else f"{checkpoint_path} (step {saved_step})"
        if rank == 0:
            print(f"\nstopped at once, without saving; last checkpoint: {last}", file=sys.stderr)
        raise SystemExit(130)
    finally:
        if previous_sigint is not None:
            signal.signal(signal.SIGINT, previous_sigint)
        del ddp_agent  # also when an exception leaves (its traceback keeps the frame): see __main__

    check_in_sync(agent, reward_rms)
    envs.close()
    metrics["global_step"] = global_step
    eval_return = float("nan")
    if rank == 0:
        save_checkpoint(checkpoint_path, checkpoint_state(iteration))
        eval_return = float(np.mean(evaluate(agent, args.env_id, args.eval_episodes, args.seed + EVAL_SEED_OFFSET,
                                             device, video_path())))
        writer.add_scalar("eval/episodic_return", eval_return, global_step)
        writer.close()
        print(f"deterministic eval over {args.eval_episodes} episodes: {eval_return:.1f}; checkpoint: {checkpoint_path}")
    metrics["eval/episodic_return"] = broadcast_from_rank0(eval_return)  # the others wait here for rank 0
    return metrics


if __name__ == "__main__":
    try:
        train(parse_args())
    finally:  # also after an error, so that the other ranks see this one leave instead of waiting for it
        if dist.is_initialized():
            # Frees the group, which first stops gloo's worker threads: one still releasing the last
            # collective's tensors while Python shuts down aborts the process (std::terminate).
            dist.destroy_process_group()
