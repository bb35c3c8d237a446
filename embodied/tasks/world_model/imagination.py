"""Model-based training beside a real collector (``embodied train --task wm:<task>`` without ``env.model``).

The off-policy runner collects real steps as always; this object, its second collector, turns them into a model
and imagined experience (Dyna; MBPO, Janner et al. 2019):

- every real transition goes into ``TransitionStore``; after ``warmup`` real steps and then every
  ``refit_every`` the ensemble is refitted on all of them for a fixed epoch budget, and written to the run
  directory as ``world_model.pt`` (what ``make_env("wm:<task>", model=RUN_DIR)`` and ``wm-report`` read);
- after every real step, ``model_envs`` imagined rollouts (episodes that start from recorded real states and last
  at most ``horizon`` steps) take ``model_steps`` steps with the learner's ``act``; the learner observes them as
  it observes real steps, and owes gradient steps for them by its own update-to-data ratio;
- in ``mode=dyna`` the learner also observes the real steps; in ``mode=dream`` it never does (a policy trained
  only in the model, the dream-to-real measurement)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from embodied.algos.base import Transition
from embodied.core.errors import UserError
from embodied.runtime.sync import SyncCollector
from embodied.sim_backends.world_model import MODEL_FILE, ProbabilisticEnsemble, fit, save_world_model

FIELDS = ("state", "action", "reward", "next_state", "terminated", "initial")


class TransitionStore:
    """Real transitions, circular, one ``[capacity, width]`` tensor (columns: ``FIELDS``)."""

    def __init__(self, capacity: int, state_dim: int, act_dim: int, device: torch.device):
        widths = dict(zip(FIELDS, (state_dim, act_dim, 1, state_dim, 1, 1)))
        self.slices, start = {}, 0
        for k, w in widths.items():
            self.slices[k] = slice(start, start + w)
            start += w
        self.capacity, self.size, self.pos = int(capacity), 0, 0
        self.storage = torch.zeros(self.capacity, start, device=device)

    def add(self, **cols: torch.Tensor) -> None:
        n = cols["reward"].shape[0]
        rows = torch.cat([cols[k].reshape(n, -1).float() for k in FIELDS], 1)[-self.capacity:]
        n = rows.shape[0]
        idx = (self.pos + torch.arange(n, device=rows.device)) % self.capacity
        self.storage[idx] = rows
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def get(self, name: str) -> torch.Tensor:
        col = self.storage[: self.size, self.slices[name]]
        return col.squeeze(1) if col.shape[1] == 1 and name not in ("state", "next_state", "action") else col

    def state_dict(self) -> dict:
        return {"rows": self.storage[: self.size].clone(), "pos": self.pos, "capacity": self.capacity}

    def load_state_dict(self, state: Mapping) -> None:
        rows, pos = state["rows"], int(state["pos"])
        if int(state["capacity"]) != self.capacity:  # another budget (a resumed run): oldest first, newest kept
            if rows.shape[0] == int(state["capacity"]):
                rows = torch.cat([rows[pos:], rows[:pos]])
            rows = rows[-self.capacity:]
            pos = rows.shape[0] % self.capacity
        self.size, self.pos = rows.shape[0], pos
        self.storage[: self.size] = rows


class Imagination:
    def __init__(self, run_cfg, learner_device: torch.device, run_dir: Path | None):
        from embodied.tasks.world_model.env import WorldModelEnv

        self.cfg, self.run_cfg = run_cfg.env, run_cfg
        self.task = run_cfg.task.split(":", 1)[1]
        self.device, self.run_dir = torch.device(learner_device), run_dir
        probe = WorldModelEnv.spaces_of(self.task, self.cfg.base)
        self.groups = [k for k in probe["observation"].spaces]
        if any(probe["layout"].images(k) for k in self.groups):
            raise UserError(f"{run_cfg.task} learns its model while training only for state tasks (the ensemble); for "
                            "an image task fit an RSSM first (embodied wm-fit --task TASK --out DIR) and train in it "
                            "with env.model=DIR")
        state_dim = sum(s.shape[0] for s in probe["observation"].spaces.values())
        act_dim = probe["action"].shape[0]
        with torch.random.fork_rng(devices=[]):  # the model's own initialization; the run's RNG stream stays put
            torch.manual_seed(run_cfg.seed + 101)
            self.network = ProbabilisticEnsemble(state_dim, act_dim, self.cfg.ensemble).to(self.device)
        self.opt = torch.optim.Adam(self.network.parameters(), lr=self.cfg.ensemble.lr,
                                    weight_decay=self.cfg.ensemble.weight_decay)
        offline = self._offline_data({k: s.shape[0] for k, s in probe["observation"].spaces.items()}, act_dim)
        if offline and (offline["state"].shape[1], offline["action"].shape[1]) != (state_dim, act_dim):
            raise UserError(f"the dataset {self.cfg.data} has {offline['state'].shape[1]} observation / "
                            f"{offline['action'].shape[1]} action entries per step; {self.task} has {state_dim} / "
                            f"{act_dim}")
        capacity = run_cfg.total_steps + (offline["reward"].shape[0] if offline else 0)
        self.store = TransitionStore(capacity, state_dim, act_dim, self.device)
        if offline:
            self.store.add(**{k: v.to(self.device) for k, v in offline.items()})
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(run_cfg.seed + 103)
        self.env = WorldModelEnv(self.cfg, self.cfg.model_envs, self.device, seed=run_cfg.seed + 107, task=self.task,
                                 world=(self.network, {"task": self.task}))
        self.collector = SyncCollector(lambda n, s: self.env, self.cfg.model_envs, run_cfg.seed, self.device)
        self.fitted = False
        self.next_fit = 0 if offline else self.cfg.warmup
        self.num_imagined = 0
        self.num_faulted = 0  # real rows dropped: numerical faults
        self._fresh: torch.Tensor | None = None  # [N] real envs whose next observation starts an episode
        self.log: dict[str, float] = {}
        self._episode_steps = probe["max_episode_steps"]
        self._judge = None  # scores policies in the model (imagined_return), built on first use

    @property
    def learner_sees_real(self) -> bool:
        return self.cfg.mode == "dyna"

    def observed_per_real_step(self, num_envs: int) -> float:
        """Steps the learner observes per real step of ``num_envs`` envs (its replay is sized by this)."""
        return (1.0 if self.learner_sees_real else 0.0) + self.cfg.model_envs * self.cfg.model_steps / num_envs

    def _offline_data(self, dims: dict[str, int], act_dim: int) -> dict | None:
        """Real transitions recorded before the run: a Minari dataset, or an off-policy run's replay buffer."""
        if not self.cfg.data:
            return None
        from embodied.checkpoint import checkpoint_paths
        from embodied.datasets import read_replay, read_transitions

        path = Path(self.cfg.data)
        if path.is_dir() and checkpoint_paths(path):
            return read_replay(path, dims, act_dim)
        return read_transitions(path, self.groups)

    def _flat(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([obs[k] for k in self.groups], 1)

    def after_real(self, tr: Transition, step: int, algo) -> None:
        """Store a real batch; refit when due; then step the model envs with the learner's ``act``."""
        n = tr.reward.shape[0]
        if self._fresh is None:
            self._fresh = torch.ones(n, dtype=torch.bool, device=self.device)
        if tr.fresh is not None:
            self._fresh |= tr.fresh.to(self.device)
        rows = dict(state=self._flat(tr.obs), action=tr.action, reward=tr.reward, next_state=self._flat(tr.next_obs),
                    terminated=tr.terminated, initial=self._fresh)
        if tr.faulted is not None and bool(tr.faulted.any()):  # no observation to learn a step to: drop the rows
            keep = ~tr.faulted.to(self.device)
            rows = {k: v[keep] for k, v in rows.items()}
            self.num_faulted += int((~keep).sum())
        self.store.add(**rows)
        self._fresh = (tr.terminated | tr.truncated).to(self.device)
        if step >= self.next_fit and self.store.size >= 2:
            self.refit()
            while self.next_fit <= step:
                self.next_fit += self.cfg.refit_every
        if not self.fitted:
            return
        algo.attach_model(self.env)
        for _ in range(self.cfg.model_steps):
            imagined = self.collector.step(algo.act, version=algo.num_updates)
            imagined.stream = "model"
            algo.observe(imagined)
            self.num_imagined += imagined.reward.shape[0]
        episodes = self.collector.pop_episodes()
        if episodes:
            self.log["imagined/return"] = sum(e["return"] for e in episodes) / len(episodes)
            self.log["imagined/length"] = sum(e["length"] for e in episodes) / len(episodes)
        self.log["imagined/steps"] = float(self.num_imagined)
        self.log["model/faulted_rows"] = float(self.num_faulted)
        self.log["imagined/disagreement"] = float(self.collector.log.get("disagreement", 0.0))

    def imagined_return(self, act, episodes: int, learner_device) -> float:
        """The mean return of ``act`` in the current model (``ModelJudge``: ``episodes`` episodes of the real task's
        length from the recorded episode starts); -inf before the first fit."""
        from embodied.tasks.world_model.judge import ModelJudge

        if not self.fitted:
            return float("-inf")
        if self._judge is None:
            self._judge = ModelJudge(self.cfg, self.task, self.device, self.run_cfg.seed + 113, self._episode_steps,
                                     world=(self.network, {"task": self.task}))
        return self._judge.score(act, episodes, learner_device, self._recorded_starts())

    def _recorded_starts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every recorded real state, and those that began an episode (where model episodes start)."""
        states = self.store.get("state")
        return states, states[self.store.get("initial") > 0.5]

    def refit(self) -> None:
        s = self.store
        metrics = fit(self.network, self.opt, s.get("state"), s.get("action"), s.get("reward"), s.get("next_state"),
                      s.get("terminated"), self.cfg.ensemble, self.generator)
        self.network.eval()
        starts, initial = self._recorded_starts()
        self.env.set_starts(starts, initial)
        if not self.fitted:
            self.collector.reset(seed=self.run_cfg.seed + 109)
            self.fitted = True
        self.log.update(metrics)
        self.log["model/fits"] = self.log.get("model/fits", 0.0) + 1
        if self.run_dir is not None:
            save_world_model(Path(self.run_dir) / MODEL_FILE, self.network, self.cfg.ensemble, self.task,
                             _plain(self.cfg.base), starts, initial)

    def state_dict(self) -> dict:
        return {"network": self.network.state_dict(), "opt": self.opt.state_dict(), "store": self.store.state_dict(),
                "generator": self.generator.get_state(), "fitted": self.fitted, "next_fit": self.next_fit,
                "num_imagined": self.num_imagined, "num_faulted": self.num_faulted, "fresh": self._fresh,
                "log": dict(self.log),
                "collector": self.collector.state_dict() if self.fitted else None}

    def load_state_dict(self, state: Mapping) -> None:
        self.network.load_state_dict(state["network"])
        self.opt.load_state_dict(state["opt"])
        self.store.load_state_dict(state["store"])
        self.generator.set_state(state["generator"])
        self.fitted, self.next_fit = bool(state["fitted"]), int(state["next_fit"])
        self.num_imagined, self._fresh, self.log = int(state["num_imagined"]), state["fresh"], dict(state["log"])
        self.num_faulted = int(state.get("num_faulted", 0))
        if state["collector"] is not None:  # with the model env's starts as of the last fit
            self.collector.load_state_dict(state["collector"])


def _plain(cfg) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(cfg)) if cfg is not None else {}

