"""Batched physics and rendering backends, registered by name in ``SIM_BACKENDS``.

Each backend subpackage registers its own factory (``SIM_BACKENDS.register(name, factory)``) when imported;
importing this package imports every backend subpackage, so a registered name is there as soon as any
``embodied.sim_backends`` module is. The contract, ``NamedLayout`` and ``make_backend`` are in ``base``."""

from embodied.sim_backends import (
    mujoco_cpu,  # noqa: F401, E402  (registers "mujoco_cpu")
    splat,  # noqa: F401  (registers "splat")
    torch_vec,  # noqa: F401  (registers "torch_vec")
    world_model,  # noqa: F401  (registers "world_model")
)
