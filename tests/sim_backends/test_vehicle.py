"""The kinematic bicycle against its closed form, its limits, and the route geometry of the splat backend."""

from __future__ import annotations

import math

import pytest
import torch

from embodied.sim_backends.splat.procedural import Route
from embodied.sim_backends.splat.vehicle import VehicleParams, bicycle_step, body_circles


def test_constant_steer_and_speed_drive_the_closed_form_circle():
    """Steering held at delta and speed v: a circle of radius L / tan(delta) about (0, R) from the origin facing +x;
    after n steps the heading is v n dt / R and the position R (sin psi, 1 - cos psi)."""
    p = VehicleParams(max_steer_rate=100.0)
    delta, v = 0.3, 5.0
    x = torch.tensor([[0.0, 0.0, 0.0, v, delta, 0.0]], dtype=torch.float64)
    ctrl = torch.tensor([[delta, 0.0]], dtype=torch.float64)
    radius = p.wheelbase / math.tan(delta)
    for n in range(1, 31):
        x = bicycle_step(x, ctrl, p)
        psi = v * n * p.dt / radius
        assert float(x[0, 0]) == pytest.approx(radius * math.sin(psi), abs=1e-9)
        assert float(x[0, 1]) == pytest.approx(radius * (1 - math.cos(psi)), abs=1e-9)
        assert float(x[0, 2]) == pytest.approx(math.remainder(psi, 2 * math.pi), abs=1e-9)


def test_straight_line_with_constant_acceleration():
    p = VehicleParams()
    x = torch.tensor([[1.0, 2.0, math.pi / 2, 2.0, 0.0, 1.0]], dtype=torch.float64)
    x = bicycle_step(x, torch.tensor([[0.0, 1.0]], dtype=torch.float64), p)
    s = 2.0 * p.dt + 0.5 * 1.0 * p.dt ** 2
    assert x[0, :4].tolist() == pytest.approx([1.0, 2.0 + s, math.pi / 2, 2.0 + p.dt], abs=1e-12)


def test_limits_and_rate_limits():
    p = VehicleParams()
    x = torch.zeros(1, 6, dtype=torch.float64)
    x = bicycle_step(x, torch.tensor([[5.0, 50.0]], dtype=torch.float64), p)
    assert float(x[0, 4]) == pytest.approx(p.max_steer_rate * p.dt)  # steering moves at its rate limit
    assert float(x[0, 5]) == pytest.approx(p.max_jerk * p.dt)  # acceleration at its jerk limit
    for _ in range(100):
        x = bicycle_step(x, torch.tensor([[5.0, 50.0]], dtype=torch.float64), p)
    assert float(x[0, 4]) == pytest.approx(p.max_steer)
    assert float(x[0, 3]) == pytest.approx(p.max_speed) and float(x[0, 5]) == 0.0  # capped, no acceleration wind-up
    for _ in range(100):
        x = bicycle_step(x, torch.tensor([[0.0, -50.0]], dtype=torch.float64), p)
    assert float(x[0, 3]) == 0.0 and float(x[0, 5]) == 0.0  # stops, never reverses, no braking wind-up


def test_stopping_within_a_step_travels_v2_over_2a():
    p = VehicleParams()
    x = torch.tensor([[0.0, 0.0, 0.0, 0.3, 0.0, -4.0]], dtype=torch.float64)
    x = bicycle_step(x, torch.tensor([[0.0, -4.0]], dtype=torch.float64), p)
    assert float(x[0, 0]) == pytest.approx(0.3 ** 2 / (2 * 4.0)) and float(x[0, 3]) == 0.0


def test_body_circles_cover_the_body():
    p = VehicleParams()
    centres, r = body_circles(torch.tensor([[0.0, 0.0, 0.0, 0, 0, 0]]), p)
    for cx, cy in ((-p.rear_overhang, p.width / 2), (p.length - p.rear_overhang, -p.width / 2)):  # corners
        assert min(math.hypot(cx - a, cy - b) for a, b in centres[0].tolist()) <= r + 1e-6


def test_route_tracking_and_obstacle_clearance():
    from embodied.sim_backends.splat.drive import RouteSet

    line = [[0.5 * i, 0.0] for i in range(41)]  # 20 m straight along +x
    route = Route(centerline=line, lane_width=3.5, lanes=2,
                  obstacles=[{"center": [12.0, 3.0, 0.0], "size": [4.0, 2.0, 1.5], "yaw": 0.0}])
    rs = RouteSet([route], torch.device("cpu"))
    xy = torch.tensor([[7.3, 1.2], [7.3, -0.4]])
    idx, arc, lat, heading = rs.track(xy, torch.zeros(2, dtype=torch.long), torch.tensor([10, 10]))
    assert arc.tolist() == pytest.approx([7.3, 7.3]) and lat.tolist() == pytest.approx([1.2, -0.4])
    assert heading.tolist() == pytest.approx([0.0, 0.0]) and float(rs.length[0]) == pytest.approx(20.0)
    p = VehicleParams()
    x = torch.tensor([[12.0, 0.0, 0.0, 0, 0, 0], [12.0, 1.2, 0.0, 0, 0, 0]])
    clear = rs.obstacle_clearance(x, torch.zeros(2, dtype=torch.long), p)
    _, r = body_circles(x, p)
    assert float(clear[0]) == pytest.approx(2.0 - r, abs=1e-5)  # box edge at y = 2; circle centres on y = 0
    assert float(clear[1]) < 0  # overlapping: a collision
