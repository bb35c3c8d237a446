"""One runner per paradigm; an algorithm's ``paradigm`` picks it."""

from embodied.algos.base import OFF_POLICY, ON_POLICY
from embodied.runners.off_policy import OffPolicyRunner
from embodied.runners.on_policy import OnPolicyRunner

RUNNERS = {ON_POLICY: OnPolicyRunner, OFF_POLICY: OffPolicyRunner}

__all__ = ["OffPolicyRunner", "OnPolicyRunner", "RUNNERS"]
