"""A learned world model as a batched simulator, and the file a fitted model is kept in.

Two kinds: ``WorldModelSim`` steps an ensemble, ``RSSMSim`` an RSSM (image tasks). For the ensemble the state of a
model env is the real task's observation, its groups concatenated in the order of the task's
observation space (``"policy"``, then ``"critic"`` where the task has it): the model predicts what the policy and
the critic would see next. Unlike a physics backend a model also predicts the reward and the end of an episode
(there is no physics to compute them from); the task on top (``embodied/tasks/world_model.py``) turns them into
reward terms and terminations like any other task."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from embodied.core.base import resolve_device
from embodied.core.errors import UserError
from embodied.sim_backends.base import NamedLayout, TensorStateBackend
from embodied.sim_backends.world_model.ensemble import EnsembleConfig, ProbabilisticEnsemble
from embodied.sim_backends.world_model.rssm import RSSM, RSSMConfig

MODEL_FILE = "world_model.pt"
FORMAT = 1


class SampledBackend(TensorStateBackend):
    """A sampled model: its generator's state is part of the simulation (a task hands it its own generator)."""

    generator: torch.Generator

    def get_state(self) -> dict[str, torch.Tensor]:
        return {**super().get_state(), "rng": self.generator.get_state()}

    def set_state(self, state: dict[str, torch.Tensor]) -> None:
        super().set_state(state)
        if "rng" in state:
            self.generator.set_state(state["rng"])


class WorldModelSim(SampledBackend):
    """``num_envs`` imagined rollouts of ``network`` (a ``ProbabilisticEnsemble``). ``step(action)`` leaves the
    predicted ``reward [N]``, ``p_terminal [N]`` and ``disagreement [N]`` beside the state ``x [N, S]``."""

    def __init__(self, num_envs: int, device, network: ProbabilisticEnsemble | None = None, state_dim: int = 3,
                 act_dim: int = 1, generator: torch.Generator | None = None, deterministic: bool = False):
        self.num_envs, self.device = num_envs, resolve_device(device)
        if network is None:  # an untrained model (the backend factory's default build)
            network = ProbabilisticEnsemble(state_dim, act_dim, EnsembleConfig(hidden=[32, 32]))
        self.network = network.to(self.device)
        self.STATE = NamedLayout(state=network.state_dim)
        self.CONTROLS = NamedLayout(action=network.act_dim)
        self.generator = generator if generator is not None else torch.Generator(device=self.device)
        self.deterministic = deterministic
        self.x = torch.zeros(num_envs, network.state_dim, device=self.device)
        self.reward = torch.zeros(num_envs, device=self.device)
        self.p_terminal = torch.zeros(num_envs, device=self.device)
        self.disagreement = torch.zeros(num_envs, device=self.device)
        self.disagreement_dims: torch.Tensor | None = None  # the state entries disagreement is measured on (all)

    def step(self, controls: torch.Tensor) -> None:
        out = self.network.predict(self.x, controls, self.generator, self.deterministic, self.disagreement_dims)
        self.x = out["next_state"]
        self.reward, self.p_terminal, self.disagreement = out["reward"], out["p_terminal"], out["disagreement"]


