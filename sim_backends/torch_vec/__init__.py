"""Tensor simulators: the same code runs on CPU or CUDA (hot kernels dispatch by device)."""

from embodied.sim_backends.torch_vec.pendulum import PendulumParams, PendulumSim
from embodied.sim_backends.torch_vec.quadrotor import QuadrotorParams, QuadrotorSim

__all__ = ["PendulumParams", "PendulumSim", "QuadrotorParams", "QuadrotorSim"]
