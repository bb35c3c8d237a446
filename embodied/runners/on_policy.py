"""On-policy runner (PPO and kin): collect a rollout of ``num_steps`` per env, then update."""

from __future__ import annotations

from embodied.runners.base import Runner


class OnPolicyRunner(Runner):
    def train(self) -> dict:
        self.start()
        num_steps = self.cfg.ppo.num_steps
        while True:
            for _ in range(num_steps):
                self.collect()
            metrics = self.algo.update()
            if self.after_update(metrics):
                break
        return self.finish()
