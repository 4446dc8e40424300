"""Tests of ppo_ddp.py beyond the shared PPO-family tests (which run it as a single process).

The multi-process tests start `torchrun --standalone --nproc_per_node 2` (as `python -m
torch.distributed.run`, the same program) on the CPU with the gloo backend.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from conftest import ROOT, flags, read_events, torchrun

import ppo_ddp

ENV_ID = "Walker2d-v5"
SMALL = flags(env_id=ENV_ID, num_envs=2, num_steps=64, num_minibatches=2, update_epochs=2)
SMALL += flags(eval_episodes=2)


# ---------------------------------------------------------------------------------------------
# Merging the normalizer statistics of several ranks
# ---------------------------------------------------------------------------------------------
def test_without_a_process_group_the_helpers_are_the_identity():
    # Bit for bit: one process trains exactly as before (the numbers do not move).
    x = torch.tensor(np.random.default_rng(0).normal(3.0, 2.0, size=(37, 3)))
    count, mean, var = ppo_ddp.all_moments(x)
    assert count == 37
    assert torch.equal(mean, x.mean(0)) and torch.equal(var, x.var(0, unbiased=False))
    assert ppo_ddp.all_reduce_mean(torch.tensor(2.5)).item() == 2.5
    ppo_ddp.init_distributed(ppo_ddp.Args())  # no RANK in the environment: no process group
    assert ppo_ddp.rank() == 0 and ppo_ddp.world_size() == 1
    ppo_ddp.check_in_sync(torch.nn.Linear(2, 2), ppo_ddp.RunningMeanStd())  # nothing to compare


# The checks run in one torchrun job (each launch costs seconds); each prints its own verdict.
TWO_RANK_CHECKS = """
import time, traceback
import torch, torch.distributed as dist, ppo_ddp
from torch.nn.parallel import DistributedDataParallel as DDP


