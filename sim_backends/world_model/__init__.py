"""Learned world models as sim backends (issue 11): ``ensemble`` (probabilistic MLPs, MBPO-style) for state tasks,
``rssm`` (DreamerV3's recurrent state-space model) for image tasks.

Importing this package registers the ``world_model`` backend: ``SIM_BACKENDS.get("world_model")("ensemble",
num_envs, device, network=..., generator=..., deterministic=...)`` builds a ``WorldModelSim``."""

from embodied.core.registry import SIM_BACKENDS
from embodied.sim_backends.base import BackendFactory
from embodied.sim_backends.world_model.backend import (
    MODEL_FILE,
    RSSMSim,
    WorldModelSim,
    load_world_model,
    save_world_model,
)
from embodied.sim_backends.world_model.ensemble import EnsembleConfig, ProbabilisticEnsemble, fit

FACTORY = BackendFactory("world_model", {"ensemble": WorldModelSim, "rssm": RSSMSim})
SIM_BACKENDS.register("world_model", FACTORY)

__all__ = ["FACTORY", "MODEL_FILE", "EnsembleConfig", "ProbabilisticEnsemble", "RSSMSim", "WorldModelSim", "fit",
           "load_world_model", "save_world_model"]
