"""``sim://<task>?mass=1.2&thrust=0.9&...``: any registered task as a robot with its own physical parameters
(query values multiply the task's nominal ones; ``seed`` picks the initial states; ``device`` the sim's).
Fault injection for tests and drills: ``dropout_at=K&dropout_ticks=D`` (the state stops refreshing for D
readings from the K-th), ``nan_at=K`` (the K-th reading is NaN).
The robot is the task's evaluation environment (its full initial-state distribution, no curriculum, no
domain randomization: one plant), one env, stepped once per ``send_action`` (lock-step). An episode's end
(a crash or the time limit) is reported in ``RobotState.info`` and the next episode starts at once, so a
long deploy flies many episodes; ``status()`` counts them."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from embodied.core.errors import UserError
from embodied.core.registry import ROBOTS, TASKS
from embodied.hardware.robot import Robot, RobotState, monotonic, parse_uri

VEHICLE_EPISODE_S = 24 * 3600.0  # a simulated vehicle flies until it crashes (the task's 5 s episodes do not apply)


def sim_env(task: str, factors: dict[str, float], seed: int, device: str = "cpu", **overrides):
    """The task's evaluation env (its preset's task config) with domain randomization off and the plant scaled;
    ``overrides`` set task config fields (a vehicle simulator has no episode time limit: ``episode_s``)."""
    import embodied.tasks  # noqa: F401
    from embodied.config import load_config

    spec = TASKS.get(task)
    env_cfg = load_config(task).env
    env_cfg = spec.eval_config(env_cfg) if spec.eval_config else env_cfg
    dr = getattr(env_cfg, "domain_randomization", None)
    if dr is not None and getattr(dr, "enabled", False):
        env_cfg = dataclasses.replace(env_cfg, domain_randomization=dataclasses.replace(dr, enabled=False))
    if overrides:
        env_cfg = dataclasses.replace(env_cfg, **overrides)
    env = spec.make(env_cfg, num_envs=1, device=device, seed=seed)
    env.scale_plant(**factors)
    return env


class SimRobot(Robot):
    scheme = "sim"

    def __init__(self, uri: str):
        super().__init__(uri)
        _, task, query = parse_uri(uri)
        if not task:
            raise UserError(f"{uri}: name the task, e.g. sim://quadrotor-hover")
        self.task = task
        try:
            self.seed = int(query.pop("seed", "0"))
        except ValueError:
            raise UserError(f"{uri}: seed must be an integer") from None
        self.device = query.pop("device", "cpu")
        faults = {}
        for k in ("dropout_at", "dropout_ticks", "nan_at"):
            if k in query:
                v = query.pop(k)
                if not v.isdigit():
                    raise UserError(f"{uri}: {k} must be a non-negative integer")
                faults[k] = int(v)
        self.faults = faults
        try:
            self.factors = {k: float(v) for k, v in query.items()}
        except ValueError:
            raise UserError(f"{uri}: plant parameters must be numbers") from None
        self.env = None

    def connect(self) -> None:
        self.env = sim_env(self.task, self.factors, self.seed, self.device)
        self.layout = self.env.layout()
        slices = self.layout.slices("policy")
        self._robot = [slices[t.name] for t in self.layout.robot_terms("policy")]
        self.env.reset(seed=self.seed)
        self.env.step(torch.zeros(1, self.layout.action_size, device=self.env.device))  # warm (JIT, caches)
        self._obs, _ = self.env.reset(seed=self.seed)  # the same start as without the warm-up step
        self._seq, self._new_episode = 0, True
        self._reads, self._last_state = 0, None
        self._last_end: dict | None = None
        self.episodes, self.successes, self.crashes, self.steps = 0, 0, 0, 0
        self._success_key = TASKS.get(self.task).success_metric

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None

    def observe(self) -> RobotState:
        k, f = self._reads, self.faults
        self._reads += 1
        if "dropout_at" in f and f["dropout_at"] <= k < f["dropout_at"] + f.get("dropout_ticks", 1) \
                and self._last_state is not None:
            return self._last_state  # the same reading again: stale
        state = self._read()
        if f.get("nan_at") == k:
            state = RobotState(np.full_like(state.values, np.nan), state.seq, state.t, state.info)
        self._last_state = state
        return state

    def _read(self) -> RobotState:
        full = self._obs["policy"][0]
        values = torch.cat([full[sl] for sl in self._robot]).numpy().astype(np.float32)
        info = {"new_episode": self._new_episode}
        if self._last_end is not None:
            info["episode_end"] = self._last_end
        self._new_episode, self._last_end = False, None
        return RobotState(values, self._seq, monotonic(), info)

    def send_action(self, action: np.ndarray) -> np.ndarray:
        a = np.asarray(action, np.float32).reshape(1, -1)
        self._obs, _, term, trunc, info = self.env.step(torch.from_numpy(a).to(self.env.device))
        self._seq += 1
        self.steps += 1
        if bool(term[0] or trunc[0]):
            ok = bool(info.get("final_info", {}).get(self._success_key, torch.zeros(1))[0]) if self._success_key \
                else False
            self.episodes += 1
            self.successes += int(ok)
            self.crashes += int(bool(term[0]))
            self._last_end = {"success": ok, "terminated": bool(term[0]), "episode": self.episodes}
            self._new_episode = True
        return a[0].copy()

    def status(self) -> dict:
        return {"episodes": self.episodes, "successes": self.successes, "crashes": self.crashes, "steps": self.steps}


ROBOTS.register("sim", SimRobot)
