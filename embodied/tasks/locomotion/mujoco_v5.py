"""MuJoCo locomotion (HalfCheetah, Hopper, Walker2d, Ant, Humanoid) with the observations, rewards,
terminations and reset noise of gymnasium's ``*-v5`` environments, batched on ``mujoco_cpu``, so that
returns compare with published tables. ``tests/tasks/test_locomotion_parity.py`` checks every task
against gymnasium's own environment on identical states and actions.

Deviation by design: finished envs reset inside the same step (the VecEnv contract); episodes are
truncated at ``episode_steps`` (gymnasium's ``TimeLimit``, 1000). Actions are in the model's ctrlrange
and are not clipped, as in gymnasium (MuJoCo clamps the applied control; the cost uses the action).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch

from embodied.core.base import ManagedVecEnv, Obs, StepTerms
from embodied.core.registry import TaskSpec, register_task
from embodied.sim_backends.base import choose_backend, make_backend


@dataclass
class DomainRandomizationConfig:
    enabled: bool = False
    mass: float = 0.1  # relative +- range of every body mass, per world, drawn at reset
    friction: float = 0.1  # relative +- range of every geom's sliding friction


@dataclass
class LocomotionConfig:
    """Field names follow gymnasium's v5 keyword arguments; defaults are set per task."""

    model: str = ""  # MJCF path; "" = the gymnasium asset of the task
    frame_skip: int = 5
    episode_steps: int = 1000  # gymnasium's TimeLimit
    forward_reward_weight: float = 1.0
    ctrl_cost_weight: float = 0.1
    contact_cost_weight: float = 0.0
    healthy_reward: float = 0.0
    terminate_when_unhealthy: bool = True
    healthy_z_range: list[float] = field(default_factory=lambda: [-np.inf, np.inf])
    healthy_angle_range: list[float] = field(default_factory=lambda: [-np.inf, np.inf])
    reset_noise_scale: float = 0.1
    sim_threads: int = 1  # native threads stepping the worlds
    obs_float64: bool = False  # observations in float64 (gymnasium's dtype) instead of float32
    domain_randomization: DomainRandomizationConfig = field(default_factory=DomainRandomizationConfig)


