"""Kinematic bicycle model, batched in torch (any device), and its pure step function (trajectory probing rolls
it on copies of the state without touching the sim).

Reference point: the rear axle. With wheelbase L, steering angle delta and speed v, the heading rate is
``v tan(delta) / L``. Within one step of ``dt`` the steering angle and the acceleration are held, so the car drives
an arc of length ``s = v dt + a dt^2 / 2`` (``v^2 / (2 |a|)`` if it stops within the step; the speed stays in
``[0, max_speed]``, where the acceleration state is zeroed) and curvature ``k = tan(delta) / L``:

    yaw' = yaw + k s
    x'   = x + (sin(yaw') - sin(yaw)) / k        (x + s cos(yaw) when k = 0)
    y'   = y - (cos(yaw') - cos(yaw)) / k        (y + s sin(yaw) when k = 0)

which is exact for the model (the closed form the tests check). Commands are limited in magnitude and rate:
the steering angle moves toward its command by at most ``max_steer_rate dt``, the acceleration toward its command
by at most ``max_jerk dt``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from embodied.sim_backends.base import NamedLayout

STATE = NamedLayout(x=1, y=1, yaw=1, speed=1, steer=1, accel=1)
CONTROLS = NamedLayout(steer=1, accel=1)  # commands: [rad], [m/s^2]


@dataclass(frozen=True)
class VehicleParams:
    wheelbase: float = 2.7  # [m]
    length: float = 4.5  # [m] body, for collisions
    width: float = 1.8  # [m]
    rear_overhang: float = 0.9  # [m] rear axle to the back of the body
    max_steer: float = 0.5  # [rad]
    max_steer_rate: float = 1.0  # [rad/s]
    max_accel: float = 3.0  # [m/s^2]
    max_brake: float = 6.0  # [m/s^2]
    max_jerk: float = 15.0  # [m/s^3]
    max_speed: float = 15.0  # [m/s]
    dt: float = 0.1  # [s] one control step


def bicycle_step(x: torch.Tensor, controls: torch.Tensor, p: VehicleParams) -> torch.Tensor:
    """``x [..., 6]`` (STATE), ``controls [..., 2]`` (CONTROLS) -> the state one step later (a new tensor)."""
    dt = p.dt
    steer_cmd = controls[..., 0].clamp(-p.max_steer, p.max_steer)
    accel_cmd = controls[..., 1].clamp(-p.max_brake, p.max_accel)
    px, py, yaw, v, steer, acc = x.unbind(-1)
    steer = steer + (steer_cmd - steer).clamp(-p.max_steer_rate * dt, p.max_steer_rate * dt)
    acc = acc + (accel_cmd - acc).clamp(-p.max_jerk * dt, p.max_jerk * dt)
    v_free = v + acc * dt
    v_next = v_free.clamp(0.0, p.max_speed)
    # distance: exact for constant acceleration; a car that stops within the step stops after v^2 / (2 |a|), one
    # that reaches the speed limit then holds it
    stops = v_free < 0
    t_lim = ((p.max_speed - v) / acc.clamp_min(1e-9)).clamp(0.0, dt)
    s = torch.where(stops, v * v / (2 * (-acc).clamp_min(1e-9)),
                    torch.where(v_free > p.max_speed, v * t_lim + 0.5 * acc * t_lim ** 2 + p.max_speed * (dt - t_lim),
                                0.5 * (v + v_next) * dt))
    # at standstill (braking) or at the speed limit (accelerating) the car does not accelerate: no wind-up
    acc = torch.where((v_next <= 0) & (acc < 0) | (v_next >= p.max_speed) & (acc > 0), torch.zeros_like(acc), acc)
    k = torch.tan(steer) / p.wheelbase
    yaw_next = yaw + k * s
    straight = k.abs() < 1e-6
    safe_k = torch.where(straight, torch.ones_like(k), k)
    dx = torch.where(straight, s * torch.cos(yaw), (torch.sin(yaw_next) - torch.sin(yaw)) / safe_k)
    dy = torch.where(straight, s * torch.sin(yaw), -(torch.cos(yaw_next) - torch.cos(yaw)) / safe_k)
    yaw_next = torch.remainder(yaw_next + torch.pi, 2 * torch.pi) - torch.pi
    return torch.stack([px + dx, py + dy, yaw_next, v_next, steer, acc], -1)


def body_circles(x: torch.Tensor, p: VehicleParams, n: int = 3) -> tuple[torch.Tensor, float]:
    """The body as ``n`` circles along its axis (centres ``[..., n, 2]``, one radius) covering the rectangle."""
    seg = p.length / n
    radius = float((0.25 * seg * seg + 0.25 * p.width * p.width) ** 0.5)
    along = -p.rear_overhang + seg * (torch.arange(n, device=x.device, dtype=x.dtype) + 0.5)
    c, s = torch.cos(x[..., 2:3]), torch.sin(x[..., 2:3])
    return torch.stack([x[..., 0:1] + c * along, x[..., 1:2] + s * along], -1), radius
