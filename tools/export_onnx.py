"""Export the policy of a checkpoint of any of this project's scripts to ONNX, for deployment.

The graph is the deterministic policy, what evaluation sends to the env: normalize the observation
with the saved statistics, clip it as in training, the actor's mean, clip to [-1, 1], scale to the
env's action bounds. It has no critic and no exploration noise. Input "obs", float32 [batch,
obs_dim]; output "action", float32 [batch, act_dim]; the batch size is dynamic. A robot's policy
(EnvPool's Dict tasks) takes its `state` only, what the robot senses: obs_dim is the state's size.
A ppo_teacher_student.py student takes its deployable obs and its history only (its actor's
columns: [obs now | previous obs, newest first | previous actions, newest first]).

    python tools/export_onnx.py runs/<run>/checkpoint.pt                # -> runs/<run>/policy.onnx
    python tools/export_onnx.py runs/<run>/best.pt --check 10           # -> runs/<run>/best.onnx
    python tools/export_onnx.py benchmarks/robots/X.pt --output go1.onnx  # (default: X.onnx)

--check N runs N deterministic episodes with onnxruntime alone (no torch in that loop), on the
seeds of the script's --eval-checkpoint (and on the backend the run trained on, or
--env-backend), and prints the mean return.
"""

import contextlib
import importlib
import importlib.util
import io
import json
import os
import pickle
import sys
import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn as nn
import tyro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ["ppo_continuous", "ppo_spo", "ppo_symaug", "ppo_ddp", "appo_vtrace"]
SCRIPTS += ["ppo_teacher_student"]


@dataclass
class Args:
    checkpoint: tyro.conf.Positional[str]  # a checkpoint file, or a run directory (its checkpoint)
    output: str | None = None
    """the ONNX file to write; None: beside the checkpoint, a run's checkpoint.pt to policy.onnx,
    any other X.pt to X.onnx (best.pt to best.onnx)"""
    check: int = 0  # run this many deterministic episodes in onnxruntime, print the mean return
    seed: int = 1  # with --check: the --seed of the script's --eval-checkpoint to compare with
    env_backend: Literal["gymnasium", "envpool"] | None = None  # with --check; None: the run's


def fail(message: str):
    raise SystemExit(f"error: {message}")


