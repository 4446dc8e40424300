"""Tests of ppo_symaug.py's mirror maps of EnvPool's MuJoCo Playground robots (#43):
Go1JoystickFlatTerrain-v1 and BerkeleyHumanoidJoystickFlatTerrain-v1, a Dict observation
{"state", "privileged_state"} each.

The judges are the robots' own model and env, not the script's tables: the XML that EnvPool loads
(with the mujoco package: a mirrored configuration's bodies, feet and sensors read as the mirror
image of the original's), and the env's observations (sensor noise off). The test's observation
layout (observe) follows EnvPool's C++ (envpool/mujoco/playground/go1.h FillObs,
berkeley_humanoid.h UpdateObs); the env's observations check what of it they can (the slots
filled twice, the last action, the command).
"""

import dataclasses
import glob
import os

import mujoco
import numpy as np
import pytest
import torch

import ppo_symaug as ps

envpool = pytest.importorskip("envpool")

S = np.array([1.0, -1.0, 1.0])  # the reflection by the plane y = 0, on a polar vector


@dataclasses.dataclass(frozen=True)
class Robot:
    folder: str  # under mujoco_playground/_src/locomotion
    pairs: tuple  # (left, right) name prefixes of partner bodies and sites
    feet: tuple  # the feet sites, in the order of the per-foot observation slots
    contacts: tuple  # the feet's floor contact sensors, in the same order
    state_dim: int
    privileged_dim: int
    command: slice  # the state's (v_x, v_y, yaw rate)
    last_act: slice  # the state's last action
    # (privileged slots, state slots) that EnvPool fills with the same numbers (noise off)
    duplicates: tuple
    floor: str = "flat"  # the scene: scene_mjx_feetonly_{floor}_terrain.xml


ROBOTS = {
    "Go1JoystickFlatTerrain-v1": Robot(
        "go1",
        (("FL", "FR"), ("RL", "RR")),
        ("FR", "FL", "RR", "RL"),
        ("FR_floor_found", "FL_floor_found", "RR_floor_found", "RL_floor_found"),
        48,
        123,
        slice(45, 48),
        slice(33, 45),
        # gyro, gravity, linvel, q - q0, qvel
        ((slice(48, 51), slice(3, 6)), (slice(54, 57), slice(6, 9)), (slice(57, 60), slice(0, 3)))
        + ((slice(63, 75), slice(9, 21)), (slice(75, 87), slice(21, 33))),
    ),
    "BerkeleyHumanoidJoystickFlatTerrain-v1": Robot(
        "berkeley_humanoid",
        (("ll_", "lr_"), ("l_", "r_")),
        ("l_foot", "r_foot"),
        ("l_foot1_floor_found", "r_foot1_floor_found"),
        52,
        114,
        slice(9, 12),
        slice(36, 48),
        ((slice(52, 55), slice(3, 6)), (slice(58, 61), slice(6, 9)), (slice(61, 64), slice(0, 3)))
        + ((slice(67, 79), slice(12, 24)), (slice(79, 91), slice(24, 36))),
    ),
}
# The rough terrain's task is the flat one's robot and observation (go1.h: one class, whose scene
# alone differs) on a height field of random bumps: the same maps, checked on its own scene.
ROBOTS["Go1JoystickRoughTerrain-v1"] = dataclasses.replace(
    ROBOTS["Go1JoystickFlatTerrain-v1"], floor="rough"
)
ENV_IDS = list(ROBOTS)
KEYS = ("state", "privileged_state")


def partner(robot: Robot, name: str) -> str:
    for left, right in robot.pairs:
        for a, b in ((left, right), (right, left)):
            if name.startswith(a):
                return b + name[len(a) :]
    return name


def load_model(robot: Robot) -> mujoco.MjModel:
    """The task's scene EnvPool loads, from the installed envpool_assets packages."""
    site_packages = os.path.dirname(os.path.dirname(envpool.__file__))
    pattern = "envpool_assets*/mujoco/playground/assets/mujoco_playground/_src/locomotion"
    scene = f"xmls/scene_mjx_feetonly_{robot.floor}_terrain.xml"
    (path,) = glob.glob(os.path.join(site_packages, pattern, robot.folder, scene))
    return mujoco.MjModel.from_xml_path(path)


