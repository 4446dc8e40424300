"""tools/export_onnx.py: the exported graph is the deterministic policy of every script's
checkpoint, normalizer and action scaling included, and it deploys with onnxruntime alone."""

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from conftest import ALL_SCRIPTS, ROOT

sys.path.insert(0, os.path.join(ROOT, "tools"))  # the tool is a script, not a package
import export_onnx  # noqa: E402

ENV_ID = "Humanoid-v5"  # action bounds +-0.4: leaving out the scaling changes every action


@pytest.fixture(scope="module", params=[*ALL_SCRIPTS, "ppo_symaug:network"])
def trained(request, tmp_path_factory):
    """A checkpoint of two iterations on Humanoid (the normalizer has left mean 0 and var 1),
    with the actor's last layer scaled up so that its means leave [-1, 1] (the clip is active).
    "ppo_symaug:network": ppo_symaug.py with --symmetry network."""
    name, _, symmetry = request.param.partition(":")
    script = importlib.import_module(name)
    log_dir = tmp_path_factory.mktemp(name)
    fields = dict(env_id=ENV_ID, total_timesteps=256, num_envs=2, num_steps=64)
    fields.update(num_minibatches=2, update_epochs=1, eval_episodes=1, log_dir=str(log_dir))
    if name == "appo_vtrace":
        fields.update(num_actors=1, num_rollouts=1)
    if symmetry:
        fields.update(symmetry=symmetry)
    script.train(script.Args(eval_every=1, **fields))
    (run_dir,) = log_dir.glob("*")
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    last = [key for key in ckpt["agent"] if key.startswith("actor_mean.")][-2]  # its weight
    ckpt["agent"][last] = ckpt["agent"][last] * 300.0
    torch.save(ckpt, run_dir / "scaled.pt")
    return script, run_dir


def test_onnx_action_equals_the_scripts_deterministic_action(trained, tmp_path):
    script, run_dir = trained
    output = str(tmp_path / "policy.onnx")
    export_onnx.main(export_onnx.Args(checkpoint=str(run_dir / "scaled.pt"), output=output))
    ckpt = script.load_checkpoint(str(run_dir / "scaled.pt"))
    agent = script.Agent(ckpt["obs_dim"], ckpt["act_dim"], script.saved_args(ckpt))
    agent.load_state_dict(ckpt["agent"])
    mean, var = agent.obs_rms.mean, agent.obs_rms.var
    assert mean.abs().max() > 0.1 and (var - 1).abs().max() > 0.1  # a normalizer that matters
    torch.manual_seed(0)
    obs = (mean + var.sqrt() * 2 * torch.randn(7, len(mean))).float()  # batch 7: exported with 2
    envs = script.make_envs(ENV_ID, 1)
    with torch.no_grad():
        means = agent.actor_mean(agent.normalize(obs)).numpy()
    expected = script.scale_action(means, envs.single_action_space)
    envs.close()
    assert (np.abs(means) > 1).mean() > 0.1 and (np.abs(means) < 1).mean() > 0.1
    session = onnxruntime.InferenceSession(output, providers=["CPUExecutionProvider"])
    (action,) = session.run(None, {"obs": obs.numpy()})
    assert action.dtype == np.float32 and action.shape == (7, 17)
    np.testing.assert_allclose(action, expected, atol=1e-5, rtol=0)
    assert np.abs(action).max() <= 0.4 + 1e-6
    if getattr(agent, "symmetric", False):  # deployed symmetric too: a(M_o s) = M_a a(s)
        mirror_obs, mirror_act = script.make_mirror_fns(ENV_ID)
        (mirrored,) = session.run(None, {"obs": mirror_obs(obs).numpy()})
        np.testing.assert_allclose(mirrored, mirror_act(torch.from_numpy(action)), atol=1e-5)


def test_onnx_file_holds_the_metadata(trained, tmp_path):
    script, run_dir = trained
    output = str(tmp_path / "policy.onnx")
    export_onnx.main(export_onnx.Args(checkpoint=str(run_dir / "checkpoint.pt"), output=output))
    props = {p.key: json.loads(p.value) for p in onnx.load(output).metadata_props}
    assert props["script"] == script.__name__ and props["env_id"] == ENV_ID
    assert (props["obs_dim"], props["act_dim"], props["global_step"]) == (348, 17, 256)
    assert props["action_low"] == pytest.approx([-0.4] * 17)
    assert props["action_high"] == pytest.approx([0.4] * 17)
    inputs, outputs = onnx.load(output).graph.input, onnx.load(output).graph.output
    assert [i.name for i in inputs] == ["obs"] and [o.name for o in outputs] == ["action"]


