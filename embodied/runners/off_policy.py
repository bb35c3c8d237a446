"""Off-policy runner (SAC, TD3): step all envs once, store, then let the algorithm take the
gradient steps it owes (its update-to-data ratio lives in the algorithm's config)."""

from __future__ import annotations

from embodied.runners.base import Runner


class OffPolicyRunner(Runner):
    def train(self) -> dict:
        self.start()
        metrics: dict = {}
        while True:
            self.collect()
            metrics = self.algo.update() or metrics  # keep the last non-empty metrics for logging
            if self.after_update(metrics):
                break
        return self.finish()