class DeployedPolicy(nn.Module):
    """The agent's deterministic action, scaled to the env's bounds (as the scripts' evaluate)."""

    def __init__(self, agent: nn.Module, low: np.ndarray, high: np.ndarray):
        super().__init__()
        self.agent = agent
        self.register_buffer("low", torch.as_tensor(low, dtype=torch.float32))
        self.register_buffer("span", torch.as_tensor(high - low, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        # A robot's obs is the state alone: the privileged columns, which the actor never reads,
        # are padded (the normalizer works column by column).
        padding = self.agent.obs_rms.mean.shape[0] - obs.shape[-1]
        mean = self.agent.mean_action(nn.functional.pad(obs, (0, padding)))
        action = mean.clamp(-1.0, 1.0)
        return self.low + (action + 1.0) * 0.5 * self.span


def script_of(path: str) -> str:
    """The name of the script that wrote the checkpoint, read with weights_only=True."""
    if not os.path.exists(path):
        fail(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        fail(f"refusing {path}: it holds objects other than tensors and plain values")
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same clear message
        fail(f"cannot read checkpoint {path}: {e}".splitlines()[0])
    script = ckpt.get("script") if isinstance(ckpt, dict) else None
    if script not in SCRIPTS:
        fail(f"{path} was not written by one of {', '.join(SCRIPTS)} (script: {script})")
    return script


def load_policy(path: str):
    """(the script's module, its checkpoint, the DeployedPolicy); the script's own safe loader."""
    sys.path.insert(0, ROOT)
    module = importlib.import_module(script_of(path))
    ckpt = module.load_checkpoint(path)
    agent = module.Agent(
        ckpt["obs_dim"], ckpt["act_dim"], module.saved_args(ckpt), ckpt.get("actor_dim")
    )
    agent.load_state_dict(ckpt["agent"])
    envs = module.make_envs(ckpt["env_id"], 1, ckpt["args"].get("env_backend", "gymnasium"))
    space = envs.single_action_space
    envs.close()
    return module, ckpt, DeployedPolicy(agent, space.low, space.high).eval()


def export(policy: DeployedPolicy, ckpt: dict, output: str):
    import onnx

    obs = torch.zeros(2, policy.agent.actor_dim)  # a robot's: its state only
    graph = io.BytesIO()  # in memory: the file is written once, below
    with warnings.catch_warnings():  # torch's notes on its exporters
        warnings.simplefilter("ignore")
        torch.onnx.export(
            policy, (obs,), graph, input_names=["obs"], output_names=["action"],
            dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}}, dynamo=False,
        )  # fmt: skip
    model = onnx.load_from_string(graph.getvalue())
    metadata = {
        "script": ckpt["script"],
        "env_id": ckpt["env_id"],
        "obs_dim": policy.agent.actor_dim,
        "act_dim": ckpt["act_dim"],
        "action_low": policy.low.tolist(),
        "action_high": (policy.low + policy.span).tolist(),
        "global_step": ckpt["global_step"],
    }
    for key, value in metadata.items():
        model.metadata_props.add(key=key, value=json.dumps(value))
    try:  # atomic: a full disk leaves no half-written file (and an older one as it was)
        with open(f"{output}.tmp", "wb") as file:
            file.write(model.SerializeToString())
        os.replace(f"{output}.tmp", output)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(f"{output}.tmp")
        fail(f"{(e.strerror or str(e)).lower()} while writing {output}")


def check(module, output, env_id: str, episodes: int, seed: int, backend: str, student=None):
    """The scripts' evaluate, with onnxruntime in place of torch: the same seeds, episode i on
    seed + EVAL_SEED_OFFSET + i, in the same waves of up to 16 envs (student: a student's saved
    args, its history kept by the envs of its training). The actions equal evaluation's to float
    rounding, not bit for bit: onnxruntime sums the actor's products in another order than torch
    (on a Go1 actor of 256 x 128 units, up to 4e-7 apart; its float32 scaling to the bounds
    changes nothing there). Hopper's episodes end alike; a trained legged robot's amplify any such
    difference into other falls, so there the mean return agrees with --eval-checkpoint's within
    the noise of its episodes (a Go1 policy, 10 episodes: 23.3 here, 27.1 there, and 25.6 with
    torch's own actions moved by up to 1e-7)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(output, providers=["CPUExecutionProvider"])
    seed, returns = seed + module.EVAL_SEED_OFFSET, []
    for first in range(0, episodes, 16):
        n = min(16, episodes - first)
        if student is not None:  # ppo_teacher_student's student: its saved args
            envs = module.make_student_envs(
                env_id, n, backend, student["history"], student.get("student_obs", "hidden")
            )
        else:
            envs = module.make_envs(env_id, n, backend)
        obs, _ = envs.reset(seed=seed + first)
        wave, finished = np.zeros(n), np.zeros(n, dtype=bool)
        while not finished.all():
            state = obs[:, : session.get_inputs()[0].shape[1]]  # a robot's: the actor's columns
            (action,) = session.run(None, {"obs": state.astype(np.float32)})
            obs, reward, terminated, truncated, _ = envs.step(action)
            wave += reward * ~finished
            finished |= terminated | truncated
        envs.close()
        returns += wave.tolist()
    return returns


def main(args: Args):
    for package in ("onnx", "onnxruntime"):
        if importlib.util.find_spec(package) is None:
            fail(f"the export needs {package}: pip install -r requirements-extras.txt")
    if args.check < 0:
        fail(f"--check must be >= 0, got {args.check}")
    checkpoint = args.checkpoint
    if os.path.isdir(checkpoint):  # a run directory: its checkpoint.pt
        checkpoint = os.path.join(checkpoint, "checkpoint.pt")
    module, ckpt, policy = load_policy(checkpoint)
    output = args.output
    if output is None:  # beside it, named after it: the checkpoints of one folder (best.pt beside
        # checkpoint.pt, the three committed in benchmarks/robots/) each export to a file of its own
        stem = os.path.splitext(os.path.abspath(checkpoint))[0]
        run_policy = os.path.join(os.path.dirname(stem), "policy.onnx")
        output = run_policy if os.path.basename(stem) == "checkpoint" else f"{stem}.onnx"
    export(policy, ckpt, output)
    print(f"wrote {output} ({ckpt['script']}, {ckpt['env_id']}, step {ckpt['global_step']})")
    if args.check:
        backend = args.env_backend or ckpt["args"].get("env_backend", "gymnasium")
        student = ckpt["args"] if "history" in ckpt["args"] else None
        returns = check(module, output, ckpt["env_id"], args.check, args.seed, backend, student)
        print(f"{ckpt['env_id']}: onnxruntime deterministic return {np.mean(returns):.1f} ± "
              f"{np.std(returns):.1f} over {len(returns)} episodes")  # fmt: skip


if __name__ == "__main__":
    main(tyro.cli(Args))
