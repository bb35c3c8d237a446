"""NamedLayout: exact slices, views that write through, pack; and the layouts the sims declare match the
column layout documented in ``embodied.kernels.quadrotor``."""

from __future__ import annotations

import pytest
import torch

from embodied.kernels import quadrotor as qk
from embodied.sim_backends.base import NamedLayout
from embodied.sim_backends.torch_vec import PendulumSim, QuadrotorParams, QuadrotorSim


def test_slices_dim_and_order_are_exact():
    layout = NamedLayout(a=1, b=3, c=2)
    assert layout.dim == 6 and len(layout) == 3
    assert layout.names == ("a", "b", "c") and list(layout) == ["a", "b", "c"]
    assert [layout.slice(n) for n in layout] == [slice(0, 1), slice(1, 4), slice(4, 6)]
    assert [layout.width(n) for n in layout] == [1, 3, 2]
    assert dict(layout.items()) == {"a": slice(0, 1), "b": slice(1, 4), "c": slice(4, 6)}
    assert "b" in layout and "z" not in layout
    assert layout == NamedLayout(a=1, b=3, c=2) and layout != NamedLayout(b=3, a=1, c=2)
    assert repr(layout) == "NamedLayout(a=1, b=3, c=2)"


def test_view_column_and_pack():
    layout = NamedLayout(a=1, b=3, c=2)
    x = torch.arange(12.0).reshape(2, 6)
    assert torch.equal(layout.view(x, "a"), x[:, 0:1])
    assert torch.equal(layout.view(x, "b"), x[:, 1:4])
    assert torch.equal(layout.view(x, "c"), x[:, 4:6])
    assert torch.equal(layout.column(x, "a"), x[:, 0])
    assert torch.equal(layout.view(x[1], "b"), x[1, 1:4])  # a single row [D] works too
    layout.view(x, "b")[0] = -1.0  # a view: writes go through
    assert x[0].tolist() == [0.0, -1.0, -1.0, -1.0, 4.0, 5.0]
    packed = layout.pack(c=x[:, 4:6], a=x[:, 0:1], b=x[:, 1:4])  # keyword order does not matter
    assert torch.equal(packed, x)


def test_misuse_is_an_error():
    layout = NamedLayout(a=1, b=3)
    with pytest.raises(KeyError, match="fields: a, b"):
        layout.slice("nope")
    with pytest.raises(ValueError, match="layout dim 4"):
        layout.view(torch.zeros(2, 5), "a")
    with pytest.raises(ValueError, match="width 3"):
        layout.column(torch.zeros(2, 4), "b")
    with pytest.raises(ValueError, match="missing"):
        layout.pack(a=torch.zeros(2, 1))
    with pytest.raises(ValueError, match="field width 3"):
        layout.pack(a=torch.zeros(2, 1), b=torch.zeros(2, 2))
    for bad in ({}, {"a": 0}, {"a": 1.5}):
        with pytest.raises(ValueError):
            NamedLayout(**bad)


def test_quadrotor_layouts_match_the_kernel():
    """The names cover the kernel's columns exactly as its module docstring lays them out."""
    state = {n: (s.start, s.stop) for n, s in QuadrotorSim.STATE.items()}
    assert state == {"pos_w": (0, 3), "quat_wb": (3, 7), "lin_vel_w": (7, 10), "ang_vel_b": (10, 13),
                     "rpm": (13, 17)}
    params = {n: (s.start, s.stop) for n, s in QuadrotorSim.PARAMS.items()}
    assert params == {"mass": (0, 1), "inertia": (1, 4), "k_f": (4, 5), "k_m": (5, 6), "motor_tau": (6, 7),
                      "force_w": (7, 10), "torque_b": (10, 13)}
    assert QuadrotorSim.STATE.dim == qk.STATE_DIM and QuadrotorSim.PARAMS.dim == qk.PARAM_DIM
    assert QuadrotorSim.CONTROLS.dim == 4


def test_quadrotor_properties_are_views_of_state_and_params():
    sim = QuadrotorSim(3, "cpu", QuadrotorParams(), kernel="torch")
    nominal = QuadrotorParams()
    assert sim.x.shape == (3, 17) and sim.p.shape == (3, 13)
    assert sim.p[0].tolist() == torch.tensor(nominal.as_row()).tolist()
    torch.testing.assert_close(sim.mass, torch.full((3, 1), nominal.mass))
    torch.testing.assert_close(sim.inertia, torch.tensor([nominal.inertia] * 3))
    torch.testing.assert_close(sim.k_f, torch.full((3, 1), nominal.k_f))
    torch.testing.assert_close(sim.k_m, torch.full((3, 1), nominal.k_m))
    torch.testing.assert_close(sim.motor_tau, torch.full((3, 1), nominal.motor_tau))
    assert not sim.force_w.any() and not sim.torque_b.any()
    assert sim.quat_wb[:, 0].tolist() == [1.0] * 3 and not sim.pos_w.any()
    for name in QuadrotorSim.STATE:
        view = getattr(sim, name)
        view[1] = 7.0
        assert bool((QuadrotorSim.STATE.view(sim.x, name)[1] == 7.0).all()), name
    for name in QuadrotorSim.PARAMS:
        view = getattr(sim, name)
        view[2] = 5.0
        assert bool((QuadrotorSim.PARAMS.view(sim.p, name)[2] == 5.0).all()), name
    assert bool((sim.x[1] == 7.0).all()) and bool((sim.p[2] == 5.0).all())  # every column is named


def test_pendulum_views():
    sim = PendulumSim(2, "cpu")
    sim.set_state_idx(torch.arange(2), torch.tensor([[0.5, -1.0], [1.5, 2.0]]))
    assert sim.theta.tolist() == [0.5, 1.5] and sim.theta_dot.tolist() == [-1.0, 2.0]
    assert PendulumSim.STATE.names == ("theta", "theta_dot") and PendulumSim.CONTROLS.dim == 1
