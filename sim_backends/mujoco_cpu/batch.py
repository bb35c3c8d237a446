"""N MuJoCo worlds of one MJCF model stepped as one batch by native threads (``mujoco.batch.Batch``).

Why ``mujoco.batch`` (measured in ``scripts/bench/bench_mujoco_step.py``): each call runs all worlds on
a C++ thread pool with the GIL released, keeps the state of every world in one ``[N, nstate]`` array
(so ``qpos``/``qvel``/``ctrl`` are zero-copy ``[N, k]`` views), copies only the derived fields a task
binds, and gives per-world model fields (domain randomization) and named views (``body``, ``joint``).

State fields (``qpos``, ``qvel``, ``ctrl``, ...) are live float64 views; derived fields (``xpos``,
``cinert``, ...) describe the state before the last substep, as after ``mj_step``.

One quantity has no batched MuJoCo call: ``cfrc_ext`` (external contact wrenches), which gymnasium's
v5 tasks read after ``mj_rnePostConstraint`` at the last substep. A backend built with
``post_constraint=True`` (Ant, Humanoid) is persistent (one ``MjData`` per world) and runs
``mj_rnePostConstraint`` per world after each step: the one per-env call on the hot path.
"""

from __future__ import annotations

import os
import warnings

import mujoco
import numpy as np

try:  # MuJoCo >= 4; the rest of the package runs on 3.x too (the LIBERO extra pins mujoco < 4)
    import mujoco.batch
except ImportError:  # pragma: no cover - only where an older MuJoCo is installed
    pass
import torch

from embodied.core.errors import UserError
from embodied.sim_backends.base import BackendFactory, NamedLayout, SimBackend

# the integration state saved by get_state (mjSTATE_INTEGRATION minus what these models lack)
_STATE_FIELDS = ("time", "qpos", "qvel", "act", "qacc_warmstart", "ctrl")
_NO_STAGE, _POSITIONS = int(mujoco.mjtStage.mjSTAGE_NONE), int(mujoco.mjtStage.mjSTAGE_POS)


def load_model(model: str | mujoco.MjModel) -> mujoco.MjModel:
    """An ``MjModel`` from a model, an MJCF path, or an MJCF string."""
    if isinstance(model, mujoco.MjModel):
        return model
    try:
        if model.lstrip().startswith("<"):
            return mujoco.MjModel.from_xml_string(model)
        if not os.path.exists(model):
            raise UserError(f"MJCF file {model!r} does not exist")
        return mujoco.MjModel.from_xml_path(model)
    except ValueError as e:  # MuJoCo's compile errors
        raise UserError(f"MJCF {model!r} does not compile: {str(e).splitlines()[0]}") from None


DEVICES = ("cpu",)  # MuJoCo steps on the CPU; a learner may still run on CUDA


