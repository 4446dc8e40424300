"""--track: Weights & Biases mirrors the TensorBoard tags (offline here: no network), and a resumed
run continues the same W&B run."""

import importlib

import pytest
from test_checkpoints_and_cli import only_checkpoint, small_args

pytest.importorskip("wandb")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def wandb_runs(run_dir):
    """The offline W&B runs in a run directory: {folder name: the bytes of its .wandb file}."""
    runs = {}
    for folder in sorted((run_dir / "wandb").glob("offline-run-*")):
        (data,) = folder.glob("run-*.wandb")
        runs[folder.name] = data.read_bytes()
    return runs


@pytest.mark.parametrize("name", ["ppo_continuous", "appo_vtrace"])  # DDP: test_ppo_ddp.py
def test_track_writes_the_tensorboard_tags_to_an_offline_wandb_run(name, tmp_path):
    script = importlib.import_module(name)
    script.train(small_args(script, tmp_path, track=True))
    (run_dir,) = tmp_path.glob("*")
    (data,) = wandb_runs(run_dir).values()
    for tag in (b"losses/policy_loss", b"charts/learning_rate", b"eval/episodic_return"):
        assert tag in data, tag
    assert run_dir.name.encode() in data  # the run's name: the run directory's


def test_a_resumed_run_goes_on_in_the_same_wandb_run(tmp_path):
    script = importlib.import_module("ppo_continuous")
    script.train(small_args(script, tmp_path, track=True))
    path = only_checkpoint(tmp_path)
    script.train(script.parse_args(["--resume", path, "--total-timesteps", "384"]))
    (run_dir,) = tmp_path.glob("*")
    runs = wandb_runs(run_dir)
    assert len(runs) == 2  # one per process, both with the run id derived from the directory
    assert all(folder.endswith(f"-{run_dir.name}") for folder in runs), list(runs)


def test_the_final_video_goes_to_wandb_too(tmp_path):
    script = importlib.import_module("ppo_continuous")
    args = small_args(script, tmp_path, track=True, capture_video=True)
    args.video_dir = str(tmp_path / "videos")
    script.train(args)
    (run_dir,) = tmp_path.glob("Walker2d*")
    (data,) = wandb_runs(run_dir).values()
    assert b"eval/video" in data