class LocomotionEnv(ManagedVecEnv):
    """What the five tasks share; each subclass states its asset, observation and health check."""

    asset: str  # the gymnasium MJCF file
    task_name: str  # registered name
    qvel_noise: str = "uniform"  # "uniform" or "normal" reset noise on qvel (as the v5 task does)
    post_constraint: bool = False  # the task reads cfrc_ext (mj_rnePostConstraint after each step)

    def __init__(self, cfg: LocomotionConfig, num_envs: int, device="cpu", seed: int = 0):
        super().__init__(num_envs, device, seed, max_episode_steps=cfg.episode_steps)
        self.cfg = cfg
        self.sim = make_backend(choose_backend(self.task_name, None), cfg.model or self.asset, self.num_envs,
                                self.device, frame_skip=cfg.frame_skip, num_threads=cfg.sim_threads,
                                post_constraint=self.post_constraint)
        m = self.sim.model
        self.control_dt = self.sim.dt  # [s]
        self.init_qpos = torch.from_numpy(m.qpos0.copy())
        self.xpos = self.sim.t("xpos")  # [N, nbody, 3] derived, one substep behind the state (as mj_step)
        if cfg.domain_randomization.enabled:
            self.nominal_mass = torch.from_numpy(m.body_mass.copy())
            self.nominal_friction = torch.from_numpy(m.geom_friction[:, 0].copy())
            self.body_mass, self.geom_friction = self.sim.expand("body_mass"), self.sim.expand("geom_friction")
        # the rewarded position after the latest step or reset: derived fields (xpos) are one substep
        # behind the state, so it is kept (and checkpointed) rather than recomputed from a restored state
        self._pos = torch.zeros(self.num_envs, 2, dtype=torch.float64)
        low, high = m.actuator_ctrlrange[:, 0].astype(np.float32), m.actuator_ctrlrange[:, 1].astype(np.float32)
        self.single_action_space = gym.spaces.Box(low, high, dtype=np.float32)
        dim = self._observe()["policy"].shape[1]
        self._obs_dtype = np.float64 if cfg.obs_float64 else np.float32
        self.single_observation_space = gym.spaces.Dict(
            {"policy": gym.spaces.Box(-np.inf, np.inf, (dim,), dtype=self._obs_dtype)})

    # ---- per task -------------------------------------------------------------------------------
    def _position(self) -> torch.Tensor:
        """``[N, 2]`` the planar position whose rate is rewarded (x in column 0) [m]."""
        x = self.sim.qpos[:, :1]
        return torch.cat([x, torch.zeros_like(x)], 1)

    def _healthy(self) -> torch.Tensor:
        return torch.ones(self.num_envs, dtype=torch.bool)

    def _obs_terms(self) -> list[torch.Tensor]:
        raise NotImplementedError

    def _contact_cost(self) -> torch.Tensor | None:
        return None

    # ---- ManagedVecEnv hooks --------------------------------------------------------------------
    def _reset_idx(self, env_ids: torch.Tensor) -> None:
        k, s, sim = env_ids.numel(), self.cfg.reset_noise_scale, self.sim
        g = self.generator
        qpos = self.init_qpos + (torch.rand(k, sim.model.nq, generator=g, dtype=torch.float64) * 2 - 1) * s
        if self.qvel_noise == "normal":
            qvel = s * torch.randn(k, sim.model.nv, generator=g, dtype=torch.float64)
        else:
            qvel = (torch.rand(k, sim.model.nv, generator=g, dtype=torch.float64) * 2 - 1) * s
        if self.cfg.domain_randomization.enabled:
            self._randomize(env_ids)
        sim.set_state_idx(env_ids, torch.cat([qpos, qvel], 1))
        self._pos[env_ids] = self._position()[env_ids]

    def _randomize(self, env_ids: torch.Tensor) -> None:
        dr, g, k = self.cfg.domain_randomization, self.generator, env_ids.numel()
        u = lambda n, r: 1.0 + (torch.rand(k, n, generator=g, dtype=torch.float64) * 2 - 1) * r  # noqa: E731
        self.body_mass[env_ids] = self.nominal_mass * u(self.nominal_mass.numel(), dr.mass)
        self.geom_friction[env_ids, :, 0] = self.nominal_friction * u(self.nominal_friction.numel(), dr.friction)
        self.sim.batch.set_const(env_ids.numpy())

    def _apply_action(self, action: torch.Tensor) -> None:
        self._pos_before = self._pos
        self.sim.step(action)
        self._pos = self._position().clone()

    def _observe(self) -> Obs:
        obs = torch.cat(self._obs_terms(), 1)
        return {"policy": obs if self.cfg.obs_float64 else obs.to(torch.float32)}

    def _compute(self, action: torch.Tensor) -> StepTerms:
        cfg = self.cfg
        velocity = (self._pos - self._pos_before) / self.control_dt  # [N, 2] [m/s]
        healthy = self._healthy()
        a = action.to(torch.float64)
        terms = {
            "forward": cfg.forward_reward_weight * velocity[:, 0],
            "ctrl": -cfg.ctrl_cost_weight * (a * a).sum(1),
        }
        if cfg.healthy_reward:
            terms["survive"] = cfg.healthy_reward * healthy.to(torch.float64)
        contact = self._contact_cost()
        if contact is not None:
            terms["contact"] = -contact
        terminated = ~healthy if cfg.terminate_when_unhealthy else torch.zeros_like(healthy)
        return StepTerms(terms, terminated, {"x_velocity": velocity[:, 0]})

    def _state_finite(self) -> torch.Tensor:
        return self.sim.finite()

    def render_frame(self, env_idx: int = 0) -> np.ndarray:
        return self.sim.render_frame(env_idx)

    @property
    def can_render(self) -> bool:  # drawing needs an OpenGL platform (EGL, OSMesa or a display)
        return self.sim.can_render

    def state_dict(self) -> dict:
        state = {**super().state_dict(), "sim": self.sim.get_state(), "position": self._pos.clone()}
        if self.cfg.domain_randomization.enabled:
            state.update(body_mass=self.body_mass.clone(), geom_friction=self.geom_friction.clone())
        return state

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        if self.cfg.domain_randomization.enabled:
            self.body_mass.copy_(state["body_mass"])
            self.geom_friction.copy_(state["geom_friction"])
            self.sim.batch.set_const()
        self.sim.set_state(state["sim"])
        self._pos.copy_(state["position"])


def _within(x: torch.Tensor, bounds, inclusive: bool = False) -> torch.Tensor:
    lo, hi = bounds
    return (x >= lo) & (x <= hi) if inclusive else (x > lo) & (x < hi)


class HalfCheetahEnv(LocomotionEnv):
    asset, qvel_noise = "half_cheetah.xml", "normal"

    def _obs_terms(self):
        return [self.sim.qpos[:, 1:], self.sim.qvel]


class HopperEnv(LocomotionEnv):
    asset = "hopper.xml"
    healthy_state_range = (-100.0, 100.0)

    def _healthy(self):
        q, c = self.sim.qpos, self.cfg
        state = torch.cat([q, self.sim.qvel], 1)[:, 2:]
        ok_state = _within(state, self.healthy_state_range).all(1)
        return ok_state & _within(q[:, 1], c.healthy_z_range) & _within(q[:, 2], c.healthy_angle_range)

    def _obs_terms(self):
        return [self.sim.qpos[:, 1:], self.sim.qvel.clamp(-10.0, 10.0)]


class Walker2dEnv(HopperEnv):
    asset = "walker2d_v5.xml"

    def _healthy(self):
        q, c = self.sim.qpos, self.cfg
        return _within(q[:, 1], c.healthy_z_range) & _within(q[:, 2], c.healthy_angle_range)