class MujocoBatch(SimBackend):
    """``num_envs`` worlds of one model; ``step`` applies controls and runs ``frame_skip`` substeps.

    ``bind(name)`` gives a live ``[N, ...]`` float64 numpy view of an ``MjData`` field; ``t(name)`` the
    same as a torch tensor (zero copy). ``expand(name)`` makes a model field per-world (domain
    randomization) and returns its live ``[N, ...]`` values.
    """

    def __init__(self, model: str | mujoco.MjModel, num_envs: int, device="cpu", frame_skip: int = 1,
                 num_threads: int = 1, post_constraint: bool = False):
        if torch.device(device).type not in DEVICES:
            raise UserError("the mujoco_cpu backend simulates on the CPU; use sim_device=cpu "
                            "(the learner may still run on CUDA: learner_device=cuda)")
        if num_threads < 1:
            raise UserError(f"sim threads must be >= 1, got {num_threads}")
        if not hasattr(mujoco, "batch"):
            raise UserError(f"the mujoco_cpu backend needs MuJoCo >= 4 (mujoco.batch); this is {mujoco.__version__}")
        self.model = load_model(model)
        self.num_envs, self.device = int(num_envs), torch.device("cpu")
        self.frame_skip = int(frame_skip)
        self.post_constraint = post_constraint
        self.batch = mujoco.batch.Batch(self.model, self.num_envs, nthread=num_threads, persistent=post_constraint)
        self.dt = self.model.opt.timestep * self.frame_skip  # control period [s]
        m = self.model
        self.STATE = NamedLayout(qpos=m.nq, qvel=m.nv)  # per model: get_state()["x"] = [qpos | qvel]
        self.CONTROLS = NamedLayout(ctrl=m.nu)
        self._tensors: dict[str, torch.Tensor] = {}
        self._state_fields = tuple(f for f in _STATE_FIELDS if self.bind(f).size)
        self._row_fields = self._state_fields + (("mocap_pos", "mocap_quat") if self.model.nmocap else ())
        self.qpos, self.qvel, self.ctrl = self.t("qpos"), self.t("qvel"), self.t("ctrl")
        if post_constraint:
            self._data = mujoco.MjData(self.model)
            self._cfrc_ext = np.zeros((self.num_envs, self.model.nbody, 6))
        self.batch.reset()
        self._renderer = None  # made on the first render_frame
        self.render_camera: str | None = None  # a camera of the model to render through (None: a tracking one)

    # ---- views ----------------------------------------------------------------------------------
    def bind(self, name: str) -> np.ndarray:
        """Live ``[N, ...]`` view of an ``MjData`` field (state fields writable, derived read-only)."""
        if name == "cfrc_ext" and self.post_constraint:
            return self._cfrc_ext
        return self.batch.bind(name)

    def t(self, name: str) -> torch.Tensor:
        """``bind(name)`` as a torch tensor sharing its memory."""
        if name not in self._tensors:
            with warnings.catch_warnings():  # derived fields are read-only arrays; the tensor is read only
                warnings.simplefilter("ignore", UserWarning)
                self._tensors[name] = torch.from_numpy(self.bind(name))
        return self._tensors[name]

    def expand(self, name: str) -> torch.Tensor:
        """Per-world values of model field ``name`` (``body_mass``, ``geom_friction``, ``opt.gravity``...),
        live ``[N, ...]``; call ``set_const`` after writing fields that ``mj_setConst`` reads."""
        return torch.from_numpy(self.batch.expand(name))

    def body(self, name: str):
        return self.batch.body(name)

    def joint(self, name: str):
        return self.batch.joint(name)

    # ---- physics --------------------------------------------------------------------------------
    def step(self, controls: torch.Tensor, positions: bool = False) -> None:
        """``controls: [N, nu]`` written to ``ctrl`` (MuJoCo clamps to ctrlrange), then ``frame_skip`` substeps.

        ``positions``: also compute the position stage (poses, Jacobian inputs, contacts) at the new state, in the
        same threaded call: what a ``forward`` after the step gives a reader of poses, without its velocity and
        acceleration stages or a second dispatch (the state is the same either way: ``forward`` writes no state)."""
        self.ctrl.copy_(controls)
        self.batch.step(nstep=self.frame_skip, stage=_POSITIONS if positions else _NO_STAGE)
        if self.post_constraint:
            self._post_constraint()

    def _post_constraint(self) -> None:
        # no batched mj_rnePostConstraint exists: per world, copy its MjData out of the persistent batch
        # (its derived fields are the last substep's, as gymnasium reads them) and run it there
        data, out = self._data, self._cfrc_ext
        for i in range(self.num_envs):
            self.batch.get_data(i, data)
            mujoco.mj_rnePostConstraint(self.model, data)
            out[i] = data.cfrc_ext

    def set_state_idx(self, env_ids: torch.Tensor, state: torch.Tensor) -> None:
        """Reset ``env_ids`` to the model defaults with ``state = [qpos | qvel]``, then ``mj_forward``. Mocap poses
        are no part of the state: the ones the task set are kept (``mj_resetData`` would restore the model's)."""
        ids = env_ids.cpu().numpy()
        nq = self.model.nq
        mocap = [(f, self.bind(f)[ids].copy()) for f in ("mocap_pos", "mocap_quat")] if self.model.nmocap else []
        self.batch.reset(ids, stage=mujoco.mjtStage.mjSTAGE_NONE)
        for f, kept in mocap:
            self.bind(f)[ids] = kept
        self.qpos[env_ids] = state[:, :nq].to(torch.float64)
        self.qvel[env_ids] = state[:, nq:].to(torch.float64)
        self.batch.forward(ids)
        if self.post_constraint:
            self._cfrc_ext[ids] = 0.0  # mj_forward alone does not compute it (gymnasium's reset neither)

    def get_state(self) -> dict[str, torch.Tensor]:
        state = {f: torch.from_numpy(self.bind(f).copy()) for f in self._state_fields}
        state["x"] = torch.cat([state["qpos"], state["qvel"]], 1)
        if self.post_constraint:
            state["cfrc_ext"] = torch.from_numpy(self._cfrc_ext.copy())
        return state

    def set_state(self, state: dict[str, torch.Tensor]) -> None:
        for f in self._state_fields:
            self.bind(f)[...] = state[f].numpy()
        self.batch.forward()
        if self.post_constraint:
            self._cfrc_ext[...] = state["cfrc_ext"].numpy()

    def state_rows(self, env_ids: torch.Tensor | None = None) -> torch.Tensor:
        """``[K, S]`` float64: the worlds' integration state (``get_state``'s fields) and mocap poses, one flat row per
        world: what ``set_state_rows`` continues from exactly."""
        ids = np.arange(self.num_envs) if env_ids is None else env_ids.cpu().numpy()
        parts = [self.bind(f)[ids].reshape(len(ids), -1) for f in self._row_fields]
        return torch.from_numpy(np.concatenate(parts, 1).astype(np.float64))

    def set_state_rows(self, env_ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Put ``state_rows`` back into the worlds ``env_ids`` (then ``mj_forward`` there)."""
        ids, rows, at = env_ids.cpu().numpy(), rows.to(torch.float64).cpu().numpy(), 0
        for f in self._row_fields:
            view = self.bind(f)
            size = view[0].size
            view[ids] = rows[:, at:at + size].reshape(len(ids), *view.shape[1:])
            at += size
        self.batch.forward(ids)
        if self.post_constraint:
            self._cfrc_ext[ids] = 0.0

    @property
    def state_row_size(self) -> int:
        return sum(self.bind(f)[0].size for f in self._row_fields)

    @property
    def can_render(self) -> bool:
        """Whether this machine can make an offscreen OpenGL context (tried once per process)."""
        from embodied.sim_backends.mujoco_cpu.render import gl_error

        return gl_error() is None

    def render_frame(self, env_idx: int = 0) -> np.ndarray:
        """RGB ``uint8 [H, W, 3]`` of world ``env_idx`` (the first call makes an offscreen GL context)."""
        if self._renderer is None:
            from embodied.sim_backends.mujoco_cpu.render import WorldRenderer

            self._renderer = WorldRenderer(self.model, camera=self.render_camera)
        return self._renderer.render(self.bind("qpos")[env_idx], self.bind("qvel")[env_idx])

    def finite(self) -> torch.Tensor:
        return torch.isfinite(self.qpos).all(1) & torch.isfinite(self.qvel).all(1)


class MujocoFactory(BackendFactory):
    """``mujoco_cpu`` builds any MJCF (a path or an XML string); ``models`` names the gymnasium assets
    the locomotion tasks use, which the backend conformance test builds."""

    devices = DEVICES

    def __init__(self, assets: tuple[str, ...]):
        super().__init__("mujoco_cpu", {})
        self.assets = assets

    @property
    def models(self) -> tuple[str, ...]:
        return self.assets

    def has_model(self, model: str) -> bool:
        return model in self.assets or model.lstrip().startswith("<") or model.endswith(".xml")

    def __call__(self, model: str, num_envs: int, device="cpu", **kwargs) -> MujocoBatch:
        if model in self.assets:
            model = gymnasium_asset(model)
        return MujocoBatch(model, num_envs, device, **kwargs)


def gymnasium_asset(name: str) -> str:
    """Path of an MJCF file shipped with gymnasium's MuJoCo environments."""
    import gymnasium.envs.mujoco as gm

    return os.path.join(os.path.dirname(gm.__file__), "assets", name)