def all_moments(rank):
    # Each rank its own data, far apart in mean and scale; every rank knows both batches.
    data = torch.randn(2, 50, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    scale = torch.tensor([2.0, 0.5], dtype=torch.float64).reshape(2, 1, 1)
    data = data * scale + torch.tensor([3.0, -1.0], dtype=torch.float64).reshape(2, 1, 1)
    count, mean, var = ppo_ddp.all_moments(data[rank])
    both = data.reshape(100, 3)
    assert count == 100, count
    torch.testing.assert_close(mean, both.mean(0), rtol=1e-12, atol=0)
    torch.testing.assert_close(var, both.var(0, unbiased=False), rtol=1e-12, atol=0)


def global_advantages(rank):
    # Each rank's advantages far apart in mean and scale; every rank knows both.
    gen = torch.Generator().manual_seed(0)
    both = torch.randn(2, 64, generator=gen) * torch.tensor([[3.0], [0.5]])
    both = both + torch.tensor([[2.0], [-1.0]])
    args = ppo_ddp.Args(num_minibatches=4, update_epochs=1, norm_obs=False)
    agent = ppo_ddp.Agent(3, 2, args)
    obs, actions = torch.randn(64, 3, generator=gen), torch.randn(64, 2, generator=gen)
    batch = {"obs": obs, "actions": actions}
    with torch.no_grad():
        out = agent.get_action_and_value(batch["obs"], batch["actions"])
    batch.update(logprobs=out["logprobs"], values=out["values"], means=out["means"])
    batch.update(advantages=both[rank], returns=torch.zeros(64))
    seen = []

    def recording_loss(agent, mb, args):
        seen.append(mb["advantages"].clone())
        return ppo_ddp.ppo_loss(agent, mb, args)

    optimizers = ppo_ddp.make_optimizers(agent, args)
    ppo_ddp.ppo_update(agent, optimizers, recording_loss, batch, 1.0, args)
    flat = both.double().flatten()  # population moments of the global batch
    std = flat.var(unbiased=False).sqrt().float()
    expected = (both[rank] - flat.mean().float()) / (std + 1e-8)
    torch.testing.assert_close(torch.cat(seen).sort().values, expected.sort().values)


def manual_all_reduce(rank):
    # Two epochs on each rank's own batch from the same start, through DDP and with --no-ddp (the
    # gradients all-reduced by hand): the same gradient norms and losses, the same parameters.
    gen = torch.Generator().manual_seed(rank)
    obs, actions = torch.randn(64, 3, generator=gen), torch.randn(64, 2, generator=gen)
    advantages = torch.randn(64, generator=gen)
    outcome = {}
    for ddp in (True, False):
        args = ppo_ddp.Args(num_minibatches=2, update_epochs=2, norm_obs=False, ddp=ddp)
        torch.manual_seed(0)
        agent = ppo_ddp.Agent(3, 2, args)
        with torch.no_grad():
            out = agent.get_action_and_value(obs, actions)
        batch = {"obs": obs, "actions": actions, "logprobs": out["logprobs"]}
        batch.update(values=out["values"], means=out["means"], advantages=advantages)
        batch["returns"] = torch.ones(64)
        model = DDP(agent) if ddp else agent
        optimizers = ppo_ddp.make_optimizers(agent, args)
        torch.manual_seed(1)  # the same minibatches
        metrics, _ = ppo_ddp.ppo_update(model, optimizers, ppo_ddp.ppo_loss, batch, 1.0, args)
        outcome[ddp] = (metrics, [p.detach().clone() for p in agent.parameters()])
    for key in ("losses/actor_grad_norm", "losses/critic_grad_norm", "losses/policy_loss"):
        assert abs(outcome[True][0][key] - outcome[False][0][key]) < 1e-5, key
    for with_ddp, by_hand in zip(outcome[True][1], outcome[False][1]):
        torch.testing.assert_close(with_ddp, by_hand)
    ppo_ddp.check_in_sync(agent, ppo_ddp.RunningMeanStd())  # both ranks hold the same parameters


def target_kl_agreed(rank):
    # --target-kl where the ranks' own KLs disagree: rank 0's is 1, rank 1's 0. Every rank stops
    # after the epoch where their mean (0.5) passes the target, or goes on where it does not. The
    # loss bypasses DDP, so a rank that stopped alone would not hang the other: the epochs counted.
    gen = torch.Generator().manual_seed(rank)
    obs, actions = torch.randn(64, 3, generator=gen), torch.randn(64, 2, generator=gen)
    for target, epochs in ((0.4, 1), (0.6, 3)):
        args = ppo_ddp.Args(num_minibatches=2, update_epochs=3, norm_obs=False, target_kl=target)
        agent = ppo_ddp.Agent(3, 2, args)
        with torch.no_grad():
            out = agent.get_action_and_value(obs, actions)
        batch = {"obs": obs, "actions": actions, "logprobs": out["logprobs"]}
        batch.update(values=out["values"], means=out["means"], advantages=torch.randn(64))
        batch["returns"] = torch.ones(64)
        calls = []

        def own_kl(wrapper, mb, args):
            loss, terms, new = ppo_ddp.ppo_loss(wrapper.module, mb, args)
            calls.append(1)
            terms["approx_kl"] = torch.tensor(1.0 if rank == 0 else 0.0)
            return loss, terms, new

        wrapper = type("Wrapper", (), {"module": agent})()
        optimizers = ppo_ddp.make_optimizers(agent, args)
        ppo_ddp.ppo_update(wrapper, optimizers, own_kl, batch, 1.0, args)
        assert len(calls) == epochs * 2, (target, len(calls))


def sync_check_compares_buffers(rank):
    # The same parameters on both ranks, and on rank 1 other statistics: of the observation
    # normalizer (the agent's buffers), then of the reward scaler. The check must fail on both.
    sleep, time.sleep = time.sleep, lambda seconds: None  # rank 1's fail() waits for rank 0's line
    try:
        for name in ("obs_rms", "reward_rms"):
            torch.manual_seed(0)
            agent, reward_rms = ppo_ddp.Agent(3, 2, ppo_ddp.Args()), ppo_ddp.RunningMeanStd()
            if rank == 1:  # (by hand: update() merges the statistics of both ranks)
                for buffer in (agent.obs_rms if name == "obs_rms" else reward_rms).buffers():
                    buffer.add_(1.0)
            try:
                ppo_ddp.check_in_sync(agent, reward_rms)
                raise AssertionError(f"other {name} statistics passed the check")
            except SystemExit as e:
                expected = f"ranks differ from rank 0 in {name}.mean, {name}.var, {name}.count"
                assert str(e).endswith(expected), str(e)
    finally:
        time.sleep = sleep


dist.init_process_group("gloo")
rank = dist.get_rank()
checks = (all_moments, global_advantages, manual_all_reduce, target_kl_agreed)
for check in (*checks, sync_check_compares_buffers):
    try:
        check(rank)
        print(f"rank {rank}: {check.__name__} passed", flush=True)
    except AssertionError:
        print(f"rank {rank}: {check.__name__} failed:", traceback.format_exc(), flush=True)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def two_rank_checks(tmp_path_factory):
    """What the two ranks of TWO_RANK_CHECKS printed."""
    driver = tmp_path_factory.mktemp("checks") / "driver.py"
    driver.write_text(TWO_RANK_CHECKS)
    proc = torchrun(str(driver))
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    return out


def test_all_moments_equal_the_statistics_of_both_ranks_data(two_rank_checks):
    assert two_rank_checks.count("all_moments passed") == 2, two_rank_checks


def test_advantages_are_normalized_with_the_global_batch(two_rank_checks):
    assert two_rank_checks.count("global_advantages passed") == 2, two_rank_checks


def test_no_ddp_averages_the_gradients_by_hand_as_ddp_does(two_rank_checks):
    assert two_rank_checks.count("manual_all_reduce passed") == 2, two_rank_checks


def test_target_kl_stops_every_rank_at_the_same_epoch_on_the_mean_kl(two_rank_checks):
    assert two_rank_checks.count("target_kl_agreed passed") == 2, two_rank_checks


def test_the_sync_check_compares_the_normalizers_statistics_too(two_rank_checks):
    assert two_rank_checks.count("sync_check_compares_buffers passed") == 2, two_rank_checks


# ---------------------------------------------------------------------------------------------
# Two ranks on the CPU
# ---------------------------------------------------------------------------------------------
# The jobs of the fixtures below run the script through this driver, so that each also shows
# that destroy_process_group stops gloo's threads, at the end of a run and after SIGTERM.
LATE_COLLECTIVE = """
import os, runpy, sys, time, torch, torch.distributed as dist

def destroy_during_a_late_collective(destroy=dist.destroy_process_group):
    # Rank 1 leaves while a gloo worker thread still runs a collective on a tensor that rank 0 joins
    # a second later: on a loaded machine the script's last collective can end as late.
    x, rank = torch.ones(1), dist.get_rank()
    if rank == 1:
        dist.all_reduce(x, async_op=True)
    else:
        time.sleep(1)
        dist.all_reduce(x)
    destroy()
    if not os.path.isdir("/proc/self/task"):
        return
    tasks = os.listdir("/proc/self/task")
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in tasks]
    left = names.count("pt_gloo_runloop")
    # sys.__stdout__: the script silences the sys.stdout of every rank but 0.
    print(f"rank {rank}: {left} gloo worker threads left", file=sys.__stdout__, flush=True)

dist.destroy_process_group = destroy_during_a_late_collective
sys.argv = sys.argv[1:]  # the script and its flags
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def torchrun_script(tmp_path_factory, *flags: str):
    """torchrun of ppo_ddp.py with these flags, through the LATE_COLLECTIVE driver."""
    driver = tmp_path_factory.mktemp("driver") / "late_collective.py"
    driver.write_text(LATE_COLLECTIVE)
    return torchrun(str(driver), "ppo_ddp.py", *flags)


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    """4 iterations of 2 ranks x 2 envs x 64 steps, with every option that needs a decision shared
    by the ranks (adaptive learning rate, early stop) and a second actor pass (L2C2), checked every
    iteration."""
    log_dir = tmp_path_factory.mktemp("runs")
    proc = torchrun_script(
        tmp_path_factory,
        *SMALL,
        *flags(total_timesteps=1024, check_sync_every=1, eval_every=2, checkpoint_every=1),
        *flags(desired_kl=0.01, target_kl=0.02, l2c2_coef=0.1, log_dir=log_dir),
    )
    out, err = proc.communicate(timeout=180)
    return proc.returncode, out, err, log_dir


def test_two_ranks_train_in_sync(two_rank_run):
    returncode, out, err, log_dir = two_rank_run
    assert returncode == 0, err[-3000:]
    assert "iterations 1-4 (batches of 256 steps: 2 ranks x 2 envs x 64)" in out
    assert out.count("parameters in sync across 2 ranks") == 4  # every iteration, the last included
    assert (
        out.count("iter 1/4") == 1 and out.count("deterministic eval") == 1
    )  # rank 0 alone prints
    assert "ETA -" not in out and "Warning" not in err
    (run_dir,) = log_dir.iterdir()  # rank 0 alone writes
    assert {"checkpoint.pt", "best.pt"} <= {p.name for p in run_dir.iterdir()}
    ckpt = ppo_ddp.load_checkpoint(str(run_dir / "checkpoint.pt"))
    assert ckpt["global_step"] == 1024 and not any(k.startswith("module.") for k in ckpt["agent"])
    assert ckpt["agent"]["obs_rms.count"].item() == pytest.approx(
        1e-4 + 1024
    )  # statistics of both ranks


def test_two_rank_checkpoint_evaluates_the_same_in_one_process(two_rank_run):
    returncode, out, _, log_dir = two_rank_run
    assert returncode == 0
    printed = float(re.search(r"deterministic eval over 2 episodes: (-?[\d.]+)", out).group(1))
    metrics = ppo_ddp.train(
        ppo_ddp.Args(eval_checkpoint=str(next(log_dir.glob("*/checkpoint.pt"))), eval_episodes=2)
    )
    assert metrics["eval/episodic_return"] == pytest.approx(
        printed, abs=0.051
    )  # same policy, same eval seeds


def test_two_ranks_resume_with_other_settings(two_rank_run, tmp_path):
    returncode, _, _, log_dir = two_rank_run
    assert returncode == 0
    copy = tmp_path / "checkpoint.pt"
    shutil.copy(next(log_dir.glob("*/checkpoint.pt")), copy)
    # 2 ranks x 1 env x 64 steps = 128 per iteration: steps 1024 -> 1280 are iterations 9 and 10.
    proc = torchrun(
        "ppo_ddp.py",
        *flags(resume=str(copy), num_envs=1, total_timesteps=1280, check_sync_every=1),
    )
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    assert out.count("resuming") == 1 and "num_envs=1" in out  # rank 0 alone prints
    assert "iterations 9-10 (batches of 128 steps: 2 ranks" in out and "ETA -" not in out
    assert ppo_ddp.load_checkpoint(str(copy))["global_step"] == 1280


def test_two_rank_checkpoint_resumes_in_one_process(two_rank_run, tmp_path):
    returncode, _, _, log_dir = two_rank_run
    assert returncode == 0
    copy = tmp_path / "checkpoint.pt"
    shutil.copy(next(log_dir.glob("*/checkpoint.pt")), copy)
    # The global batch shrinks from 256 to 128: steps 1024 -> 1280 are two iterations (9 and 10).
    metrics = ppo_ddp.train(
        ppo_ddp.parse_args(
            ["--resume", str(copy), "--total-timesteps", "1280", "--eval-episodes", "2"]
        )
    )
    assert metrics["global_step"] == 1280 and np.isfinite(metrics["losses/policy_loss"])
    ckpt = ppo_ddp.load_checkpoint(str(copy))
    assert ckpt["iteration"] == 10 and ckpt["agent"]["obs_rms.count"].item() == pytest.approx(
        1e-4 + 1280
    )


BYPASS_DDP = """
import ppo_ddp, tyro
original = ppo_ddp.ppo_loss
# The bug the check is there for: the update's forward pass skips the DDP wrapper, so the
# gradients stay local.
ppo_ddp.ppo_loss = lambda agent, mb, args: original(agent.module, mb, args)
ppo_ddp.train(tyro.cli(ppo_ddp.Args))
"""


def test_forward_pass_around_ddp_is_caught_by_the_sync_check_in_one_line(tmp_path):
    driver = tmp_path / "bypass_ddp.py"
    driver.write_text(BYPASS_DDP)
    started = time.time()
    proc = torchrun(
        str(driver),
        *SMALL,
        *flags(total_timesteps=512, check_sync_every=1, log_dir=str(tmp_path)),
    )
    out, err = proc.communicate(timeout=180)
    assert proc.returncode != 0 and time.time() - started < 60  # every rank gone
    # Rank 0's line names what differs, in the state dict's order (the first three, then a count).
    line = "error: parameters out of sync: 1 of 2 ranks differ from rank 0 in actor_logstd, actor_"
    assert line in err and " more\n" in err
    assert "[rank0]: Traceback" not in err and "[rank1]: Traceback" not in err
    assert "parameters in sync" not in out
    assert "error (rank 1)" not in err  # torchrun's SIGTERM ended rank 1's wait: no second line
    assert "stopped" not in err  # nor a line of a run stopped by a signal


def child_with_rank(parent: int, rank: int) -> int:
    """The pid of torchrun's worker process with the given RANK (Linux /proc)."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if ppid == parent and f"RANK={rank}".encode() in environ:
            return int(entry)
    raise LookupError(f"no worker with RANK={rank}")


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the worker through /proc")
def test_a_killed_rank_brings_the_job_down_without_hanging(tmp_path):
    proc = torchrun(
        "ppo_ddp.py", *SMALL, "--total-timesteps", "1000000", "--log-dir", str(tmp_path)
    )
    deadline = time.time() + 120
    while "iter 2/" not in proc.stdout.readline():
        assert time.time() < deadline and proc.poll() is None
    os.kill(child_with_rank(proc.pid, 1), signal.SIGKILL)
    killed = time.time()
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # a hang: do not leave the job behind
            proc.kill()
    assert proc.returncode != 0
    assert time.time() - killed < 30
    # Rank 0 says it in one line, with the command that resumes the run (torchrun's own summary of
    # the failed job follows it).
    assert "error: another rank died (" in err, err[-3000:]
    assert "); resume with: torchrun --nproc_per_node 2 ppo_ddp.py --resume " in err
    assert "[rank0]: Traceback" not in err


def test_another_rank_s_death_is_said_before_the_teardown_that_torchrun_may_cut(capsys):
    """torchrun SIGTERMs rank 0 once a rank has died, in either order with rank 0 noticing the
    death itself. Once out of the run, SIGTERM's default action ends rank 0 at once: its line must
    be out by then, not left in a SystemExit that Python prints at the very end (after the process
    group's teardown)."""
    run = {"writer": None, "checkpoint": "", "dir": ""}  # what a rank other than 0 has
    with pytest.raises(SystemExit) as stopped:
        with ppo_ddp.run_guard(run, ppo_ddp.Args()):
            raise RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer. x")
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert err == (
        "error: another rank died (Connection closed by peer); resume with: python ppo_ddp.py "
        "--resume <run>/checkpoint.pt\n"
    )


@pytest.fixture(scope="module")
def sigterm_run(tmp_path_factory):
    """A 2-rank job stopped by SIGTERM (a cluster's preemption) after its second iteration:
    torchrun passes it on to each rank, as it does Ctrl-C's SIGINT."""
    log_dir = tmp_path_factory.mktemp("ctrl_c")
    flags = ["--total-timesteps", "1000000", "--log-dir", str(log_dir)]
    proc = torchrun_script(tmp_path_factory, *SMALL, *flags)
    try:
        deadline = time.time() + 120
        while "iter 2/" not in proc.stdout.readline():
            assert time.time() < deadline and proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # a hang: do not leave the job behind
            proc.kill()
    return proc.returncode, out, err, log_dir


def test_sigterm_stops_every_rank_at_the_same_iteration_and_saves(sigterm_run):
    # The ranks agree on the iteration to stop at, so none waits in an all-reduce for one that has
    # left, and rank 0 saves.
    _, _, err, log_dir = sigterm_run
    assert "SIGTERM: stopped at step " in err
    assert "resume with: torchrun --nproc_per_node 2 ppo_ddp.py --resume " in err
    ckpt = ppo_ddp.load_checkpoint(str(next(log_dir.glob("*/checkpoint.pt"))))
    global_batch = 2 * 2 * 64  # ranks x envs x steps (SMALL)
    assert (
        ckpt["global_step"] >= 2 * global_batch
        and ckpt["global_step"] == ckpt["iteration"] * global_batch
    )


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the worker through /proc")
def test_sigterm_to_one_rank_alone_stops_every_rank_at_the_same_iteration(tmp_path):
    """A node's agent, or `kill` of one pid: the SIGTERM reaches one rank. The ranks agree on the
    stop all the same: rank 0 saves and prints the resume command; none waits for another."""
    proc = torchrun(
        "ppo_ddp.py", *SMALL, "--total-timesteps", "1000000", "--log-dir", str(tmp_path)
    )
    try:
        deadline = time.time() + 120
        while "iter 2/" not in proc.stdout.readline():
            assert time.time() < deadline and proc.poll() is None
        os.kill(child_with_rank(proc.pid, 1), signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # a hang: do not leave the job behind
            proc.kill()
    assert "SIGTERM: stopped at step " in err, err[-3000:]
    assert "resume with: torchrun --nproc_per_node 2 ppo_ddp.py --resume " in err
    assert "another rank died" not in err and "[rank0]: Traceback" not in err, err[-3000:]
    assert "[rank1]: Traceback" not in err
    ckpt = ppo_ddp.load_checkpoint(str(next(tmp_path.glob("*/checkpoint.pt"))))
    global_batch = 2 * 2 * 64  # ranks x envs x steps (SMALL)
    assert ckpt["global_step"] >= 2 * global_batch
    assert ckpt["global_step"] == ckpt["iteration"] * global_batch


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="counts threads through /proc")
@pytest.mark.parametrize("job", ["two_rank_run", "sigterm_run"])  # the end of a run, SIGTERM
def test_destroy_process_group_stops_gloo_threads_even_during_a_collective(job, request):
    # A gloo worker thread left running when Python shuts down may still be releasing the tensors of
    # a collective; it then dies there and aborts the rank (std::terminate, exit code -6). Ctrl-C
    # leaves through SystemExit, whose traceback keeps train()'s frame.
    returncode, out, err, _ = request.getfixturevalue(job)
    for rank in (0, 1):
        assert f"rank {rank}: 0 gloo worker threads left" in out, err[-3000:]
    assert returncode == 0 or job == "sigterm_run"


# ---------------------------------------------------------------------------------------------
# Seams between the ranks: their own episodes, the same parameters; --ddp and --no-ddp alike
# ---------------------------------------------------------------------------------------------
# Each rank says with which seeds its envs start and what they observe first; the run itself is the
# script's, as a user starts it (default seeds), and the process group ends as in its __main__.
SEEDS_OF_EACH_RANK = """
import os, sys, torch, torch.distributed as dist, ppo_ddp
original, normal = ppo_ddp.start_episodes, torch.normal

def say(line):  # one write of the whole line: the ranks share torchrun's stdout, unbuffered
    os.write(sys.__stdout__.fileno(), f"{line}\\n".encode())

def noted_normal(mean, std):  # the action noise: the rollout's one draw per step
    sample = normal(mean, std)
    if not hasattr(noted_normal, "said"):
        noise = ",".join(f"{x:.6f}" for x in ((sample - mean) / std).flatten()[:6].tolist())
        say(f"rank {ppo_ddp.rank()} first noise {noise}")
        noted_normal.said = True
    return sample

torch.normal = noted_normal

def start_episodes(*args):
    carry = original(*args)
    first = ",".join(f"{x:.6f}" for x in carry["obs"].flatten()[:8].tolist())
    say(f"rank {ppo_ddp.rank()} first obs {first}")
    return carry

ppo_ddp.start_episodes = start_episodes
try:
    ppo_ddp.train(ppo_ddp.parse_args(sys.argv[1:]))
finally:
    dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def runs_of_both_modes(tmp_path_factory):
    """2 iterations of 2 ranks x 2 envs x 64 steps, default seeds, checked every iteration: the
    same job with --ddp and with --no-ddp."""
    runs = {}
    for mode in ("--ddp", "--no-ddp"):
        log_dir = tmp_path_factory.mktemp("runs")
        driver = log_dir.parent / "seeds_of_each_rank.py"
        driver.write_text(SEEDS_OF_EACH_RANK)
        proc = torchrun(
            str(driver), *SMALL, mode, *flags(total_timesteps=512, check_sync_every=1),
            "--log-dir", str(log_dir),
        )  # fmt: skip
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
        runs[mode] = out, log_dir
    return runs


@pytest.fixture(params=["--ddp", "--no-ddp"])
def default_two_rank_run(request, runs_of_both_modes):
    return request.param, *runs_of_both_modes[request.param]


def test_each_rank_steps_its_own_episodes_with_the_same_parameters(default_two_rank_run):
    _, out, _ = default_two_rank_run
    first = dict(re.findall(r"rank (\d) first obs (\S+)", out))
    assert set(first) == {"0", "1"} and first["0"] != first["1"]  # other seeds, other episodes
    assert out.count("parameters in sync across 2 ranks") == 2  # after each iteration


def test_each_rank_draws_its_own_action_noise(default_two_rank_run, tmp_path):
    """Not only its own env seeds: its own Gaussian noise, also after a resume (where rank 0 takes
    back the saved generator and the other ranks must not)."""
    mode, out, log_dir = default_two_rank_run
    noise = dict(re.findall(r"rank (\d) first noise (\S+)", out))
    assert set(noise) == {"0", "1"} and noise["0"] != noise["1"]
    if mode == "--no-ddp":
        return
    driver, copy = log_dir.parent / "seeds_of_each_rank.py", tmp_path / "checkpoint.pt"
    shutil.copy(next(log_dir.glob("*/checkpoint.pt")), copy)
    resume = flags(resume=str(copy), total_timesteps=768)
    proc = torchrun(str(driver), *resume)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    resumed = dict(re.findall(r"rank (\d) first noise (\S+)", out))
    assert set(resumed) == {"0", "1"} and resumed["0"] != resumed["1"]


def test_rank_0_logs_its_episodes_at_the_global_step(default_two_rank_run):
    """An episode ends at the global step of its rollout step: every rank has stepped as far, so
    the steps are multiples of 2 ranks x 2 envs, up to 512; episodes do end in the second half of
    the second rollout (past step 384), which counting rank 0's own steps alone never reaches."""
    _, _, log_dir = default_two_rank_run
    steps = [e.step for e in read_events(next(log_dir.iterdir())).Scalars("charts/episodic_return")]
    assert steps and all(step % 4 == 0 and 0 < step <= 512 for step in steps)
    assert max(steps) > 384


@pytest.fixture(scope="module")
def losses_of_both_modes(runs_of_both_modes):
    """Rank 0's losses of each iteration of the same job with --ddp and with --no-ddp."""
    losses = {}
    for mode, (_, log_dir) in runs_of_both_modes.items():
        events = read_events(next(log_dir.iterdir()))
        tags = ("losses/policy_loss", "losses/value_loss", "losses/approx_kl")
        losses[mode] = {tag: [e.value for e in events.Scalars(tag)] for tag in tags}
    return losses


def test_ddp_and_the_gradients_averaged_by_hand_train_alike(losses_of_both_modes):
    """From the same start (rank 0's weights on every rank) the two average the same gradients,
    in another order of the sums: the same losses to float rounding, iteration after iteration."""
    with_ddp, by_hand = losses_of_both_modes["--ddp"], losses_of_both_modes["--no-ddp"]
    for tag, values in with_ddp.items():
        assert len(values) == 2
        np.testing.assert_allclose(by_hand[tag], values, rtol=1e-3, atol=1e-6, err_msg=tag)


# ---------------------------------------------------------------------------------------------
# Learning
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_ranks_learn_inverted_pendulum(tmp_path):
    # 4 envs per rank: the global batch of 2 x 4 x 256 = 2048 steps is the single-process default.
    proc = torchrun(
        "ppo_ddp.py",
        *flags(
            env_id="InvertedPendulum-v5", total_timesteps=40960, num_envs=4, log_dir=str(tmp_path)
        ),
    )
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-1500:] + err[-3000:]  # where it stopped, and why
    eval_return = float(re.search(r"deterministic eval over 10 episodes: (-?[\d.]+)", out).group(1))
    print(f"InvertedPendulum-v5, 2 ranks, 40,960 steps: deterministic eval {eval_return:.1f}")
    assert eval_return >= 900


