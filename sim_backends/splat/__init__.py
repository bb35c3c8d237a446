"""3D Gaussian-splat scenes on a CPU (and the same API on CUDA tensors): the INRIA ``.ply`` format
(``scene.py``) and the plain-torch reference of the splat math (``reference.py``). The renderer kernel, the
procedural road scenes and the driving tasks build on these (issue 10, in progress)."""
