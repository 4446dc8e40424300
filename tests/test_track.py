"""--track: Weights & Biases mirrors the TensorBoard tags once (offline here: no network), its files
stay out of the run directory, and a resumed run continues the same W&B run."""

import importlib
import os
import shutil
import struct
import subprocess
import sys

import pytest
from conftest import ALL_SCRIPTS, ROOT, flags, only_checkpoint, small_args

pytest.importorskip("wandb")


def go_offline(monkeypatch):
    """Offline, and W&B's files where it puts them for a user: ./wandb (the test's own folder)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    go_offline(monkeypatch)


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """The run directory of one tracked ppo_continuous run with its final video (each W&B run
    costs seconds, so the tests below share it)."""
    cwd = tmp_path_factory.mktemp("cwd")
    script = importlib.import_module("ppo_continuous")
    args = small_args(script, cwd / "runs", track=True, capture_video=True)
    args.video_dir = str(cwd / "videos")
    with pytest.MonkeyPatch.context() as monkeypatch:
        go_offline(monkeypatch)
        monkeypatch.chdir(cwd)
        script.train(args)
    (run_dir,) = (cwd / "runs").glob("Walker2d*")
    return run_dir


def wandb_runs(cwd):
    """The offline W&B runs in cwd/wandb: {folder name: the bytes of its .wandb file}."""
    runs = {}
    for folder in sorted((cwd / "wandb").glob("offline-run-*")):
        (data,) = folder.glob("run-*.wandb")
        runs[folder.name] = data.read_bytes()
    return runs


def history_rows(data: bytes) -> dict[str, int]:
    """How many history rows of a .wandb file hold each key. The file is a log of 32 KiB blocks
    after a 7-byte header, each record a 7-byte header (checksum, length, full/first/middle/last)
    and a protobuf Record."""
    from wandb.proto import wandb_internal_pb2

    rows, position, record = {}, 7, b""
    while position + 7 <= len(data):
        if 32768 - position % 32768 < 7:  # no room for a header: the block is padded
            position += 32768 - position % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        record += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or the last part of one
            parsed = wandb_internal_pb2.Record.FromString(record)
            for item in parsed.history.item if parsed.HasField("history") else []:
                key = item.key or "/".join(item.nested_key)
                rows[key] = rows.get(key, 0) + 1
            record = b""
    return rows


def assert_mirrors_the_tensorboard_tags_once(run_dir, iterations: int):
    """One event file, W&B's files outside the run directory, and one W&B row per logged step."""
    assert [path.name for path in run_dir.parent.rglob("events.out.tfevents*")] == [
        path.name for path in run_dir.glob("events.out.tfevents*")
    ]
    assert len(list(run_dir.glob("events.out.tfevents*"))) == 1
    assert not list(run_dir.rglob("*wandb*"))
    (data,) = wandb_runs(run_dir.parent.parent).values()
    rows = history_rows(data)
    assert rows["charts/learning_rate"] == iterations and rows["losses/policy_loss"] == iterations
    assert rows["eval/episodic_return"] == 1
    assert run_dir.name.encode() in data  # the run's name: the run directory's


def test_track_writes_each_tensorboard_scalar_once_to_an_offline_wandb_run(tracked_run):
    assert_mirrors_the_tensorboard_tags_once(tracked_run, iterations=2)


def test_appo_vtrace_tracks_the_same_way(tmp_path, monkeypatch):  # DDP: test_ppo_ddp.py
    script = importlib.import_module("appo_vtrace")
    monkeypatch.chdir(tmp_path)
    script.train(small_args(script, tmp_path / "runs", track=True))
    (run_dir,) = (tmp_path / "runs").glob("*")
    assert_mirrors_the_tensorboard_tags_once(run_dir, iterations=2)


def test_the_final_video_goes_to_wandb_too(tracked_run):
    (data,) = wandb_runs(tracked_run.parent.parent).values()
    assert b"eval/video" in data


def test_a_resumed_run_goes_on_in_the_same_wandb_run(tracked_run, tmp_path, monkeypatch):
    script = importlib.import_module("ppo_continuous")
    shutil.copytree(tracked_run, tmp_path / "runs" / tracked_run.name)
    shutil.copytree(tracked_run.parent.parent / "wandb", tmp_path / "wandb")
    monkeypatch.chdir(tmp_path)
    path = only_checkpoint(tmp_path / "runs")
    resume = ["--resume", path, "--total-timesteps", "384", "--no-capture-video"]
    script.train(script.parse_args(resume))
    runs = wandb_runs(tmp_path)
    assert len(runs) == 2  # one per process, both with the run id derived from the directory
    assert all(folder.endswith(f"-{tracked_run.name}") for folder in runs), list(runs)


# What wandb says without a login, and the line's way round it.
NO_LOGIN = "error: --track: No API key configured. Use `wandb login` to log in. Or track offline: "
NO_LOGIN += "WANDB_MODE=offline (wandb sync uploads it later)\n"


def without_a_login(folder, *command: str):
    """The script run as a user who never ran `wandb login` would: online, no API key, no netrc,
    no W&B settings (HOME is an empty folder), no terminal to ask on; in folder (./wandb)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k != "NETRC"}
    return subprocess.run(
        [sys.executable, *command], cwd=folder, env={**env, "HOME": str(folder)},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize("name", [*ALL_SCRIPTS, "ppo_teacher_student"])
def test_track_without_a_login_is_one_line_that_says_how_to_log_in(name, tracked_run, tmp_path):
    fields = dict(env_id="Walker2d-v5", total_timesteps=256, num_envs=2, num_steps=64)
    fields.update(log_dir=tmp_path / "runs", track=True)
    if name == "appo_vtrace":
        fields.update(num_actors=1)
    if name == "ppo_teacher_student":  # a teacher on Walker2d-v5
        fields.update(teacher=tracked_run / "checkpoint.pt")
    done = without_a_login(tmp_path, os.path.join(ROOT, f"{name}.py"), *flags(**fields))
    assert (done.returncode, done.stderr) == (1, NO_LOGIN)


def test_resuming_a_tracked_run_without_a_login_is_one_line(tracked_run, tmp_path):
    shutil.copytree(tracked_run, tmp_path / "run")
    resume = [*flags(resume=tmp_path / "run", total_timesteps=384), "--no-capture-video"]
    done = without_a_login(tmp_path, os.path.join(ROOT, "ppo_continuous.py"), *resume)
    assert (done.returncode, done.stderr) == (1, NO_LOGIN)
