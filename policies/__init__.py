"""Networks, distributions, normalizers; export-friendly modules."""

from embodied.policies.actor_critic import (
    DeterministicPolicy,
    GaussianActor,
    SquashedGaussianActor,
    TwinQCritic,
    ValueCritic,
    build_policy,
    policy_spec,
)
from embodied.policies.normalizer import EmpiricalNormalizer

__all__ = ["DeterministicPolicy", "EmpiricalNormalizer", "GaussianActor", "SquashedGaussianActor",
           "TwinQCritic", "ValueCritic", "build_policy", "policy_spec"]
