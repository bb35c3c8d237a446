"""Tensor simulators: the same code runs on CPU or CUDA (hot kernels dispatch by device).

Importing this package registers the ``torch_vec`` backend: ``SIM_BACKENDS.get("torch_vec")(model, num_envs,
device, **kwargs)`` builds model ``"pendulum"`` (``PendulumSim``; kwargs ``params``) or ``"quadrotor"``
(``QuadrotorSim``; kwargs ``params``, ``kernel``)."""

from embodied.core.registry import SIM_BACKENDS
from embodied.sim_backends.base import BackendFactory
from embodied.sim_backends.torch_vec.pendulum import PendulumParams, PendulumSim
from embodied.sim_backends.torch_vec.quadrotor import QuadrotorParams, QuadrotorSim

FACTORY = BackendFactory("torch_vec", {"pendulum": PendulumSim, "quadrotor": QuadrotorSim})
SIM_BACKENDS.register("torch_vec", FACTORY)

__all__ = ["FACTORY", "PendulumParams", "PendulumSim", "QuadrotorParams", "QuadrotorSim"]