def test_only_rank_0_tracks_with_wandb(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")  # torchrun passes the environment on
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))  # torchrun runs in the repository
    flags = ["--total-timesteps", "256", "--log-dir", str(tmp_path / "runs"), "--track"]
    proc = torchrun("ppo_ddp.py", *SMALL, *flags)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    (run_dir,) = (tmp_path / "runs").glob("*")
    assert not list(run_dir.rglob("*wandb*"))
    (offline_run,) = (tmp_path / "wandb").glob("offline-run-*")  # one W&B run: rank 0's
    (data,) = offline_run.glob("run-*.wandb")
    assert b"losses/policy_loss" in data.read_bytes()


@pytest.mark.parametrize(
    "bad, message",
    [
        (["--max-grad-norm", "-1"], "error: --max-grad-norm must be positive, got -1.0"),
        # 256 minibatches divide the 256 steps of both ranks, not the 128 that each rank splits.
        (["--num-minibatches", "256"], "error: batch size 128 is not divisible by --num-minibat"),
    ],
)
def test_a_bad_flag_is_one_line_of_rank_0_under_torchrun(bad, message, tmp_path):
    proc = torchrun("ppo_ddp.py", *SMALL, *bad, "--log-dir", str(tmp_path))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert err.count(message) == 1, err


