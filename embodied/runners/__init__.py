"""One runner per paradigm; an algorithm's ``paradigm`` picks it."""

from embodied.algos.base import OFF_POLICY, OFFLINE, ON_POLICY
from embodied.runners.off_policy import OffPolicyRunner
from embodied.runners.offline import OfflineRunner
from embodied.runners.on_policy import OnPolicyRunner

RUNNERS = {ON_POLICY: OnPolicyRunner, OFF_POLICY: OffPolicyRunner, OFFLINE: OfflineRunner}

__all__ = ["OffPolicyRunner", "OfflineRunner", "OnPolicyRunner", "RUNNERS"]
