"""SIM_BACKENDS holds real factories: every registered backend builds every model it declares, the sim steps,
and its state round-trips through get_state/set_state. Tasks pick their backend from TaskSpec.backends."""

from __future__ import annotations

import pytest
import torch

import embodied
import embodied.sim_backends  # noqa: F401  (registers every backend)
import embodied.tasks  # noqa: F401  (registers tasks)
from embodied.core.errors import UserError
from embodied.core.registry import SIM_BACKENDS, TASKS
from embodied.sim_backends.base import SimBackend, choose_backend, make_backend

CASES = [(name, model) for name in SIM_BACKENDS.names() for model in SIM_BACKENDS.get(name).models]
NUM_ENVS = 3


def test_torch_vec_is_registered_with_its_models():
    assert "torch_vec" in SIM_BACKENDS
    assert set(SIM_BACKENDS.get("torch_vec").models) >= {"pendulum", "quadrotor"}


@pytest.mark.parametrize("name,model", CASES, ids=[f"{n}-{m}" for n, m in CASES])
def test_factory_builds_steps_and_round_trips_state(name, model):
    factory = SIM_BACKENDS.get(name)
    assert callable(factory)
    sim = make_backend(name, model, NUM_ENVS, "cpu")
    assert isinstance(sim, SimBackend) and sim.num_envs == NUM_ENVS and sim.device == torch.device("cpu")
    x = sim.get_state()["x"]
    assert x.shape == (NUM_ENVS, sim.STATE.dim) and bool(torch.isfinite(x).all())
    gen = torch.Generator().manual_seed(0)
    controls = torch.rand(NUM_ENVS, sim.num_controls, generator=gen)
    sim.step(controls)
    saved = sim.get_state()
    sim.step(controls)
    after = sim.get_state()
    assert any(not torch.equal(after[k], saved[k]) for k in saved), "stepping changed nothing"
    assert bool(sim.finite().all())
    sim.set_state(saved)  # back to the saved state: the same step gives the same result
    restored = sim.get_state()
    assert restored.keys() == saved.keys() and all(torch.equal(restored[k], saved[k]) for k in saved)
    sim.step(controls)
    again = sim.get_state()
    assert all(torch.equal(again[k], after[k]) for k in after)
    saved["x"].fill_(float("nan"))  # get_state hands out copies
    assert bool(torch.isfinite(sim.get_state()["x"]).all())


def test_mujoco_step_with_positions_gives_the_poses_of_a_forward_after_it():
    """``step(controls, positions=True)`` computes the position stage in the stepping call: the same state as a
    plain step, and the same poses as a plain step followed by ``forward`` (bit for bit), where a plain step's
    poses are one substep old."""
    a, b = (make_backend("mujoco_cpu", "ant.xml", NUM_ENVS, "cpu", frame_skip=5) for _ in range(2))
    controls = torch.rand(NUM_ENVS, a.num_controls, generator=torch.Generator().manual_seed(0)) * 2 - 1
    for sim in (a, b):  # outputs are copied out by the calls after they are bound
        sim.t("xpos"), sim.t("xmat")
    for _ in range(3):
        a.step(controls, positions=True)
        b.step(controls)
        stale = b.t("xpos").clone()
        b.batch.forward()
        assert torch.equal(a.qpos, b.qpos) and torch.equal(a.qvel, b.qvel)
        assert torch.equal(a.t("xpos"), b.t("xpos")) and torch.equal(a.t("xmat"), b.t("xmat"))
        assert not torch.equal(stale, b.t("xpos"))


def test_factory_call_equals_make_backend():
    sim = SIM_BACKENDS.get("torch_vec")("quadrotor", 2, "cpu", kernel="torch")
    assert type(sim).__name__ == "QuadrotorSim" and sim.kernel == "torch"


def test_unknown_backend_or_model_is_a_user_error():
    with pytest.raises(UserError, match="unknown sim backend 'nope'; known: .*torch_vec"):
        make_backend("nope", "pendulum", 1, "cpu")
    with pytest.raises(UserError, match="no model 'nope'; its models: pendulum, quadrotor"):
        make_backend("torch_vec", "nope", 1, "cpu")
    with pytest.raises(UserError, match="no model 'nope'"):
        SIM_BACKENDS.get("torch_vec")("nope", 1, "cpu")


def test_choose_backend_from_task_spec():
    assert choose_backend("quadrotor-hover") == TASKS.get("quadrotor-hover").backends[0]
    assert choose_backend("pendulum", "torch_vec") == "torch_vec"
    with pytest.raises(UserError) as err:
        choose_backend("pendulum", "mujoco_cpu")
    line = str(err.value)
    assert "\n" not in line and "'pendulum'" in line and "mujoco_cpu" in line and "torch_vec" in line


@pytest.mark.parametrize("task", ["pendulum", "quadrotor-hover"])
def test_task_config_picks_the_backend(task):
    env = embodied.make_env(task, num_envs=2, backend="torch_vec")
    assert type(env.sim).__module__.startswith("embodied.sim_backends.torch_vec")
    with pytest.raises(UserError, match="does not run on sim backend 'nope'"):
        embodied.make_env(task, num_envs=2, backend="nope")