def catch_exit(function, *args):
    """What SystemExit function(*args) raised with."""
    try:
        function(*args)
    except SystemExit as e:
        return e.code


def test_a_rank_other_than_0_waits_before_it_says_why_it_stops(monkeypatch):
    """torchrun stops every rank when one exits: rank 1 waits, so that rank 0's line (the same
    error) comes out; a rank that fails alone says why after the wait, with its rank. torchrun's
    SIGTERM ends the wait (its default action, not the run's handler), also off the main thread,
    where no handler can be set."""
    waits, handlers, said = [], [], []
    monkeypatch.setattr(ppo_ddp.time, "sleep", waits.append)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    thread = threading.Thread(target=lambda: said.append(catch_exit(ppo_ddp.fail, "disk full")))
    thread.start()
    thread.join()
    assert waits == [10.0] and said == ["error (rank 1): disk full"]
    monkeypatch.setattr(ppo_ddp.signal, "signal", lambda *handler: handlers.append(handler))
    with pytest.raises(SystemExit) as stopped:
        ppo_ddp.fail("no space left on device")
    assert handlers == [(signal.SIGTERM, signal.SIG_DFL)]
    assert waits == [10.0] * 2 and stopped.value.code == "error (rank 1): no space left on device"
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as stopped:
        ppo_ddp.fail("no space left on device")
    assert waits == [10.0] * 2 and stopped.value.code == "error: no space left on device"
    assert len(handlers) == 1  # rank 0 keeps the run's handler


def test_a_rank_left_in_the_shell_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    """RANK set without torchrun (a cluster's shell may leave it), so without the rest that a
    process group needs: one line that says what to do, exit code 1, before a run directory is
    made; at once, whatever the RANK (no rank waits: there are no others)."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "MASTER_ADDR")}
    command = [sys.executable, "ppo_ddp.py", *SMALL, "--log-dir", str(tmp_path / "runs")]
    done = subprocess.run(command, cwd=ROOT, env={**env, "RANK": "0", "MASTER_PORT": "29500"},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    line = "error: RANK is set but not WORLD_SIZE, MASTER_ADDR: start ranks with torchrun (README)"
    assert done.returncode == 1 and done.stderr.startswith(line), done.stderr
    assert len(done.stderr.splitlines()) == 1 and not list((tmp_path / "runs").iterdir())
    waits = []
    monkeypatch.setattr(ppo_ddp.time, "sleep", waits.append)
    monkeypatch.setenv("RANK", "3")
    for name in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit, match="^error: RANK is set but not WORLD_SIZE, MASTER_ADDR, M"):
        ppo_ddp.init_distributed(ppo_ddp.Args())
    assert waits == []
