"""One runner per paradigm."""

from embodied.runners.off_policy import OffPolicyRunner
from embodied.runners.on_policy import OnPolicyRunner

RUNNERS = {"ppo": OnPolicyRunner, "sac": OffPolicyRunner, "td3": OffPolicyRunner}

__all__ = ["OffPolicyRunner", "OnPolicyRunner", "RUNNERS"]
