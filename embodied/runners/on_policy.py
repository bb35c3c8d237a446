"""On-policy runner (PPO and kin): collect a rollout of the algorithm's ``rollout_length`` steps per env,
then update."""

from __future__ import annotations

from embodied.runners.base import Runner


class OnPolicyRunner(Runner):
    def train(self) -> dict:
        self.start()
        num_steps = self.algo.rollout_length
        while True:
            for _ in range(num_steps):
                self.collect()
            metrics = self.algo.update()
            if self.after_update(metrics):
                break
        return self.finish()