class AntEnv(LocomotionEnv):
    asset, qvel_noise, post_constraint = "ant.xml", "normal", True
    contact_force_range = (-1.0, 1.0)

    def _position(self):
        return self.xpos[:, 1, :2]  # main body (the torso), as gymnasium's data.body(1).xpos

    def _contact_forces(self) -> torch.Tensor:
        return self.sim.t("cfrc_ext").clamp(*self.contact_force_range)

    def _healthy(self):
        q = torch.cat([self.sim.qpos, self.sim.qvel], 1)
        return torch.isfinite(q).all(1) & _within(q[:, 2], self.cfg.healthy_z_range, inclusive=True)

    def _contact_cost(self):
        f = self._contact_forces()
        return self.cfg.contact_cost_weight * (f * f).sum((1, 2))

    def _obs_terms(self):
        return [self.sim.qpos[:, 2:], self.sim.qvel, self._contact_forces()[:, 1:].flatten(1)]


class HumanoidEnv(LocomotionEnv):
    asset, post_constraint = "humanoid.xml", True
    contact_cost_max = 10.0

    def _position(self):
        mass = self.body_mass if self.cfg.domain_randomization.enabled else torch.from_numpy(self.sim.model.body_mass)
        mass = mass.expand(self.num_envs, -1)
        xipos = self.sim.t("xipos")  # [N, nbody, 3] centres of mass
        return (torch.einsum("nb,nbj->nj", mass, xipos) / mass.sum(1, keepdim=True))[:, :2]

    def _healthy(self):
        return _within(self.sim.qpos[:, 2], self.cfg.healthy_z_range)

    def _contact_cost(self):
        f = self.sim.t("cfrc_ext")
        return (self.cfg.contact_cost_weight * (f * f).sum((1, 2))).clamp(max=self.contact_cost_max)

    def _obs_terms(self):
        s = self.sim
        return [s.qpos[:, 2:], s.qvel, s.t("cinert")[:, 1:].flatten(1), s.t("cvel")[:, 1:].flatten(1),
                s.t("qfrc_actuator")[:, 6:], s.t("cfrc_ext")[:, 1:].flatten(1)]


def _config(**defaults):
    """A config dataclass for one task: ``LocomotionConfig`` with that task's v5 defaults."""
    fields = []
    for name, value in defaults.items():
        default = field(default_factory=lambda v=value: list(v)) if isinstance(value, list) else value
        fields.append((name, type(value) if not isinstance(value, list) else list[float], default))
    return dataclasses.make_dataclass("Config", fields, bases=(LocomotionConfig,))


INF = float("inf")
TASKS_V5 = {
    # name: (env class, gymnasium id, v5 defaults)
    "halfcheetah": (HalfCheetahEnv, "HalfCheetah-v5", dict(frame_skip=5, ctrl_cost_weight=0.1, reset_noise_scale=0.1,
                                                           terminate_when_unhealthy=False)),
    "hopper": (HopperEnv, "Hopper-v5", dict(frame_skip=4, ctrl_cost_weight=1e-3, healthy_reward=1.0,
                                            healthy_z_range=[0.7, INF], healthy_angle_range=[-0.2, 0.2],
                                            reset_noise_scale=5e-3)),
    "walker2d": (Walker2dEnv, "Walker2d-v5", dict(frame_skip=4, ctrl_cost_weight=1e-3, healthy_reward=1.0,
                                                  healthy_z_range=[0.8, 2.0], healthy_angle_range=[-1.0, 1.0],
                                                  reset_noise_scale=5e-3)),
    "ant": (AntEnv, "Ant-v5", dict(frame_skip=5, ctrl_cost_weight=0.5, contact_cost_weight=5e-4, healthy_reward=1.0,
                                   healthy_z_range=[0.2, 1.0], reset_noise_scale=0.1)),
    "humanoid": (HumanoidEnv, "Humanoid-v5", dict(frame_skip=5, forward_reward_weight=1.25, ctrl_cost_weight=0.1,
                                                  contact_cost_weight=5e-7, healthy_reward=5.0,
                                                  healthy_z_range=[1.0, 2.0], reset_noise_scale=1e-2)),
}

for _name, (_cls, _gym_id, _defaults) in TASKS_V5.items():
    _cls.task_name = _name
    _cfg_cls = _config(**_defaults)
    _cfg_cls.__name__ = _cfg_cls.__qualname__ = f"{_cls.__name__[:-3]}Config"
    _cfg_cls.__module__ = __name__
    globals()[_cfg_cls.__name__] = _cfg_cls  # importable by name (pickled into worker processes)
    register_task(TaskSpec(name=_name, make=_cls, config_cls=_cfg_cls,
                           description=f"MuJoCo {_gym_id} (observations, rewards, terminations of gymnasium v5)",
                           backends=("mujoco_cpu",), default_algo="ppo", tags=("mujoco", "locomotion")))
