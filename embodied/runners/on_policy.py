"""On-policy runner (PPO and kin): collect a rollout of the algorithm's ``rollout_length`` steps per env,
then update. An episodic algorithm (GRPO) starts each rollout from its own per-env seeds and ends it once every
env has finished an episode."""

from __future__ import annotations

from embodied.runners.base import Runner


class OnPolicyRunner(Runner):
    def train(self) -> dict:
        self.start()
        while True:
            self.collect_rollout()
            metrics = self.algo.update()
            if self.after_update(metrics):
                break
        return self.finish()

    def collect_rollout(self) -> None:
        """One rollout: ``rollout_length`` steps of every env, or for an episodic algorithm, from the starts it
        asks for until every env has finished an episode."""
        starts = self.algo.rollout_starts()
        if starts is not None:
            self.collector.reset_seeded(starts.seeds, starts.restore, starts.tasks)
        ended = None
        record = getattr(self.algo, "records_env_states", False)  # it may start later rollouts from these states
        for _ in range(self.algo.rollout_length):
            if record:
                self.algo.record_env_states(self.collector.env_states())
            tr = self.collect()
            if self.algo.episodic:  # the rollout ends once every env has finished an episode
                done = tr.terminated | tr.truncated
                ended = done if ended is None else ended | done
                if bool(ended.all()):
                    break