def test_check_returns_what_eval_checkpoint_returns(trained, tmp_path):
    script, run_dir = trained
    path = str(run_dir / "best.pt")
    output = str(tmp_path / "best.onnx")
    export_onnx.main(export_onnx.Args(checkpoint=path, output=output))
    module = importlib.import_module(script.__name__)
    returns = export_onnx.check(module, output, ENV_ID, 3, 1, "gymnasium")
    expected = script.train(script.Args(eval_checkpoint=path, eval_episodes=3, seed=1))
    assert np.mean(returns) == pytest.approx(expected["eval/episodic_return"], rel=1e-6)


def test_check_of_more_than_16_episodes_plays_the_eval_checkpoint_s_episodes(tmp_path):
    """Beyond one wave of 16 envs, each wave starts where the last one's seeds ended: episode i
    on seed --seed + EVAL_SEED_OFFSET + i, as the scripts' evaluation plays it. Episode by
    episode, not a mean that two waves on the same seeds could still come near."""
    script = importlib.import_module("ppo_continuous")
    fields = dict(env_id="Hopper-v5", total_timesteps=128, num_envs=2, num_steps=64)
    script.train(script.Args(eval_episodes=1, log_dir=str(tmp_path), **fields))
    (path,) = tmp_path.glob("*/checkpoint.pt")
    output = str(tmp_path / "policy.onnx")
    export_onnx.main(export_onnx.Args(checkpoint=str(path), output=output))
    returns = export_onnx.check(script, output, "Hopper-v5", 18, 3, "gymnasium")
    ckpt = script.load_checkpoint(str(path))
    agent = script.Agent(ckpt["obs_dim"], ckpt["act_dim"], script.saved_args(ckpt))
    agent.load_state_dict(ckpt["agent"])
    args = script.Args(env_id="Hopper-v5", eval_episodes=18, seed=3)
    expected = [episode["return"] for episode in script.evaluate(agent, args, None, "x")[0]]
    assert len(returns) == 18 and len(set(returns)) == 18  # 18 episodes of their own
    np.testing.assert_allclose(returns, expected, rtol=1e-5)


