"""Offline runner (behaviour cloning and kin): no collection; every iteration is one ``update`` of the algorithm
on its dataset, and ``step`` (``total_steps``, ``log.*_every``) counts these gradient steps. The collector gives the
spaces and is reset (so that checkpoints are the shared ones) but never stepped; evaluation is the shared one."""

from __future__ import annotations

from embodied.runners.base import Runner


class OfflineRunner(Runner):
    def train(self) -> dict:
        self.start()
        while True:
            metrics = self.algo.update()
            self.step += 1
            if self.after_update(metrics):
                break
        return self.finish()
