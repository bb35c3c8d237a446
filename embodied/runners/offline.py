"""Offline runner (behaviour cloning and kin): no collection; every iteration is one ``update`` of the algorithm
on its dataset (or in its model), and ``step`` (``total_steps``, ``log.*_every``) counts what the algorithm says an
update is worth (``steps_per_update``: one gradient step, or the model steps it flew). The collector gives the spaces
and is reset (so that checkpoints are the shared ones) but never stepped; evaluation is the shared one."""

from __future__ import annotations

from embodied.runners.base import Runner


class OfflineRunner(Runner):
    def train(self) -> dict:
        self.start()
        while True:
            metrics = self.algo.update()
            self.step += self.algo.steps_per_update
            if self.after_update(metrics):
                break
        return self.finish()
