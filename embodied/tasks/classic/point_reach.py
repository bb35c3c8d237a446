"""point-reach: a point in the plane steered to a goal, a tiny task with a success predicate for learning tests of
the episodic learners (GRPO) and of language conditioning.

The point starts at ``U(-start_range, start_range)^2``; the action is its velocity, ``speed`` per step at
``|a| = 1`` per axis; the episode succeeds (and ends) when it is within ``tolerance`` of the goal. ``point-reach``
shows the goal (``policy = [point, goal]``, the goal ``U(-0.8, 0.8)^2``); ``point-reach-language`` shows only the
point and an instruction naming one of four corner goals (``(+-0.6, +-0.6)``; "move to the top left corner"), as
its 384-d MiniLM embedding (the ``instruction`` term and the ``text`` group), so the policy must read it.
A scripted expert drives straight at the goal."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import torch

from embodied.core.base import ManagedVecEnv, Obs, StepTerms, box
from embodied.core.layout import ActionTerm, Layout, Term
from embodied.core.registry import TaskSpec, register_task

CORNERS = {"top left": (0.6, 0.6), "top right": (0.6, -0.6), "bottom left": (-0.6, 0.6),
           "bottom right": (-0.6, -0.6)}
PHRASES = ("move to the {} corner", "go to the {} corner")
PARAPHRASES = ("head for the {} corner",)


@dataclass
class PointReachConfig:
    episode_steps: int = 30
    speed: float = 0.1  # per step at |action| = 1
    tolerance: float = 0.1
    start_range: float = 0.3
    phrasing: str = "train"  # language: train | heldout instructions


class PointReachEnv(ManagedVecEnv):
    language = False
    control_dt = 0.1  # [s] nominal

    def __init__(self, cfg: PointReachConfig, num_envs: int, device="cpu", seed: int = 0):
        super().__init__(num_envs, device, seed, max_episode_steps=cfg.episode_steps)
        self.cfg = cfg
        n = self.num_envs
        self.pos = torch.zeros(n, 2, device=self.device)
        self.goal = torch.zeros(n, 2, device=self.device)
        self.succeeded = torch.zeros(n, dtype=torch.bool, device=self.device)
        dim = 4
        if self.language:
            from embodied.core.errors import UserError
            from embodied.vla.text import InstructionTable

            if cfg.phrasing not in ("train", "heldout"):
                raise UserError(f"phrasing must be train or heldout, got {cfg.phrasing!r}")
            phrases = PHRASES if cfg.phrasing == "train" else PARAPHRASES
            self.table = InstructionTable([p.format(c) for c in CORNERS for p in (*PHRASES, *PARAPHRASES)])
            self.rows = torch.tensor([[self.table.index[p.format(c)] for p in phrases] for c in CORNERS])
            self.corners = torch.tensor(list(CORNERS.values()), device=self.device)
            self.row = torch.zeros(n, dtype=torch.long)
            dim = 2 + self.table.table.shape[1]
        spaces = {"policy": box(-float("inf"), float("inf"), (dim,))}
        if self.language:
            spaces["text"] = box(-1.0, 1.0, (self.table.table.shape[1],))
        self.single_observation_space = gym.spaces.Dict(spaces)
        self.single_action_space = box(-1.0, 1.0, (2,))

    def _reset_idx(self, env_ids: torch.Tensor) -> None:
        k = env_ids.numel()
        u = lambda r: (torch.rand(k, 2, generator=self.generator, device=self.device) * 2 - 1) * r  # noqa: E731
        self.pos[env_ids] = u(self.cfg.start_range)
        if self.language:
            corner = torch.randint(len(CORNERS), (k,), generator=self.generator, device=self.device)
            phrase = torch.randint(self.rows.shape[1], (k,), generator=self.generator, device=self.device)
            self.goal[env_ids] = self.corners[corner]
            self.row[env_ids.cpu()] = self.rows[corner.cpu(), phrase.cpu()]
        else:
            self.goal[env_ids] = u(0.8)
        self.succeeded[env_ids] = False

    def _apply_action(self, action: torch.Tensor) -> None:
        self.pos = (self.pos + self.cfg.speed * action.clamp(-1, 1)).clamp(-1.0, 1.0)

    def _observe(self) -> Obs:
        if not self.language:
            return {"policy": torch.cat([self.pos, self.goal], 1)}
        text = self.table.embed(self.row).to(self.device)
        return {"policy": torch.cat([self.pos, text], 1), "text": text}

    def _compute(self, action: torch.Tensor) -> StepTerms:
        dist = (self.pos - self.goal).norm(dim=1)
        success = dist < self.cfg.tolerance
        self.succeeded = success.clone()
        return StepTerms({"distance": -dist, "success": 10.0 * success.float()}, success,
                         {"success_rate": success.float()})

    def _final_info(self, done):
        return {"success": self.succeeded.float()}

    def layout(self) -> Layout:
        goal = (Term("instruction", self.table.table.shape[1], "1", description="MiniLM embedding",
                     source="instruction"),) if self.language else (Term("goal", 2, "m"),)
        obs = {"policy": (Term("pos", 2, "m"), *goal)}
        if self.language:
            obs["text"] = goal
        return Layout(obs, (ActionTerm("velocity", 2, "m/step", scale=self.cfg.speed),), 1.0 / self.control_dt,
                      extras={"instructions": self.table.texts} if self.language else {})

    def state_dict(self) -> dict:
        state = {**super().state_dict(), "pos": self.pos.clone(), "goal": self.goal.clone(),
                 "succeeded": self.succeeded.clone()}
        if self.language:
            state["row"] = self.row.clone()
        return state

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self.pos.copy_(state["pos"])
        self.goal.copy_(state["goal"])
        self.succeeded.copy_(state["succeeded"])
        if self.language:
            self.row.copy_(state["row"])


class PointReachLanguageEnv(PointReachEnv):
    language = True


class PointExpert:
    """Straight at the goal, with Gaussian action noise."""

    def __init__(self, env, action_noise: float | None = None, target_noise: float = 0.0, seed: int = 0):
        self.env, self.noise = env, 0.1 if action_noise is None else action_noise
        self.generator = torch.Generator(device=env.device).manual_seed(seed)

    def __call__(self, obs) -> torch.Tensor:
        a = (self.env.goal - self.env.pos) / self.env.cfg.speed
        a = a + self.noise * torch.randn(a.shape, generator=self.generator, device=a.device)
        return a.clamp(-1.0, 1.0)


for _name, _cls, _what in (("point-reach", PointReachEnv, "a shown goal"),
                           ("point-reach-language", PointReachLanguageEnv, "a corner named by an instruction")):
    register_task(TaskSpec(name=_name, make=_cls, config_cls=PointReachConfig,
                           description=f"Tiny: steer a point to {_what} (success within 0.1)",
                           backends=("torch_vec",), success_metric="success", default_algo="grpo",
                           tags=("language",) if _cls.language else (), expert=PointExpert))
