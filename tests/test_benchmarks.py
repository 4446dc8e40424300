"""Smoke test of the benchmark tools: a tiny run is recorded, reported and plotted."""

import csv
import dataclasses
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, flags, read_events

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))  # its tools are scripts, not a package


def test_run_then_report(tmp_path):
    results, plots = tmp_path / "results.csv", tmp_path / "plots"
    subprocess.run(
        [
            sys.executable,
            "benchmarks/run.py",
            "--env-ids",
            "InvertedPendulum-v5",
            "--seeds",
            "1",
            "2",
            "--total-timesteps",
            "2048",
            "--flags=--num-envs 4 --eval-episodes 2",
            "--eval-every",
            "1",
            "--results",
            str(results),
            "--log-dir",
            str(tmp_path / "runs"),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    rows = list(csv.DictReader(open(results)))
    assert [r["seed"] for r in rows] == ["1", "2"]
    assert all(float(r["sps"]) > 0 and r["flags"] == "--num-envs 4 --eval-episodes 2" for r in rows)
    assert float(rows[0]["eval_return"]) > 0 and float(rows[0]["final_return"]) > 0
    # The best of the evaluations after iteration 1 and 2 (periodic) and the final one: run 1's
    # TensorBoard log read again.
    (run_1,) = (tmp_path / "runs").glob("*__1__*")
    logged = read_events(run_1).Scalars
    evals = [
        e.value for tag in ("eval/periodic_return", "eval/episodic_return") for e in logged(tag)
    ]
    assert len(evals) == 3 and float(rows[0]["max_eval_return"]) == round(max(evals), 2)
    pytest.importorskip("matplotlib")
    out = subprocess.run(
        [
            sys.executable,
            "benchmarks/report.py",
            *flags(results=str(results), curves=str(tmp_path / "curves.csv"), plots=str(plots)),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    assert (
        "| InvertedPendulum-v5 | `ppo_continuous.py` | `--num-envs 4 --eval-episodes 2` "
        "| 2,048 | 1, 2 |" in out
    )
    assert (plots / "InvertedPendulum-v5.png").stat().st_size > 1000


def test_state_asymmetry_is_zero_on_the_mirror_invariant_subspace():
    import torch
    from symmetry import state_asymmetry

    import ppo_symaug

    mirror_obs, _ = ppo_symaug.make_mirror_fns("Walker2d-v5")
    states = torch.randn(4000, 17, generator=torch.Generator().manual_seed(0))
    # independent legs: the 12 leg dims of 17 differ from their mirror images
    assert state_asymmetry(states, mirror_obs) == pytest.approx(12 / 17, abs=0.03)
    legs_as_one = states.clone()
    legs_as_one[:, 5:8], legs_as_one[:, 14:17] = (
        states[:, 2:5],
        states[:, 11:14],
    )  # left leg = right leg
    assert state_asymmetry(legs_as_one, mirror_obs) == 0.0


class ToyActor:
    """An actor whose mean is offset + 0.9 tanh(W s): inside the bounds unless offset pushes it."""

    def __init__(self, offset):
        self.w = torch.randn(17, 6, generator=torch.Generator().manual_seed(1))
        self.offset = torch.as_tensor(offset, dtype=torch.float32)

    def mean_action(self, obs):
        return self.offset + 0.9 * torch.tanh(obs @ self.w)


def test_clipped_symmetry_error_measures_the_actions_the_env_applies():
    """Inside the bounds the clipped error is the plain one; a policy whose only asymmetry is how
    far past +1 its legs' means lie (3 on the right, 5 on the left) applies symmetric actions:
    clipped error 0, while the plain one sees the (5 - 3)^2 = 4."""
    from symmetry import clipped_symmetry_error

    import ppo_symaug

    mirror_obs, mirror_act = ppo_symaug.make_mirror_fns("Walker2d-v5")
    states = torch.randn(500, 17, generator=torch.Generator().manual_seed(0))
    inside = ToyActor([0.0] * 6)
    plain = ppo_symaug.symmetry_error(inside, states, mirror_obs, mirror_act)
    assert plain > 0.05
    assert clipped_symmetry_error(inside, states, mirror_obs, mirror_act) == pytest.approx(plain)
    saturated = ToyActor([3.0] * 3 + [5.0] * 3)
    assert ppo_symaug.symmetry_error(saturated, states, mirror_obs, mirror_act) > 3.0
    assert clipped_symmetry_error(saturated, states, mirror_obs, mirror_act) == 0.0


def test_symmetry_of_go1_policies_mirrors_state_and_privileged_state_part_by_part(tmp_path):
    """symmetry.py on EnvPool's Go1: a --symmetry network policy (symmetric by construction)
    measures 0 on the states it visits, the committed ppo_continuous.py policy does not. With
    the flat observation's parts mixed up (or mirrored as one vector) this test fails."""
    pytest.importorskip("envpool")
    import symmetry

    import ppo_symaug

    args = ppo_symaug.Args(
        env_id="Go1JoystickFlatTerrain-v1", env_backend="envpool", symmetry="network",
        total_timesteps=128, num_envs=4, num_steps=32, num_minibatches=2, update_epochs=1,
        eval_episodes=1, log_dir=str(tmp_path / "runs"),
    )  # fmt: skip
    ppo_symaug.train(args)
    (network,) = (tmp_path / "runs").glob("*/checkpoint.pt")
    plain = os.path.join(
        ROOT, "benchmarks", "robots", "ppo_continuous-Go1JoystickFlatTerrain-v1.pt"
    )
    output = tmp_path / "symmetry.csv"
    symmetry.main(symmetry.Args(checkpoints=(str(network), plain), steps=300, output=str(output)))
    rows = list(csv.DictReader(open(output)))
    assert [row["script"] for row in rows] == ["ppo_symaug.py", "ppo_continuous.py"]
    assert float(rows[0]["symmetry_error"]) <= 1e-10
    assert float(rows[0]["clipped_symmetry_error"]) <= 1e-10
    assert float(rows[1]["symmetry_error"]) > 1e-3  # a plain policy: 1e-2 (RB, 20M)


def test_symmetry_rows_name_the_flags_that_differ_from_the_defaults():
    """symmetry.csv's flags column, from the checkpoint's saved settings: the training settings
    that differ from today's defaults, as flags; seed, env and logging are columns or do not
    count."""
    import dataclasses

    from symmetry import flags_of

    import ppo_symaug

    default = dataclasses.asdict(ppo_symaug.Args(seed=3, log_dir="x", env_id="Ant-v5"))
    assert flags_of(ppo_symaug, default) == ""
    saved = dataclasses.asdict(
        ppo_symaug.Args(anneal_lr=False, critic_layers=(256, 256), mirror_loss_coef=0.0)
    )
    saved["critic_layers"] = [256, 256]  # as a list, the way some checkpoints hold it
    expected = "--no-anneal-lr --critic-layers 256 256 --mirror-loss-coef 0.0"
    assert flags_of(ppo_symaug, saved) == expected
    del saved["mirror_loss_coef"]  # an older checkpoint without the field: the default
    assert flags_of(ppo_symaug, saved) == "--no-anneal-lr --critic-layers 256 256"


def test_report_puts_default_runs_beside_the_peers_and_flagged_runs_apart():
    from report import table

    def row(script, flags, seed, final, best=""):
        return {
            "env_id": "Hopper-v5",
            "script": script,
            "flags": flags,
            "total_timesteps": "1000000",
            "seed": seed,
            "final_return": final,
            "eval_return": "",
            "max_eval_return": best,
            "sps": "100",
        }

    text = table(
        [
            row("ppo_spo.py", "", "1", "2000"),
            row("ppo_spo.py", "", "2", "3000", best="3100"),
            row("ppo_ddp.py", "--num-envs 4 --nproc 2", "1", "2500"),
            row("ppo_spo.py", "--update-epochs 20", "1", "1000"),
        ]
    )
    defaults, experiments = text.split("**Experiments**")
    assert (
        "| Hopper-v5 | `ppo_spo.py` |  | 1,000,000 | 1, 2 | 2500 ± 500 | – "
        "| 3100 (1 of 2 runs) | 100 | 2382.86 ± 271.74 | 2410.44 ± 10.03 | 2609.3 ± 700.8 |"
        in defaults
    )
    assert "`ppo_ddp.py` | `--num-envs 4 --nproc 2` | 1,000,000 | 1 | 2500 |" in experiments
    assert (
        "| Hopper-v5 | `ppo_spo.py` | `--update-epochs 20` | 1,000,000 | 1 | 1000 | – | – | 100 |"
        in experiments
    )


def test_standing_compares_each_metric_with_its_own_peer():
    from report import standing

    def row(env_id, final, evaluated, best, steps="1000000", flags=""):
        fields = {"script": "ppo_continuous.py", "flags": flags, "total_timesteps": steps}
        numbers = {"final_return": final, "eval_return": evaluated, "max_eval_return": best}
        return fields | numbers | {"env_id": env_id}

    rows = [
        row("Hopper-v5", "2000", "2800", ""),  # no max recorded: the eval is its lower bound
        row("Hopper-v5", "3000", "2600", ""),
        row("HalfCheetah-v5", "1500", "5000", "5100"),
        row("HalfCheetah-v5", "1300", "4000", ""),  # bounds 5100, 4000: only the run with it
        row("Ant-v5", "1000", "2000", ""),  # no max and a lower eval: nothing to say
        row("Walker2d-v5", "3000", "3500", "3700"),  # a max 3700 and a bound 3600: above 3588
        row("Walker2d-v5", "3000", "3600", ""),
        row("Humanoid-v5", "5000", "6000", "", steps="3000000"),  # CleanRL's is at 1M steps
        row("Hopper-v5", "9000", "9000", "9000", flags="--update-epochs 20"),  # not a default
    ]
    assert standing(rows).splitlines() == [
        "| task | steps | final return vs CleanRL | eval return vs SB3 rl-zoo "
        "| max eval return vs Tianshou |",
        "|---|---|---|---|---|",
        "| Ant-v5 | 1,000,000 | – | ahead: 2000 vs 1327 (1.51x) | not measured |",
        "| HalfCheetah-v5 | 1,000,000 | behind: 1400 vs 1443 (0.97x) "
        "| behind: 4500 vs 5819 (0.77x) | behind: 5100 (1 of 2 runs) vs 5784 (0.88x) |",
        "| Hopper-v5 | 1,000,000 | ahead: 2500 vs 2383 (1.05x) | ahead: 2700 vs 2410 (1.12x) "
        "| ahead: 2700 (a lower bound) vs 2609 (1.03x) |",
        "| Humanoid-v5 | 3,000,000 | – | – | ahead: 6000 (a lower bound) vs 1360 (4.41x) |",
        "| Walker2d-v5 | 1,000,000 | ahead: 3000 vs 2288 (1.31x) | ahead: 3550 vs 3479 (1.02x) "
        "| ahead: 3650 (a lower bound) vs 3588 (1.02x) |",
    ]


def test_selection_scores_each_candidate_and_excludes_one_far_below_today():
    from selection import PEER, SELECTIONS, TASKS, held_out_table, selection_table

    selection = SELECTIONS["defaults"]
    CANDIDATES = selection["candidates"]

    def row(env_id, flags, seed, eval_return):
        fields = {"script": "ppo_continuous.py", "total_timesteps": "1000000", "seed": str(seed)}
        return fields | {"env_id": env_id, "flags": flags, "eval_return": str(eval_return)}

    rows = []
    for env in TASKS:  # today's defaults at the peers' numbers, A 10 % above on every task
        for seed in (1, 2):
            rows.append(row(env, "", seed, PEER[env]))
            rows.append(row(env, CANDIDATES["A"], seed, 1.1 * PEER[env]))
            scale = 0.5 if (env, seed) == ("Ant-v5", 2) else 1.5  # B's Ant mean: 1.0x
            rows.append(row(env, CANDIDATES["B"], seed, scale * PEER[env]))
    rows.append(row("Ant-v5", CANDIDATES["C"], 1, 0.89 * PEER["Ant-v5"]))
    rows.append(row("Ant-v5", CANDIDATES["C"], 2, 0.89 * PEER["Ant-v5"]))
    text = selection_table(rows, selection).splitlines()
    assert text[2].endswith("| 1.000 | yes |")  # the defaults
    assert text[3].endswith("| 1.100 | yes |")  # A
    assert text[4].endswith(f"| {(1.5 * 3 + 1.0) / 4:.3f} | yes |")  # B: Ant (1.5 + 0.5) / 2
    assert text[5].endswith("| – | no |")  # C: Ant 11 % below today, whatever else it does
    assert "| not run |" in text[5]
    rows.append(row("Hopper-v5", CANDIDATES["B"], 11, 3000))
    assert "| Hopper-v5 | 3000 | – | 2609 | – | not run | – | – |" in held_out_table(
        rows, selection
    )
    for seed in (12, 13):
        rows.append(row("Hopper-v5", CANDIDATES["B"], seed, 3000))
    rows.append(row("Hopper-v5", "", 3, 2000))  # today's defaults off the selection seeds
    rows.append(row("Hopper-v5", "", 4, 1000))
    table = held_out_table(rows, selection)
    winner = "| Hopper-v5 | 3000, 3000, 3000 | 3000 | 2609 | 1.15 |"
    assert f"{winner} 2000 (seed 3), 1000 (seed 4) | 1500 | 2.00 |" in table


def test_the_levers_rule_wants_every_run_and_a_margin_over_today():
    from selection import PEER, SELECTIONS, TASKS, held_out_table, selection_table

    levers = SELECTIONS["levers"]

    def rows_at(scale: dict) -> list[dict]:
        """Every selection run, each candidate at scale[name] x the peer's number."""
        fields = {"script": "ppo_continuous.py", "total_timesteps": "1000000"}
        return [
            fields | {"env_id": env, "flags": flags, "seed": str(seed)}
            | {"eval_return": str(scale[name] * PEER[env])}
            for name, flags in levers["candidates"].items()
            for env in TASKS
            for seed in levers["seeds"]
        ]  # fmt: skip

    scale = {"defaults": 1.0, "R": 1.06, "V": 1.04, "R+V": 0.85}  # R+V: 15 % below today
    text = selection_table(rows_at(scale), levers)
    assert text.endswith("By the rule: R wins (1.060 against today's 1.000).")
    assert "| R+V | " in text and text.split("| R+V | ")[1].split("\n")[0].endswith("| no |")
    scale["R"] = 1.04
    assert "is not 5% above today's defaults (1.000); the defaults stay" in selection_table(
        rows_at(scale), levers
    )
    assert selection_table(rows_at(scale)[1:], levers).endswith("until every selection run is in.")

    # R+V, out by the guard, cannot win with any other runs: a missing one does not hold it up.
    def without(flags: str) -> list[dict]:
        missing = ("Hopper-v5", flags, "3")
        return [
            row for row in rows_at(scale) if (row["env_id"], row["flags"], row["seed"]) != missing
        ]

    text = selection_table(without(levers["candidates"]["R+V"]), levers)
    assert text.endswith("(1.000); the defaults stay.")
    text = selection_table(without(levers["candidates"]["V"]), levers)
    assert text.endswith("until every selection run is in.")
    assert "nothing to hold out" in held_out_table(rows_at(scale), levers | {"winner": ""})


def test_the_levers_winner_holds_only_above_today_on_average_and_on_every_task():
    from selection import PEER, SELECTIONS, TASKS, held_out_table

    levers = {**SELECTIONS["levers"], "winner": "R"}

    def held_out(r_scale: dict) -> list[dict]:
        """Every held-out run: today's defaults at the peer's number, R at r_scale (1.2) x it."""
        fields = {"script": "ppo_continuous.py", "total_timesteps": "1000000"}
        rows = []
        for env in TASKS:
            for seed in levers["held_out"]:
                for name, scale in (("defaults", 1.0), ("R", r_scale.get(env, 1.2))):
                    evaluated = {"eval_return": str(scale * PEER[env]), "seed": str(seed)}
                    flags = {"flags": levers["candidates"][name], "env_id": env}
                    rows.append(fields | evaluated | flags)
        return rows

    verdict = held_out_table(held_out({}), levers).splitlines()[-1]
    assert verdict == "By the rule: R holds (winner / today: mean 1.20, lowest 1.20)."
    lowest = held_out_table(held_out({"HalfCheetah-v5": 0.89}), levers)  # mean 1.12
    assert lowest.endswith("R does not hold (winner / today: mean 1.12, lowest 0.89).")
    below = {env: 0.95 for env in TASKS} | {"Ant-v5": 1.05}
    assert held_out_table(held_out(below), levers).endswith(
        "(winner / today: mean 0.98, lowest 0.95)."
    )
    assert "R does not hold" in held_out_table(held_out(below), levers)
    missing = held_out_table(held_out({})[1:], levers)
    assert missing.endswith("By the rule: no verdict until every held-out run is in.")


def test_posture_measures_speed_and_flips_as_the_simulator_does():
    import mujoco
    import numpy as np
    import torch
    from posture import episode_posture, is_upside_down

    import ppo_continuous as ppo

    env = ppo.make_envs("HalfCheetah-v5", 1).envs[0].unwrapped
    torso = env.model.body("torso").id
    flipped = []
    for pitch in (0.0, 1.0, 2.0, np.pi, -2.0):  # HalfCheetah's rooty joint turns the torso
        env.data.qpos[2] = pitch
        mujoco.mj_forward(env.model, env.data)
        flipped.append(is_upside_down(env.data, torso))
    assert flipped == [False, False, True, True, True]  # cos(pitch) < 0 beyond 90 degrees

    # A random policy with saturated actions runs HalfCheetah backwards and flips it over; the
    # episode is chaotic, so one thread (the scripts' default) keeps it the same in any test order.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(2)
        agent = ppo.Agent(17, 6, ppo.Args())
        with torch.no_grad():
            agent.actor_mean[-1].weight.mul_(300)
        measured = episode_posture(ppo, agent, "HalfCheetah-v5", 5)
        # The same episode, measured from what the env reports and from the pitch joint.
        envs = ppo.make_envs("HalfCheetah-v5", 1)
        obs, _ = envs.reset(seed=5)
        velocities, flipped = [], []
        for _ in range(999):  # the last step's info is the next episode's reset info
            with torch.no_grad():
                obs = agent.normalize(torch.as_tensor(obs, dtype=torch.float32))
                action = ppo.scale_action(agent.actor_mean(obs).numpy(), envs.single_action_space)
            obs, _, _, _, info = envs.step(action)
            velocities.append(info["x_velocity"][0])
            flipped.append(np.cos(envs.envs[0].unwrapped.data.qpos[2]) < 0)
    finally:
        torch.set_num_threads(threads)
    assert measured["length"] == 1000
    assert measured["speed"] == pytest.approx(np.mean(velocities), abs=0.02)
    assert measured["upside_down"] == pytest.approx(np.mean(flipped), abs=0.01)
    assert np.mean(velocities) < -0.05  # the speed check is not one of zeros


def test_robots_evaluates_a_privileged_teacher_and_its_student_on_the_env_s_own_slots(tmp_path):
    """benchmarks/robots.py on a Go1 teacher whose actor reads [state | privileged_state] and on
    its student (state and its history): each trace's first step holds the command and the
    measured velocities that a pool of the same seeds shows, read here by key (state[45:48];
    privileged_state[57], [58], [50]); every episode gets its per-step reward terms."""
    pytest.importorskip("envpool")
    import envpool
    import numpy as np
    import robots

    import ppo_continuous as pc
    import ppo_teacher_student as ts

    fields = dict(env_id="Go1JoystickFlatTerrain-v1", env_backend="envpool", total_timesteps=128)
    fields.update(num_envs=2, num_steps=64, num_minibatches=2, update_epochs=1, eval_episodes=1)
    pc.train(pc.Args(**fields, privileged_actor=True, log_dir=str(tmp_path / "teacher")))
    (teacher,) = (tmp_path / "teacher").glob("*/checkpoint.pt")
    ts.train(ts.Args(**fields, teacher=str(teacher), history=2, log_dir=str(tmp_path / "student")))
    (student,) = (tmp_path / "student").glob("*/checkpoint.pt")
    seed = pc.Args().seed + pc.EVAL_SEED_OFFSET
    pool = envpool.make_gymnasium(fields["env_id"], num_envs=2, seed=[seed, seed + 1])
    first = pool.reset()[0]
    pool.close()
    state, privileged = first["state"][0], first["privileged_state"][0]
    expected = [*state[45:48], privileged[57], privileged[58], privileged[50]]
    for path in (teacher, student):
        script, ckpt, agent = robots.load(str(path))
        result = robots.evaluate(script, ckpt, agent, episodes=2, trace=True)
        np.testing.assert_allclose(result["trace"][0], expected, rtol=1e-6, err_msg=str(path))
        for name in ("tracking_lin_vel", "tracking_ang_vel"):
            assert np.isfinite(result["terms"][name]).all() and result["terms"][name].any()


def test_robots_evaluates_on_the_run_s_threads(monkeypatch):
    """benchmarks/robots.py evaluates with the run's --threads, as the run's own evaluation did:
    another thread count sums the networks' floats in another order, and a chaotic robot episode
    then ends elsewhere (a Go1 student's re-evaluation differed from its run's by 0.05)."""
    import robots

    path = os.path.join(ROOT, "benchmarks", "robots", "ppo_continuous-Go1JoystickFlatTerrain-v1.pt")
    script, ckpt, agent = robots.load(path)
    seen = []
    monkeypatch.setattr(script, "make_envs", lambda *_: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(AttributeError):  # make_envs gave None: the evaluation stops there
            robots.evaluate(script, ckpt, agent, episodes=1, trace=False)
    finally:
        torch.set_num_threads(before)
    assert seen == [ckpt["args"]["threads"]] == [1]


def test_robot_curves_average_each_tracking_term_over_its_bins(tmp_path):
    """robots.py --curves: each run's logged tracking terms, averaged per bin of steps (here two
    values a bin, one bin left empty), one curve per term and run, and the plot written."""
    import robots
    from torch.utils.tensorboard import SummaryWriter

    logged = {"tracking_lin_vel": [0.1, 0.3, 0.5, 0.9], "tracking_ang_vel": [0.2, 0.2, 0.4, 0.3]}
    writer = SummaryWriter(str(tmp_path / "run"))
    for term, values in logged.items():
        for step, value in zip([100, 400, 1200, 1400], values):  # bins 0, 0, 2, 2
            writer.add_scalar(f"reward_terms/{term}", value, step)
    writer.close()
    plot = tmp_path / "tracking.png"
    args = robots.Args(curves=(str(tmp_path / "run"),), labels=("R",), bin_steps=500)
    drawn = robots.plot_curves(args.curves, args.labels, args.bin_steps, str(plot))
    steps, means = drawn[("R", "tracking_lin_vel")]
    assert steps.tolist() == [250, 1250] and means == pytest.approx([0.2, 0.7])
    assert drawn[("R", "tracking_ang_vel")][1] == pytest.approx([0.2, 0.35])
    assert plot.stat().st_size > 1000
    with pytest.raises(SystemExit, match="one label per --curves"):
        robots.main(robots.Args(curves=args.curves))


def test_robots_gif_is_five_seconds_of_the_video_from_its_second_second(
    tmp_path, capsys, monkeypatch
):
    """robots.py --gif: frames 100, 105, ..., 345 of the video (frame k's left half painted in a
    colour of its own), 200 px resampled smoothly (the right half's 1-pixel checkerboard turns
    grey), at most 64 colours, 0.1 s each (real time at 50 steps a second), looping; a real MP4
    is read too."""
    import imageio.v3
    import numpy as np
    import robots
    from PIL import Image

    def colour(k):
        return np.array([k % 256, k * 37 % 256, 90])  # frames k and k+1 differ by 37 in green

    frames = np.zeros((400, 96, 96, 3), dtype=np.uint8)
    frames[:, :, :48] = np.stack([colour(k) for k in range(400)])[:, None, None]
    frames[:, :, 48:] = 255 * (np.indices((96, 48)).sum(0) % 2)[None, :, :, None]
    video, gif = tmp_path / "episode.mp4", tmp_path / "walking.gif"
    imageio.v3.imwrite(video, frames, fps=50)
    robots.main(robots.Args(gif=(str(video), str(gif))))  # a real MP4: 50 frames read
    assert capsys.readouterr().out.splitlines()[0] == f"wrote {gif}: 50 frames of {video}"
    monkeypatch.setattr(imageio.v3, "imread", lambda path: frames)  # exact colours, no codec
    robots.main(robots.Args(gif=(str(video), str(gif))))
    with Image.open(gif) as image:
        assert (image.n_frames, image.size, image.info["loop"]) == (50, (200, 200), 0)
        for k, shown in enumerate(range(100, 350, 5)):
            image.seek(k)
            assert image.info["duration"] == 100
            rgb = np.asarray(image.convert("RGB"), dtype=int)
            assert np.abs(rgb[100, 50] - colour(shown)).max() <= 3, (k, rgb[100, 50])
            assert ((rgb[20:180, 110:190] > 60) & (rgb[20:180, 110:190] < 195)).mean() > 0.5
            assert len(image.convert("RGB").getcolors(1 << 16)) <= 64
    for wrong in [(str(video),), (str(video), str(gif), str(gif))]:
        with pytest.raises(SystemExit, match="--gif VIDEO GIF"):
            robots.main(robots.Args(gif=wrong))


def test_robots_drift_random_actions_push_go1_backward():
    """robots.py --drift-stds: standing (std 0) Go1 barely moves and earns a reward almost every
    step; random actions of the recipe's initial std (0.37) walk it backward at about 0.25 m/s in
    every env, sideways hardly at all (the backward push exploration gives before any gait is
    learned), and their penalties leave most steps' reward at the env's clip, exactly 0."""
    pytest.importorskip("envpool")
    import robots

    vx, vy, zero = robots.drift(0.0, num_envs=8, steps=150)
    assert abs(vx) < 0.03 and abs(vy) < 0.03 and zero < 0.01
    vx, vy, zero = robots.drift(0.37, num_envs=8, steps=150)
    assert vx < -0.15 and abs(vy) < 0.1 and zero > 0.8


def test_robots_recomputes_each_step_s_linear_tracking_from_the_obs(tmp_path):
    """robots.py's per-speed breakdown: the linear tracking it recomputes from each step's obs
    (the command before it, the privileged local velocity after it: a done episode's last obs)
    averages, episode by episode, to the env's own reward_terms; by_bin and breakdown bin it by
    commanded speed and by commanded forward velocity."""
    pytest.importorskip("envpool")
    import numpy as np
    import robots

    path = os.path.join(ROOT, "benchmarks", "robots", "ppo_continuous-Go1JoystickFlatTerrain-v1.pt")
    script, ckpt, agent = robots.load(path)
    result = robots.evaluate(script, ckpt, agent, episodes=2, trace=False)
    per_step = result["tracking"]  # each episode ends done, its last obs in final_obs
    lengths, terms = result["lengths"], result["terms"]["tracking_lin_vel"]
    assert len(per_step) == lengths.sum()
    assert per_step.mean() == pytest.approx((terms * lengths).sum() / lengths.sum(), rel=1e-5)
    errors = ((result["commands"] - result["velocities"]) ** 2).sum(-1)
    assert np.exp(-errors / 0.25) == pytest.approx(per_step)  # the velocities the term measures
    speeds = np.array([0.0, 0.4, 0.5, 1.0])
    shares = robots.by_bin(speeds, np.array([0.9, 0.7, 0.3, 0.1]), robots.SPEED_BINS)
    assert shares[(0.0, 0.5)] == pytest.approx((0.5, 0.8))  # a bin holds its lower edge
    assert shares[(0.5, 1.0)] == pytest.approx((0.25, 0.3))
    assert shares[(1.0, np.inf)] == pytest.approx((0.25, 0.1))
    # per commanded vx: a robot that walks backward on command and stands when sent forward
    commands = np.array([[-0.8, 0.3], [-0.5, 0.0], [0.0, 0.6], [0.9, -0.2], [0.5, 0.0]])
    measured = np.array([[-0.7, 0.3], [-0.5, 0.1], [0.1, 0.5], [0.0, 0.0], [0.02, 0.0]])
    tracking = np.exp(-((commands - measured) ** 2).sum(-1) / 0.25)
    lines = robots.breakdown({"commands": commands, "velocities": measured, "tracking": tracking})
    assert len(lines) == 6 and lines[0].startswith("linear tracking at commanded speed 0.0-0.5")
    assert lines[3] == (f"linear tracking at commanded vx -inf to -0.25 m/s: "
                        f"{tracking[:2].mean():.3f} (40% of the steps; vx -0.65 commanded, "
                        f"-0.60 measured)")  # fmt: skip
    assert "(20% of the steps; vx +0.00 commanded, +0.10 measured)" in lines[4]
    assert lines[5].endswith(f"{tracking[3:].mean():.3f} (40% of the steps; vx +0.70 commanded, "
                             f"+0.01 measured)")  # fmt: skip


def short_episodes(script, monkeypatch, steps: int):
    """The script's envs with a time limit of `steps` steps (EnvPool's make-time option)."""
    make_envs = script.make_envs
    monkeypatch.setattr(
        script, "make_envs", lambda *a, **kw: make_envs(*a, max_episode_steps=steps, **kw)
    )


def test_robots_counts_a_fall_only_where_an_episode_terminated_and_keeps_each_first_episode(
    monkeypatch,
):
    """robots.py's bookkeeping, against the pool's own flags and terms: with a time limit of 100
    steps, env 0 driven to fall (every joint at its bound) ends early twice, while the others
    stand until the limit. Falls count the terminated first episodes only (not those cut
    by the time limit), lengths the first episodes' steps, and each env's reward terms are those
    its first episode ended with, not a later one's."""
    pytest.importorskip("envpool")
    import robots

    path = os.path.join(ROOT, "benchmarks", "robots", "ppo_continuous-Go1JoystickFlatTerrain-v1.pt")
    script, ckpt, agent = robots.load(path)
    short_episodes(script, monkeypatch, 100)

    class FallsInEnv0:  # env 0: every joint at +1 (it falls); the others: the default pose
        def mean_action(self, obs):
            action = torch.zeros(obs.shape[0], 12)
            action[0] = 1.0
            return action

    seen, step = [], script.EnvPoolVectorEnv.step

    def recorded_step(self, actions):
        result = step(self, actions)
        seen.append(result)
        return result

    monkeypatch.setattr(script.EnvPoolVectorEnv, "step", recorded_step)
    result = robots.evaluate(script, ckpt, FallsInEnv0(), episodes=3, trace=False)
    first_end = [next(t for t, r in enumerate(seen) if r[2][i] or r[3][i]) for i in range(3)]
    fell = [bool(seen[t][2][i]) for i, t in enumerate(first_end)]
    assert fell[0] and not any(fell[1:]) and first_end[1:] == [99, 99]  # the limit is no fall
    assert result["falls"].tolist() == fell
    assert result["lengths"].tolist() == [t + 1 for t in first_end]
    for i, t in enumerate(first_end):
        ended_with = seen[t][4]["reward_terms"]["tracking_lin_vel"][i]
        assert result["terms"]["tracking_lin_vel"][i] == ended_with
    ends_of_0 = [t for t, r in enumerate(seen) if r[2][0] or r[3][0]]
    assert ends_of_0[1] < 99  # a second episode of env 0 ended before the others' first


def test_robots_prints_a_table_and_records_only_when_asked(tmp_path, capsys):
    """robots.py evaluates 50 episodes by default and writes nothing unless --record: a user who
    scores a committed checkpoint leaves robots.csv as it is. Its output is a table with a header,
    whose forward tracking is the linear tracking of the steps commanded forward; --record
    appends the row, with the episode count and the forward tracking, to the CSV given."""
    pytest.importorskip("envpool")
    import csv

    import robots

    assert robots.Args().episodes == 50 and robots.Args().record is False
    path = os.path.join(ROOT, "benchmarks", "robots", "ppo_continuous-Go1JoystickFlatTerrain-v1.pt")
    output = tmp_path / "robots.csv"
    robots.main(robots.Args(checkpoints=(path,), episodes=3, output=str(output)))
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split()[:4] == ["script", "task", "seed", "steps"] and not output.exists()
    assert printed[1].split()[0] == "ppo_continuous.py" and printed[1].endswith("of 3")
    script, ckpt, agent = robots.load(path)
    result = robots.evaluate(script, ckpt, agent, episodes=3, trace=False)  # some sent forward
    forward = result["commands"][:, 0] > 0.25
    assert 0 < forward.sum() < len(forward)
    expected = round(float(result["tracking"][forward].mean()), 3)
    assert f" {expected} " in printed[1]
    robots.main(robots.Args(checkpoints=(path,), episodes=3, output=str(output), record=True))
    (row,) = csv.DictReader(output.open())
    assert row["eval_episodes"] == "3" and float(row["eval_tracking_forward"]) == expected


def test_robots_drives_the_commands_chosen_and_reports_each(tmp_path, capsys):
    """--plot's follow(): the policy gets each chosen command in every command slot of its
    observation (state's, and privileged_state's copy) for its seconds, in order; followed()
    reports per command the mean measured velocities and the linear tracking against it."""
    pytest.importorskip("envpool")
    import numpy as np
    import robots

    path = os.path.join(ROOT, "benchmarks", "robots", "ppo_continuous-Go1JoystickFlatTerrain-v1.pt")
    script, ckpt, agent = robots.load(path)
    seen, mean_action = [], agent.mean_action

    def recorded(obs):
        seen.append((obs[0, 45:48].tolist(), obs[0, 48 + 45 : 48 + 48].tolist()))
        return mean_action(obs)

    agent.mean_action = recorded
    commands = np.array([[0.5, 0.0, 0.0], [0.0, 0.3, -1.0]], dtype=np.float32)
    trace = robots.follow(script, ckpt, agent, commands, seconds=0.1)  # 5 steps each
    assert len(trace) == len(seen) == 10
    for t, (state, privileged) in enumerate(seen):
        expected = commands[t // 5].tolist()
        assert state == expected and privileged == expected
        assert trace[t][:3] == pytest.approx(expected)
    synthetic = [[0.5, 0.0, 0.0, 0.4, 0.1, 0.0]] * 2 + [[0.0, 0.3, -1.0, 0.0, 0.1, -0.5]] * 3
    first, second = robots.followed(synthetic)
    assert first.startswith("commanded vx +0.50 vy +0.00 yaw +0.00: measured vx +0.40 vy +0.10")
    assert first.endswith(f"over 0.0 s (linear tracking {np.exp(-0.02 / 0.25):.3f})")
    assert second.startswith("commanded vx +0.00 vy +0.30 yaw -1.00: measured vx +0.00 vy +0.10 "
                             "yaw -0.50 over 0.1 s")  # fmt: skip
    assert second.endswith(f"(linear tracking {np.exp(-0.04 / 0.25):.3f})")


def test_robots_gives_each_checkpoint_its_own_row(tmp_path, capsys):
    """Two checkpoints: each row its own --wall-seconds and falls out of its own episodes; with
    --record the rows go to the CSV given and the results.csv beside it, not the repository's."""
    pytest.importorskip("envpool")
    import csv

    import robots

    folder = os.path.join(ROOT, "benchmarks", "robots")
    paths = tuple(os.path.join(folder, f"{name}-Go1JoystickFlatTerrain-v1.pt")
                  for name in ("ppo_continuous", "ppo_symaug"))  # fmt: skip
    ours = os.path.join(ROOT, "benchmarks", "results.csv")
    before = open(ours).read()
    output = tmp_path / "robots.csv"
    args = robots.Args(checkpoints=paths, episodes=3, wall_seconds=(10, 20), output=str(output))
    robots.main(dataclasses.replace(args, record=True))
    rows = list(csv.DictReader(output.open()))
    assert [row["wall_seconds"] for row in rows] == ["10", "20"]
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[-1] for line in printed[1:3]] == ["3", "3"]  # "N of 3"
    assert len((tmp_path / "results.csv").read_text().splitlines()) == 2
    assert open(ours).read() == before


def test_batch_shape_measures_a_real_run_s_sps_and_update_share(tmp_path, capsys):
    """benchmarks/batch_shape.py, for real: a training process of the shape, its row the SPS the
    run logged and the update's share of its training time (the order: the test below)."""
    import batch_shape

    output = tmp_path / "batch_shape.csv"
    fields = dict(shapes=("4x32",), total_timesteps=512, rounds=1, output=str(output))
    batch_shape.main(batch_shape.Args(env_id="Hopper-v5", recipe=False, **fields))
    with open(output) as f:
        (row,) = csv.DictReader(f)
    assert (row["num_envs"], row["num_steps"], row["batch"]) == ("4", "32", "128")
    assert int(row["sps"]) > 0 and 0 < float(row["update_share"]) < 1
    assert "| 4 x 32 | 128 | " in capsys.readouterr().out


FAKE_SCRIPT = """
import time
def ppo_update(seconds):
    time.sleep(seconds)
def parse_args(argv):
    return [float(a) for a in argv]
def train(args):
    for seconds in args:
        ppo_update(seconds)
"""


def test_batch_shape_times_every_update_but_the_first_and_runs_the_readme_s_recipe(
    tmp_path, monkeypatch
):
    """The driver's seconds leave out the first update (charts/SPS leaves out the first
    iteration); the share is those seconds over the steps after the first batch at the logged SPS;
    the command is the README's first-screen recipe with the shape's envs and steps."""
    import batch_shape
    from torch.utils.tensorboard import SummaryWriter

    (tmp_path / "fake_script.py").write_text(FAKE_SCRIPT)
    command = [sys.executable, "-c", batch_shape.DRIVER, "fake_script", "0.4", "0.05", "0.1"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, check=True)
    seconds = float(done.stdout.split()[-1])
    assert 0.15 <= seconds < 0.35, seconds  # 0.05 + 0.1, not the first 0.4 nor without the last

    commands = []

    def fake_run(command, **kwargs):  # a run of 512 steps logged at 100 SPS, 2 s of updates
        commands.append(command)
        log_dir = command[command.index("--log-dir") + 1]
        with SummaryWriter(os.path.join(log_dir, "run")) as writer:
            writer.add_scalar("charts/SPS", 100, 512)
        return subprocess.CompletedProcess(command, 0, "progress\nupdate seconds 2.0\n", "")

    monkeypatch.setattr(batch_shape.subprocess, "run", fake_run)
    for recipe in (True, False):
        args = batch_shape.Args(recipe=recipe, total_timesteps=512)
        assert batch_shape.measure(args, 4, 32) == (100, 2.0 / ((512 - 128) / 100))
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    shown = readme[readme.index("python ppo_continuous.py --env-backend envpool") :]
    shown = " ".join(shown[: shown.index("```")].replace("\\", " ").split())
    for flag in ("--env-id Go1JoystickFlatTerrain-v1 ", "--num-envs 32 --num-steps 128 "):
        shown = shown.replace(flag, "")
    recipe = " ".join(["python ppo_continuous.py", *batch_shape.RECIPE])
    assert shown == f"{recipe} --total-timesteps 20000000"
    for command, recipe in zip(commands, (batch_shape.RECIPE, [])):
        i = command.index("--env-id")
        assert command[i : i + 2 + len(recipe) + 6] == [
            *["--env-id", "Go1JoystickFlatTerrain-v1", *recipe],
            *["--num-envs", "4", "--num-steps", "32", "--total-timesteps", "512"],
        ]
    failed = subprocess.CompletedProcess([], 1, "", "error: --gamma must be in (0, 1]")
    monkeypatch.setattr(batch_shape.subprocess, "run", lambda command, **kwargs: failed)
    with pytest.raises(SystemExit, match="4x32 failed: error: --gamma must be in"):
        batch_shape.measure(batch_shape.Args(), 4, 32)


def test_batch_shape_runs_the_shapes_in_turn_and_tables_their_medians(
    tmp_path, monkeypatch, capsys
):
    import batch_shape

    measured = {(8, 16): [(200, 0.2), (100, 0.1), (300, 0.3)], (16, 4): [(400, 0.4)] * 3}
    order = []

    def fake_measure(args, num_envs, num_steps):
        order.append((num_envs, num_steps))
        return measured[(num_envs, num_steps)][order.count((num_envs, num_steps)) - 1]

    monkeypatch.setattr(batch_shape, "measure", fake_measure)
    output = tmp_path / "rows.csv"
    batch_shape.main(batch_shape.Args(shapes=("8x16", "16x4"), rounds=3, output=str(output)))
    assert order == [(8, 16), (16, 4)] * 3
    with open(output) as f:
        rows = [(r["num_envs"], r["num_steps"], r["batch"], r["round"]) for r in csv.DictReader(f)]
    assert rows == [("8", "16", "128", "1"), ("16", "4", "64", "1")] + [
        ("8", "16", "128", "2"), ("16", "4", "64", "2"), ("8", "16", "128", "3"),
        ("16", "4", "64", "3"),
    ]  # fmt: skip
    table = capsys.readouterr().out
    assert "| 8 x 16 | 128 | 200 | 1.00 | 20% |" in table  # medians, not the last round's
    assert "| 16 x 4 | 64 | 400 | 2.00 | 40% |" in table
    for bad in ("32*128", "32x0", "0x128"):
        with pytest.raises(SystemExit, match=f"such as 32x128, got '{re.escape(bad)}'"):
            batch_shape.main(batch_shape.Args(shapes=(bad,)))
