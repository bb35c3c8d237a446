"""A scripted pick-and-place expert for LIBERO tasks whose goal is ``(On A B)`` (all of LIBERO-Spatial, most of
LIBERO-Object): it reads the true poses of A and B from the simulator and drives the OSC_POSE deltas through
approach, descend, grasp, lift, carry, lower, release, per env. Bowls are grasped by their wall (the fingers straddle
the rim on the side along their closing axis), other objects at their centre."""

from __future__ import annotations

import numpy as np
import torch

from embodied.core.errors import UserError

MAX_DELTA = 0.05  # [m] OSC_POSE translation at |action| = 1
# action_noise where none is given, on the translation and rotation deltas (not the gripper): as the tabletop experts
# (DART: the demonstrations visit the states the perturbations lead to, labelled with the expert's correction). With
# none, a clone of 50 noise-free demonstrations of libero_spatial/0 matched the expert to 0.01 per dimension on the
# expert's own states and failed every episode from its own: a few steps in, a state no demonstration visited
DEFAULT_NOISE = 0.1
ABOVE, CARRY, CLOSE_STEPS = 0.10, 0.12, 8


class LiberoExpert:
    def __init__(self, env, action_noise: float | None = None, target_noise: float = 0.0, seed: int = 0):
        self.env = env
        self.noise = DEFAULT_NOISE if action_noise is None else action_noise
        self.label: torch.Tensor | None = None  # the last call's action without the noise: what a demo records
        self.rng = np.random.default_rng(seed)
        goal = env.envs[0].env.parsed_problem["goal_state"]
        if len(goal) != 1 or goal[0][0] != "on":
            raise UserError(f"the LIBERO expert solves (On A B) goals; {env.task_name} has {goal}")
        self.obj, self.dest = goal[0][1], goal[0][2]
        self.phase = np.zeros(env.num_envs, dtype=int)
        self.timer = np.zeros(env.num_envs, dtype=int)
        self.held = np.zeros((env.num_envs, 3))  # the grip point relative to the object once grasped
        self.lift = np.zeros((env.num_envs, 3))  # where the lift ends

    def _pos(self, i: int, name: str) -> np.ndarray:
        o = self.env.last[i]
        if f"{name}_pos" in o:
            return np.asarray(o[f"{name}_pos"], dtype=float)
        e = self.env.envs[i].env  # a fixture or region: its body or site in the simulator
        sim = e.sim
        for candidate in (name, f"{name}_main"):
            try:
                return np.array(sim.data.get_body_xpos(candidate))
            except (ValueError, KeyError):
                pass
        try:
            return np.array(sim.data.get_site_xpos(name))
        except (ValueError, KeyError):
            raise UserError(f"the LIBERO expert cannot locate {name!r}") from None

    def __call__(self, obs) -> torch.Tensor:
        n = self.env.num_envs
        fresh = (self.env.episode_length == 0).numpy()
        self.phase[fresh], self.timer[fresh] = 0, 0
        actions = np.zeros((n, 7))
        for i in range(n):
            actions[i] = self._act(i)
        actions = np.clip(actions, -1.0, 1.0)
        self.label = torch.from_numpy(actions).float()
        actions = actions + self.noise * self.rng.standard_normal(actions.shape) * np.r_[np.ones(6), 0.0]
        self.timer += 1
        return torch.from_numpy(np.clip(actions, -1.0, 1.0)).float()

    def _act(self, i: int) -> np.ndarray:
        o = self.env.last[i]
        eef = np.asarray(o["robot0_eef_pos"], dtype=float)
        obj, dest = self._pos(i, self.obj), self._pos(i, self.dest)
        bowl = "bowl" in self.obj
        grasp = obj + (np.array([0.0, -0.045, 0.03]) if bowl else np.array([0.0, 0.0, 0.01]))
        p = self.phase[i]
        gripper = -1.0 if p < 2 or p >= 6 else 1.0
        if p == 0:  # above the grasp point
            target = grasp + [0, 0, ABOVE]
            if np.linalg.norm(eef - target) < 0.01:
                self._next(i)
        elif p == 1:  # down to it
            target = grasp
            if np.linalg.norm(eef - target) < 0.008:
                self._next(i)
        elif p == 2:  # close
            target = grasp
            if self.timer[i] >= CLOSE_STEPS:
                self.held[i] = eef - obj
                self.lift[i] = eef + [0, 0, CARRY]
                self._next(i)
        elif p == 3:  # lift, straight up from where it closed
            target = self.lift[i]
            if eef[2] > target[2] - 0.01:
                self._next(i)
        elif p == 4:  # over the destination (the object's centre over it)
            target = np.r_[dest[:2] + self.held[i][:2], eef[2]]
            if np.linalg.norm((eef - self.held[i] - dest)[:2]) < 0.01:
                self._next(i)
        elif p == 5:  # lower onto it
            target = np.r_[dest[:2] + self.held[i][:2], dest[2] + self.held[i][2] + 0.04]
            if eef[2] < target[2] + 0.01:
                self._next(i)
        else:  # open, then back off upwards
            target = eef + ([0, 0, 0.03] if self.timer[i] > CLOSE_STEPS else 0.0)
        delta = np.clip((target - eef) / MAX_DELTA, -1.0, 1.0)
        return np.r_[delta, 0.0, 0.0, 0.0, gripper]

    def _next(self, i: int) -> None:
        self.phase[i] += 1
        self.timer[i] = 0