def maps(env_id: str):
    """mirror_obs and mirror_act on float64 numpy arrays."""
    mirror_obs, mirror_act = ps.make_mirror_fns(env_id)

    def obs(o: dict) -> dict:
        return {
            k: v.numpy()
            for k, v in mirror_obs({k: torch.as_tensor(v) for k, v in o.items()}).items()
        }

    return obs, lambda a: mirror_act(torch.as_tensor(a)).numpy()


def t(x) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x), dtype=torch.float64)


# ---------------------------------------------------------------------------------------------
# The maps as data: signed permutations, involutions, of the env's sizes
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_robot_maps_are_signed_permutation_involutions_of_the_envs_sizes(env_id):
    robot = ROBOTS[env_id]
    env = envpool.make_gymnasium(env_id, num_envs=1, num_threads=1, seed=0, noise_level=0.0)
    spaces = env.observation_space
    assert (spaces["state"].shape, spaces["privileged_state"].shape, env.action_space.shape) == (
        (robot.state_dim,),
        (robot.privileged_dim,),
        (12,),
    )
    env.close()
    mirror_obs, mirror_act = ps.make_mirror_fns(env_id)
    matrices = {
        k: mirror_obs({k: torch.eye(spaces[k].shape[0], dtype=torch.float64)})[k] for k in KEYS
    }
    matrices["action"] = mirror_act(torch.eye(12, dtype=torch.float64))
    for name, m in matrices.items():
        n = m.shape[0]
        assert m.shape == (n, n), name  # every slot mapped, none twice
        assert torch.equal(m.abs().sum(0), torch.ones(n)) and torch.equal(
            m.abs().sum(1), torch.ones(n)
        )
        assert torch.equal(m @ m, torch.eye(n, dtype=torch.float64)), f"{name}: not an involution"
        assert not torch.equal(m, torch.eye(n, dtype=torch.float64))
    x = {k: torch.randn(3, spaces[k].shape[0], dtype=torch.float64) for k in KEYS}
    mirrored = mirror_obs(x)
    assert list(mirrored) == list(KEYS)
    assert all(torch.equal(mirror_obs(mirrored)[k], x[k]) for k in KEYS)
    # privileged_state starts with state: the same map there
    head = mirror_obs({"state": x["privileged_state"][:, : robot.state_dim]})["state"]
    assert torch.equal(mirrored["privileged_state"][:, : robot.state_dim], head)


# ---------------------------------------------------------------------------------------------
# The model: the mirrored configuration is the mirror image, and so are the sensors' readings
# ---------------------------------------------------------------------------------------------
def default_pose(model: mujoco.MjModel) -> np.ndarray:
    """q0, the home keyframe's joint angles: the envs' default pose (go1.h, berkeley_humanoid.h)."""
    return model.key("home").qpos[7:].copy()


def check_joint_order(model: mujoco.MjModel):
    """The envs read qpos[7:] and qvel[6:] as the joints in actuator order."""
    joints = model.actuator_trnid[:, 0]
    assert model.nu == 12 and model.jnt_type[0] == mujoco.mjtJoint.mjJNT_FREE
    np.testing.assert_array_equal(model.jnt_qposadr[joints], np.arange(7, 19))
    np.testing.assert_array_equal(model.jnt_dofadr[joints], np.arange(6, 18))


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_mirrored_joint_angles_pose_the_mirror_image_of_the_robot(env_id):
    """With the root at the origin, upright, the joint angles mirror_act(q) put every body and
    every foot where the reflection (y -> -y) puts its partner (left <-> right, by name) at q.
    This proves the joint swap and each joint's sign; the default pose is its own mirror image."""
    robot = ROBOTS[env_id]
    model = load_model(robot)
    check_joint_order(model)
    _, mirror_act = ps.make_mirror_fns(env_id)
    q0 = default_pose(model)
    np.testing.assert_allclose(mirror_act(t(q0)).numpy(), q0, atol=1e-12)
    bodies = [model.body(partner(robot, model.body(i).name)).id for i in range(model.nbody)]
    feet = [model.site(f).id for f in robot.feet]
    partner_feet = [model.site(partner(robot, f)).id for f in robot.feet]
    original, mirrored = mujoco.MjData(model), mujoco.MjData(model)
    rng = np.random.default_rng(0)
    for _ in range(50):
        q = q0 + rng.uniform(-0.6, 0.6, 12)
        for data, angles in ((original, q), (mirrored, mirror_act(t(q)).numpy())):
            data.qpos[:] = 0.0
            data.qpos[3], data.qpos[7:] = 1.0, angles
            mujoco.mj_kinematics(model, data)
        np.testing.assert_allclose(mirrored.xpos, original.xpos[bodies] * S, atol=1e-12)
        np.testing.assert_allclose(
            mirrored.site_xpos[feet], original.site_xpos[partner_feet] * S, atol=1e-12
        )


