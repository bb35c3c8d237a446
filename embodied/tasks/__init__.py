"""Tasks: MDPs on top of sim backends. Importing this package registers every task."""

from embodied.tasks import libero  # noqa: F401  (the libero:<suite>/<task> family)
from embodied.tasks.classic import pendulum, pendulum_pixels, point_reach, target  # noqa: F401
from embodied.tasks.driving import drive  # noqa: F401
from embodied.tasks.locomotion import mujoco_v5  # noqa: F401
from embodied.tasks.manipulation import mini_libero, tabletop  # noqa: F401
from embodied.tasks.quadrotor import hover, rates  # noqa: F401
from embodied.tasks.world_model import WorldModelEnv  # noqa: F401  (registers the wm:<task> family)
