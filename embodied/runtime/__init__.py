"""Collectors: the seam between simulation and learning. ``make_collector`` picks the engine by name
(``runtime.engine``) from ``ENGINES``."""

from __future__ import annotations

from embodied.core.registry import ENGINES
from embodied.runtime.async_engine import AsyncCollector
from embodied.runtime.base import Collector, EpisodeStats, MakeEnv
from embodied.runtime.sync import SyncCollector

ENGINES.register("sync", SyncCollector)
ENGINES.register("async", AsyncCollector)


def _ray_collector(*args, **kwargs):
    from embodied.runtime.ray_engine import RayCollector  # Ray is imported only by runs that use it

    return RayCollector(*args, **kwargs)


ENGINES.register("ray", _ray_collector)


def make_collector(engine: str, make_env: MakeEnv, num_envs: int, seed: int, learner_device, runtime=None) -> Collector:
    """Build the collector of ``engine``; ``runtime`` (a ``RuntimeConfig``) configures engines with workers."""
    return ENGINES.get(engine)(make_env, num_envs, seed, learner_device, runtime)


__all__ = ["AsyncCollector", "Collector", "EpisodeStats", "MakeEnv", "SyncCollector", "make_collector"]
