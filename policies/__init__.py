"""Networks, distributions, normalizers; export-friendly modules."""

from embodied.policies.actor_critic import (
    DeterministicActor,
    DeterministicPolicy,
    GaussianActor,
    SquashedGaussianActor,
    TwinQCritic,
    ValueCritic,
    build_policy,
    policy_spec,
    update_normalizer,
)
from embodied.policies.chunked import ChunkedActor, reset_policy
from embodied.policies.ensemble import EnsembleActor
from embodied.policies.export import ChunkedProgramPolicy, ProgramPolicy
from embodied.policies.flow import FlowChunkActor
from embodied.policies.normalizer import EmpiricalNormalizer
from embodied.policies.residual import ResidualActor
from embodied.policies.sampled import SampledActor
from embodied.vla import model as _vla_model  # noqa: F401, I001  (registers the VLA policy, built on the above)

__all__ = ["ChunkedActor", "DeterministicActor", "DeterministicPolicy", "EmpiricalNormalizer", "EnsembleActor",
           "GaussianActor", "ChunkedProgramPolicy", "FlowChunkActor", "ProgramPolicy", "ResidualActor",
           "SampledActor", "SquashedGaussianActor", "TwinQCritic", "ValueCritic", "build_policy", "policy_spec",
           "reset_policy", "update_normalizer"]