def observe(robot: Robot, model, data, command, last_act, air_time, phase) -> dict:
    """The observation EnvPool makes of this simulator state, noise off: go1.h FillObs,
    berkeley_humanoid.h UpdateObs. command, last_act, air_time and phase are the env's own
    bookkeeping, not the simulator's."""

    def sensor(name):
        return data.sensor(name).data.copy()

    gravity = -data.site("imu").xmat[6:9]  # the world's -z in the IMU's frame
    linvel, gyro = sensor("local_linvel"), sensor("gyro")
    q, v = data.qpos[7:] - default_pose(model), data.qvel[6:].copy()
    sensors = [gyro, sensor("accelerometer"), gravity, linvel, sensor("global_angvel")]
    contact = [float(sensor(name)[0] > 0.0) for name in robot.contacts]
    feet_vel = np.concatenate([sensor(f"{foot}_global_linvel") for foot in robot.feet])
    force = data.actuator_force.copy()
    if robot.folder == "go1":
        state = [linvel, gyro, gravity, q, v, last_act, command]
        push = data.xfrc_applied[model.body("trunk").id, :3]
        extra = [q, v, force, contact, feet_vel, air_time, push, [0.0]]
    else:
        state = [linvel, gyro, gravity, command, q, v, last_act, np.cos(phase), np.sin(phase)]
        extra = [q, v, [data.qpos[2]], force, contact, feet_vel, air_time]
    state = np.concatenate(state)
    return {"state": state, "privileged_state": np.concatenate([state, *sensors, *extra])}


def set_state(model, data, qpos, qvel, qacc, ctrl, push):
    """The state, its sensors computed with these accelerations (not the dynamics': the mirror
    is the mirror of the kinematics, and the models' masses are not exactly symmetric)."""
    mujoco.mj_resetData(model, data)
    data.qpos[:], data.qvel[:], data.ctrl[:] = qpos, qvel, ctrl
    data.xfrc_applied[1] = push
    mujoco.mj_forward(model, data)
    data.qacc[:] = qacc
    mujoco.mj_rnePostConstraint(model, data)
    mujoco.mj_sensorAcc(model, data)


