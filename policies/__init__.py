"""Networks, distributions, normalizers; export-friendly modules."""

from embodied.policies.actor_critic import (
    DeterministicActor,
    DeterministicPolicy,
    EquivariantActor,
    GaussianActor,
    SquashedGaussianActor,
    TwinQCritic,
    ValueCritic,
    build_policy,
    policy_spec,
)
from embodied.policies.normalizer import EmpiricalNormalizer

__all__ = ["DeterministicActor", "DeterministicPolicy", "EmpiricalNormalizer", "EquivariantActor", "GaussianActor",
           "SquashedGaussianActor", "TwinQCritic", "ValueCritic", "build_policy", "policy_spec"]
