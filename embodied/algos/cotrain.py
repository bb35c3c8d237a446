"""Co-training (RLinf-Co): the cloning loss on demonstrations added to an RL learner's loss, so fine-tuning keeps
what the demonstrations taught. One piece for every learner that offers it (``<algo>.bc_coef`` with ``data=PATH``)."""

from __future__ import annotations

import torch

from embodied.core.errors import UserError
from embodied.core.pixels import PixelPacker


class DemoLoss:
    """Minibatches of a recorded dataset and the policy's cloning loss on them: its own ``bc_loss`` where it has one
    (the VLA's cross-entropy on bins), else the action MSE of its deterministic output."""

    def __init__(self, path: str, policy: torch.nn.Module, obs_dim: int, device: torch.device, batch_size: int,
                 what: str, layout=None):
        from embodied.algos.bc import chunk_targets
        from embodied.datasets import read_transitions

        if not path:
            raise UserError(f"{what} > 0 co-trains on demonstrations: give data=PATH")
        if batch_size < 1:
            raise UserError(f"{what}: the demonstration batch size must be >= 1, got {batch_size}")
        data = read_transitions(path, ["policy"])
        if data["state"].shape[1] != obs_dim:
            raise UserError(f"the dataset {path} has {data['state'].shape[1]} observation entries per step; the task "
                            f"has {obs_dim}")
        episode = torch.cumsum(data["initial"].long(), 0) - 1
        target = chunk_targets(data["action"].clamp(-1.0, 1.0), episode, getattr(policy, "horizon", 1))
        # camera entries kept as uint8 (core/pixels.py), unpacked per minibatch
        self.packer = PixelPacker.of(layout, "policy", obs_dim)
        self.obs, self.target = self.packer.pack(data["state"].to(device)), target.to(device)
        self.batch_size = batch_size

    def __call__(self, policy: torch.nn.Module, generator: torch.Generator) -> torch.Tensor:
        j = torch.randint(self.target.shape[0], (self.batch_size,), generator=generator, device=self.target.device)
        obs = self.packer.unpack_rows(self.obs, j)
        if hasattr(policy, "bc_loss"):
            return policy.bc_loss(obs, self.target[j])
        return ((policy(obs) - self.target[j][:, 0]) ** 2).mean()