def mirror_errors(env_id: str, model: mujoco.MjModel, samples: int = 40):
    """max |mirror_obs(o) - o'| per slot over random states, o' observed in the mirror image:
    root position S p, quaternion (w, -S v), linear velocity S v, local angular velocity and
    acceleration -S w, joints by mirror_act (proven above), push force S f and torque -S t. The
    bookkeeping is mirrored as physics says: the command (v_x, v_y, yaw rate) to (v_x, -v_y,
    -yaw rate), the last action by mirror_act, each foot's values to its partner's. Also the
    number of foot contacts seen."""
    robot = ROBOTS[env_id]
    mirror_obs, mirror_act = ps.make_mirror_fns(env_id)
    q0 = default_pose(model)
    feet = [robot.feet.index(partner(robot, foot)) for foot in robot.feet]
    axial = -S
    errors = {k: 0.0 for k in KEYS}
    contacts = 0
    rng = np.random.default_rng(1)
    original, mirrored = mujoco.MjData(model), mujoco.MjData(model)
    for _ in range(samples):
        roll, pitch, yaw = rng.uniform(-0.3, 0.3), rng.uniform(-0.3, 0.3), rng.uniform(-3, 3)
        quat = np.zeros(4)
        mujoco.mju_euler2Quat(quat, [roll, pitch, yaw], "xyz")
        root = [0.1, -0.2, model.key("home").qpos[2] + rng.uniform(-0.04, 0.02)]
        qpos = np.concatenate([root, quat, q0 + rng.uniform(-0.3, 0.3, 12)])
        qvel, qacc = rng.normal(0.0, 1.0, model.nv), rng.normal(0.0, 5.0, model.nv)
        ctrl, push = q0 + 0.5 * rng.uniform(-1, 1, 12), rng.normal(0.0, 5.0, 6)
        command, last_act = rng.uniform(-1, 1, 3), rng.uniform(-1, 1, 12)
        air_time, phase = rng.uniform(0, 1, len(feet)), rng.uniform(-np.pi, np.pi, 2)

        def joints(x):
            return mirror_act(t(x)).numpy()

        set_state(model, original, qpos, qvel, qacc, ctrl, push)
        mirrored_qpos = np.concatenate([qpos[:3] * S, qpos[3:7] * [1, -1, 1, -1], joints(qpos[7:])])
        mirrored_qvel = [
            np.concatenate([x[:3] * S, x[3:6] * axial, joints(x[6:])]) for x in (qvel, qacc)
        ]
        set_state(
            model, mirrored, mirrored_qpos, *mirrored_qvel, joints(ctrl),
            np.concatenate([push[:3] * S, push[3:] * axial]),
        )  # fmt: skip
        o = observe(robot, model, original, command, last_act, air_time, phase)
        o_mirrored = observe(
            robot, model, mirrored, command * [1, -1, -1], joints(last_act), air_time[feet],
            phase[::-1],
        )  # fmt: skip
        m = mirror_obs({k: t(v) for k, v in o.items()})
        for k in KEYS:
            errors[k] = np.maximum(errors[k], np.abs(m[k].numpy() - o_mirrored[k]))
        contacts += sum(float(original.sensor(c).data[0] > 0) for c in robot.contacts)
    return errors, contacts


# Go1's IMU site sits 6.7 cm right of the midplane: its velocimeter (local_linvel) and
# accelerometer read the mirror image only with the site moved onto the midplane.
GO1_IMU_LINEAR = {"state": [0, 1, 2], "privileged_state": [0, 1, 2, 51, 52, 53, 57, 58, 59]}
GO1_CONTACTS = {"state": [], "privileged_state": [99, 100, 101, 102]}  # FR, FL, RR, RL


def sensors(model: mujoco.MjModel) -> list:
    """Each sensor's name, type, object and data address."""
    return [(model.sensor(i).name, int(model.sensor_type[i]), int(model.sensor_objid[i]),
             int(model.sensor_adr[i])) for i in range(model.nsensor)]  # fmt: skip


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_the_mirror_image_reads_as_the_mirrored_observation(env_id):
    """Every slot of state and privileged_state, sensors included (velocimeter, gyro,
    accelerometer, gravity, global angular velocity, the feet's velocities and floor contacts,
    actuator forces), of random states with feet on the floor: mirror_obs(o) is the observation
    of the mirror image, to 1e-9. The rough terrain's bumps are not their own mirror image: under
    the mirror image's feet the floor lies elsewhere, and their contacts differ; those slots are
    the flat scene's sensors, checked there."""
    robot = ROBOTS[env_id]
    model = load_model(robot)
    rough = robot.floor == "rough"
    if rough:  # its feet's contact sensors are the flat scene's
        assert sensors(model) == sensors(load_model(ROBOTS["Go1JoystickFlatTerrain-v1"]))
    if env_id.startswith("Go1"):
        errors, _ = mirror_errors(env_id, model, samples=10)
        for k in KEYS:
            rest = np.delete(errors[k], GO1_IMU_LINEAR[k] + GO1_CONTACTS[k] * rough)
            assert rest.max() < 1e-9 and errors[k][GO1_IMU_LINEAR[k]].max() > 1e-3, k
        model.site_pos[model.site("imu").id, 1] = 0.0
    errors, contacts = mirror_errors(env_id, model)
    if rough:  # under the mirror image's feet the floor lies elsewhere
        contact_slots = GO1_CONTACTS["privileged_state"]
        assert errors["privileged_state"][contact_slots].max() == 1.0
        errors["privileged_state"][contact_slots] = 0.0
    worst = {k: float(errors[k].max()) for k in KEYS}
    print(f"{env_id}: max |mirror_obs(o) - o_mirrored| {worst}, {contacts} foot contacts")
    assert max(worst.values()) < 1e-9, {k: np.flatnonzero(errors[k] > 1e-9) for k in KEYS}
    assert contacts > 0, "the check should include the feet's floor contacts"


