"""3D Gaussian-splat scenes and driving on a CPU (and the same API on CUDA tensors): the INRIA ``.ply`` format
(``scene.py``), the plain-torch reference of the splat math (``reference.py``, ``raster_reference.py``), the
renderer (``render.py`` over ``kernels/splat_numba.py``), procedural streets (``procedural.py``), the kinematic car
(``vehicle.py``) and the ``splat`` sim backend (``drive.py``: cars, routes, cameras)."""

from embodied.sim_backends.splat import drive  # noqa: F401  (registers "splat")
