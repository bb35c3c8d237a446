"""Batched MuJoCo on CPU threads: any MJCF model, N worlds stepped as one call."""

from embodied.sim_backends.mujoco_cpu.batch import MujocoBatch, load_model

__all__ = ["MujocoBatch", "load_model"]
