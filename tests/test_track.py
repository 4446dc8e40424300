"""--track: Weights & Biases mirrors the TensorBoard tags (offline here: no network), and a resumed
run continues the same W&B run."""

import importlib
import shutil

import pytest
from test_checkpoints_and_cli import only_checkpoint, small_args

pytest.importorskip("wandb")


def go_offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    go_offline(monkeypatch)


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """The run directory of one tracked ppo_continuous run with its final video (each W&B run
    costs seconds, so the tests below share it)."""
    log_dir = tmp_path_factory.mktemp("tracked")
    script = importlib.import_module("ppo_continuous")
    args = small_args(script, log_dir, track=True, capture_video=True)
    args.video_dir = str(log_dir / "videos")
    with pytest.MonkeyPatch.context() as monkeypatch:
        go_offline(monkeypatch)
        script.train(args)
    (run_dir,) = log_dir.glob("Walker2d*")
    return run_dir


def wandb_runs(run_dir):
    """The offline W&B runs in a run directory: {folder name: the bytes of its .wandb file}."""
    runs = {}
    for folder in sorted((run_dir / "wandb").glob("offline-run-*")):
        (data,) = folder.glob("run-*.wandb")
        runs[folder.name] = data.read_bytes()
    return runs


def assert_mirrors_the_tensorboard_tags(run_dir):
    (data,) = wandb_runs(run_dir).values()
    for tag in (b"losses/policy_loss", b"charts/learning_rate", b"eval/episodic_return"):
        assert tag in data, tag
    assert run_dir.name.encode() in data  # the run's name: the run directory's


def test_track_writes_the_tensorboard_tags_to_an_offline_wandb_run(tracked_run):
    assert_mirrors_the_tensorboard_tags(tracked_run)


def test_appo_vtrace_tracks_the_same_way(tmp_path):  # DDP: test_ppo_ddp.py
    script = importlib.import_module("appo_vtrace")
    script.train(small_args(script, tmp_path, track=True))
    (run_dir,) = tmp_path.glob("*")
    assert_mirrors_the_tensorboard_tags(run_dir)


def test_the_final_video_goes_to_wandb_too(tracked_run):
    (data,) = wandb_runs(tracked_run).values()
    assert b"eval/video" in data


def test_a_resumed_run_goes_on_in_the_same_wandb_run(tracked_run, tmp_path):
    script = importlib.import_module("ppo_continuous")
    shutil.copytree(tracked_run, tmp_path / tracked_run.name)
    path = only_checkpoint(tmp_path)
    resume = ["--resume", path, "--total-timesteps", "384", "--no-capture-video"]
    script.train(script.parse_args(resume))
    (run_dir,) = tmp_path.glob("*")
    runs = wandb_runs(run_dir)
    assert len(runs) == 2  # one per process, both with the run id derived from the directory
    assert all(folder.endswith(f"-{run_dir.name}") for folder in runs), list(runs)
