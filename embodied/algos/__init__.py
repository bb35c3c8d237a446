"""Learning algorithms. Importing this package registers every built-in algorithm in ``ALGOS``."""

from embodied.algos import apg, appo, bc, distill, dreamer_ac, filtered_bc, grpo, ppo, residual, sac, td3  # noqa: F401