def run_tool(*flags):
    return subprocess.run(
        [sys.executable, "tools/export_onnx.py", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_command_line_writes_policy_onnx_beside_the_checkpoint_and_checks_it(tmp_path):
    script = importlib.import_module("ppo_continuous")
    fields = dict(env_id="Hopper-v5", total_timesteps=256, num_envs=2, num_steps=128)
    script.train(script.Args(eval_episodes=2, log_dir=str(tmp_path), **fields))
    (path,) = tmp_path.glob("*/checkpoint.pt")
    result = run_tool(str(path), "--check", "2")
    assert result.returncode == 0, result.stderr[-2000:]
    assert (path.parent / "policy.onnx").exists()
    printed = float(result.stdout.split("onnxruntime deterministic return ")[1].split()[0])
    expected = script.train(script.Args(eval_checkpoint=str(path), eval_episodes=2))
    assert printed == pytest.approx(expected["eval/episodic_return"], abs=0.051)


class RunsCode:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def test_bad_checkpoints_are_one_line(tmp_path):
    marker = tmp_path / "marker"
    crafted = tmp_path / "crafted.pt"
    torch.save({"script": "ppo_continuous", "payload": RunsCode(str(marker))}, crafted)
    foreign = tmp_path / "foreign.pt"
    torch.save({"script": "someone_elses"}, foreign)
    for path, message in (
        (crafted, "error: refusing .*crafted.pt: it holds objects other"),
        (tmp_path / "missing.pt", "error: checkpoint not found"),
        (foreign, "error: .*foreign.pt was not written by one of ppo_continuous"),
    ):
        with pytest.raises(SystemExit, match=message):
            export_onnx.main(export_onnx.Args(checkpoint=str(path)))
    assert not marker.exists()
    result = run_tool(str(tmp_path / "missing.pt"))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"error: checkpoint not found: {tmp_path / 'missing.pt'}"


def test_without_onnxruntime_the_export_names_the_pip_command(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *r: None if name == "onnxruntime" else find_spec(name),
    )
    with pytest.raises(
        SystemExit, match="needs onnxruntime: pip install -r requirements-extras.txt"
    ):
        export_onnx.main(export_onnx.Args(checkpoint=str(tmp_path / "any.pt")))


def test_a_dict_observation_run_exports_from_its_directory(tmp_path, capsys):
    # Flattened in training, so in the export too: 5 numbers (see toy_envs.DictObservations).
    ppo = importlib.import_module("ppo_continuous")
    fields = dict(env_id="toy_envs:DictObservations-v0", total_timesteps=64, num_envs=2)
    fields.update(num_steps=16, num_minibatches=2, update_epochs=1, log_dir=str(tmp_path / "runs"))
    ppo.train(ppo.Args(**fields))
    (run_dir,) = (tmp_path / "runs").glob("*")
    export_onnx.main(export_onnx.Args(checkpoint=str(run_dir), check=2))  # the directory
    session = onnxruntime.InferenceSession(str(run_dir / "policy.onnx"))
    assert session.get_inputs()[0].shape[1] == 5
    assert "onnxruntime deterministic return 5.0" in capsys.readouterr().out


def test_each_checkpoint_of_a_folder_exports_to_a_file_of_its_own(tmp_path):
    """Without --output the file goes beside the checkpoint, named after it: a run's checkpoint.pt
    to policy.onnx (as README's deployment reads it), any other X.pt to X.onnx. So the checkpoints
    that share a folder (best.pt beside checkpoint.pt; the three committed in benchmarks/robots/)
    each export their own policy, none over another's."""
    ppo = importlib.import_module("ppo_continuous")
    fields = dict(env_id="toy_envs:DictObservations-v0", total_timesteps=64, num_envs=2)
    fields.update(num_steps=16, num_minibatches=2, update_epochs=1, log_dir=str(tmp_path / "runs"))
    for seed in (1, 2):
        ppo.train(ppo.Args(seed=seed, **fields))
    runs = sorted((tmp_path / "runs").glob("*"))
    robots = tmp_path / "robots"
    robots.mkdir()
    for name, run_dir in zip(("ppo_continuous-A", "ppo_continuous-B"), runs):
        shutil.copy(run_dir / "checkpoint.pt", robots / f"{name}.pt")
        export_onnx.main(export_onnx.Args(checkpoint=str(robots / f"{name}.pt")))
    export_onnx.main(export_onnx.Args(checkpoint=str(runs[0] / "checkpoint.pt")))
    names = ["ppo_continuous-A.onnx", "ppo_continuous-A.pt", "ppo_continuous-B.onnx"]
    assert sorted(path.name for path in robots.iterdir()) == [*names, "ppo_continuous-B.pt"]
    obs = np.linspace(-1, 1, 10, dtype=np.float32).reshape(2, 5)
    actions = []
    for path in (robots / names[0], robots / names[2], runs[0] / "policy.onnx"):
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        actions.append(session.run(None, {"obs": obs})[0])
    assert not np.array_equal(actions[0], actions[1])  # the seeds' own policies
    np.testing.assert_array_equal(actions[0], actions[2])  # A is the first run's checkpoint.pt


def test_a_full_disk_while_exporting_is_one_line(tmp_path):
    trained_dir = tmp_path / "runs"
    ppo = importlib.import_module("ppo_continuous")
    fields = dict(env_id="Hopper-v5", total_timesteps=64, num_envs=2, num_steps=32)
    ppo.train(ppo.Args(num_minibatches=2, update_epochs=1, log_dir=str(trained_dir), **fields))
    (run_dir,) = trained_dir.glob("*")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(disk)])
    if mounted.returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        output = disk / "policy.onnx"
        with pytest.raises(
            SystemExit, match=f"^error: no space left on device while writing {output}$"
        ):
            export_onnx.main(export_onnx.Args(checkpoint=str(run_dir), output=str(output)))
        assert not list(disk.iterdir())
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)
