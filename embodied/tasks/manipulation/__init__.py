"""Tabletop manipulation with a Franka Panda on mujoco_cpu (issue 12)."""
