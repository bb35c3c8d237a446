"""Batched physics and rendering backends, registered by name."""

from embodied.core.registry import SIM_BACKENDS

SIM_BACKENDS.register("torch_vec", "embodied.sim_backends.torch_vec")