class RSSMSim(SampledBackend):
    """``num_envs`` imagined rollouts of an ``RSSM``: the state is its features ``x = [deter | stoch]``; a step
    samples the prior (its mode with ``deterministic``) and decodes the observation ``obs [N, obs_dim]``, the
    reward and the termination probability. There is one model, so ``disagreement`` is 0."""

    def __init__(self, num_envs: int, device, network: RSSM | None = None, act_dim: int = 1,
                 generator: torch.Generator | None = None, deterministic: bool = False):
        self.num_envs, self.device = num_envs, resolve_device(device)
        if network is None:  # an untrained small model of a 3-vector (the backend factory's default build)
            network = RSSM(act_dim, RSSMConfig(deter=32, hidden=16, stoch=4, classes=4, units=16), vector=3)
        self.network = network.to(self.device).eval()
        c = network.cfg
        self.STATE = NamedLayout(deter=c.deter, stoch=c.stoch * c.classes)
        self.CONTROLS = NamedLayout(action=network.act_dim)
        self.generator = generator if generator is not None else torch.Generator(device=self.device)
        self.deterministic = deterministic
        self.x = torch.zeros(num_envs, self.STATE.dim, device=self.device)
        self.obs = torch.zeros(num_envs, network.image_dim + network.vector, device=self.device)
        self.reward = torch.zeros(num_envs, device=self.device)
        self.p_terminal = torch.zeros(num_envs, device=self.device)
        self.disagreement = torch.zeros(num_envs, device=self.device)

    @torch.no_grad()
    def step(self, controls: torch.Tensor) -> None:
        net, d = self.network, self.network.cfg.deter
        state, _ = net.img_step({"deter": self.x[:, :d], "stoch": self.x[:, d:]}, controls, self.generator,
                                sample=not self.deterministic)
        self.x = net.feat(state)
        self.obs = net.decode(self.x)
        self.reward = net.reward(self.x)
        self.p_terminal = 1.0 - torch.sigmoid(net.cont_head(self.x).squeeze(-1))


def save_world_model(path: Path, network: ProbabilisticEnsemble | RSSM, cfg, task: str, task_config: dict,
                     starts: torch.Tensor, initial: torch.Tensor, **extra) -> Path:
    """Write a fitted model and where its episodes may start, atomically. Ensemble: ``starts`` are recorded real
    states, ``initial`` recorded episode starts. RSSM: ``starts`` are latent states after a real context and
    ``extra`` holds ``start_obs`` (the real observation there), ``image_group`` and ``frame_channels``."""
    path = Path(path)
    kind = "rssm" if isinstance(network, RSSM) else "ensemble"
    dims = [network.act_dim] if kind == "rssm" else [network.state_dim, network.act_dim]
    payload = {"format": FORMAT, "kind": kind, "task": task, "task_config": task_config,
               "config": asdict(cfg), "dims": dims,
               "state": {k: v.cpu() for k, v in network.state_dict().items()},
               "starts": starts.cpu(), "initial": initial.cpu(),
               **{k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in extra.items()}}
    if kind == "rssm":
        payload.update(image=list(network.image) if network.image else None, vector=network.vector)
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)
    return path


def load_world_model(where: str | Path, device="cpu") -> tuple[ProbabilisticEnsemble, dict]:
    """A fitted model from ``world_model.pt`` or a run directory holding one; a missing or unreadable file is a
    ``UserError``. Returns the network (eval mode) and the file's metadata (task, starts, ...)."""
    path = Path(where)
    if path.is_dir():
        path = path / MODEL_FILE
    if not str(where):
        raise UserError("a world-model env needs model=PATH: a world_model.pt, or the run directory of a "
                        "wm:<task> training run")
    if not path.is_file():
        raise UserError(f"no world model at {path} (model= takes a world_model.pt or a run directory holding one)")
    try:
        data = torch.load(path, map_location=device, weights_only=True)
        if data.get("format") != FORMAT or data.get("kind") not in ("ensemble", "rssm"):
            raise ValueError(f"format {data.get('format')!r}, kind {data.get('kind')!r}")
        if data["kind"] == "rssm":
            image = tuple(data["image"]) if data["image"] else None
            network = RSSM(data["dims"][0], RSSMConfig(**data["config"]), image=image, vector=data["vector"])
        else:
            state_dim, act_dim = data["dims"]
            network = ProbabilisticEnsemble(state_dim, act_dim, EnsembleConfig(**data["config"]))
        network.load_state_dict(data["state"])
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's input
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"cannot read the world model {path}: {why}") from None
    return network.to(device).eval(), data
