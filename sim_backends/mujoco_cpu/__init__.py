"""Batched MuJoCo on CPU threads: any MJCF model, N worlds stepped as one call."""

from embodied.core.registry import SIM_BACKENDS
from embodied.sim_backends.mujoco_cpu.batch import MujocoBatch, MujocoFactory, gymnasium_asset, load_model

LOCOMOTION_ASSETS = ("half_cheetah.xml", "hopper.xml", "walker2d_v5.xml", "ant.xml", "humanoid.xml")
FACTORY = SIM_BACKENDS.register("mujoco_cpu", MujocoFactory(LOCOMOTION_ASSETS))

__all__ = ["FACTORY", "MujocoBatch", "gymnasium_asset", "load_model"]