def test_envpools_other_names_of_the_robot_tasks_have_the_same_maps():
    for env_id in ENV_IDS:
        assert ps.MIRROR_MAPS[f"MuJoCoPlayground/{env_id}"] is ps.MIRROR_MAPS[env_id]


# ---------------------------------------------------------------------------------------------
# The env: EnvPool's own observations
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_the_envs_observations_relate_as_the_maps_say(env_id):
    """64 steps of 8 envs, random actions, sensor noise off. On the env's own observations: the
    slots EnvPool fills with the same numbers (privileged_state starts with state, and its sensor
    block repeats the gyro, gravity, local velocity, q - q0 and qvel) are equal, and stay equal
    after mirroring; the last-action slots hold the action sent the step before (EnvPool writes
    the observation, then updates last_act), and mirror as mirror_act does;
    the command slots hold info["command"] and mirror to (v_x, -v_y, -yaw rate); the velocity
    tracking errors the reward is made of, |command_xy - v_xy| and |command_yaw - gyro_z|, keep
    their size."""
    robot = ROBOTS[env_id]
    mirror_obs, mirror_act = ps.make_mirror_fns(env_id)
    env = envpool.make_gymnasium(env_id, num_envs=8, num_threads=1, seed=3, noise_level=0.0)
    obs, _ = env.reset()
    rng = np.random.default_rng(3)
    done, stepped_before, previous = np.zeros(8, dtype=bool), np.zeros(8, dtype=bool), None
    checked = 0
    for _ in range(64):
        action = rng.uniform(-1, 1, (8, 12))
        stepped = ~done  # after an episode's end, that env's step is its reset
        obs, _, terminated, truncated, info = env.step(action)
        x = {k: t(obs[k]) for k in KEYS}
        m = mirror_obs(x)
        for o in (x, m):
            state, privileged = o["state"], o["privileged_state"]
            assert torch.equal(privileged[:, : robot.state_dim], state)
            for p, s in robot.duplicates:
                torch.testing.assert_close(privileged[:, p], state[:, s], rtol=0, atol=1e-12)
        if previous is not None:
            acted = stepped & stepped_before
            assert torch.equal(x["state"][acted, robot.last_act], t(previous[acted]))
            mirrored_action = mirror_act(t(previous))[acted]
            assert torch.equal(m["state"][acted, robot.last_act], mirrored_action)
            checked += int(acted.sum())
        previous, stepped_before = action, stepped
        command = t(info["command"])
        assert torch.equal(x["state"][:, robot.command], command)
        assert torch.equal(m["state"][:, robot.command], command * t([1, -1, -1]))
        for o in (x, m):
            linvel, gyro, cmd = o["state"][:, 0:3], o["state"][:, 3:6], o["state"][:, robot.command]
            if o is x:
                errors = ((cmd[:, :2] - linvel[:, :2]).norm(dim=1), (cmd[:, 2] - gyro[:, 2]).abs())
            else:
                torch.testing.assert_close((cmd[:, :2] - linvel[:, :2]).norm(dim=1), errors[0])
                torch.testing.assert_close((cmd[:, 2] - gyro[:, 2]).abs(), errors[1])
        done = terminated | truncated
    env.close()
    assert checked > 400


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_network_mode_on_a_robot_trains_an_exactly_symmetric_actor(env_id, tmp_path):
    """One iteration of --symmetry network on EnvPool (4 envs x 32 steps): the policy that acts
    next is symmetric on the whole batch, state's map with the action's, to float32's precision
    (the symmetry error, a mean of squares, at most 1e-10)."""
    args = ps.Args(
        env_id=env_id, env_backend="envpool", symmetry="network", total_timesteps=128,
        num_envs=4, num_steps=32, num_minibatches=2, update_epochs=1, eval_episodes=1,
        log_dir=str(tmp_path),
    )  # fmt: skip
    metrics = ps.train(args)
    assert metrics["charts/symmetry_error"] <= 1e-10
    assert np.isfinite(metrics["losses/policy_loss"])
