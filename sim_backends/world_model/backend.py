"""A learned world model as a batched simulator, and the file a fitted model is kept in.

The state of a model env is the real task's observation, its groups concatenated in the order of the task's
observation space (``"policy"``, then ``"critic"`` where the task has it): the model predicts what the policy and
the critic would see next. Unlike a physics backend a model also predicts the reward and the end of an episode
(there is no physics to compute them from); the task on top (``embodied/tasks/world_model.py``) turns them into
reward terms and terminations like any other task."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from embodied.core.errors import UserError
from embodied.sim_backends.base import NamedLayout, TensorStateBackend
from embodied.sim_backends.world_model.ensemble import EnsembleConfig, ProbabilisticEnsemble

MODEL_FILE = "world_model.pt"
FORMAT = 1


class WorldModelSim(TensorStateBackend):
    """``num_envs`` imagined rollouts of ``network`` (a ``ProbabilisticEnsemble``). ``step(action)`` leaves the
    predicted ``reward [N]``, ``p_terminal [N]`` and ``disagreement [N]`` beside the state ``x [N, S]``."""

    def __init__(self, num_envs: int, device, network: ProbabilisticEnsemble | None = None, state_dim: int = 3,
                 act_dim: int = 1, generator: torch.Generator | None = None, deterministic: bool = False):
        self.num_envs, self.device = num_envs, torch.device(device)
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

    def step(self, controls: torch.Tensor) -> None:
        out = self.network.predict(self.x, controls, self.generator, self.deterministic)
        self.x = out["next_state"]
        self.reward, self.p_terminal, self.disagreement = out["reward"], out["p_terminal"], out["disagreement"]

    # a sampled model: the generator's state is part of the simulation (the task shares its own generator here)
    def get_state(self) -> dict[str, torch.Tensor]:
        return {**super().get_state(), "rng": self.generator.get_state()}

    def set_state(self, state: dict[str, torch.Tensor]) -> None:
        super().set_state(state)
        if "rng" in state:
            self.generator.set_state(state["rng"])


def save_world_model(path: Path, network: ProbabilisticEnsemble, cfg: EnsembleConfig, task: str, task_config: dict,
                     starts: torch.Tensor, initial: torch.Tensor) -> Path:
    """Write a fitted model and the real states its episodes may start from (``starts``: any recorded state,
    ``initial``: recorded episode starts), atomically."""
    path = Path(path)
    payload = {"format": FORMAT, "kind": "ensemble", "task": task, "task_config": task_config,
               "config": asdict(cfg), "dims": [network.state_dim, network.act_dim],
               "state": {k: v.cpu() for k, v in network.state_dict().items()},
               "starts": starts.cpu(), "initial": initial.cpu()}
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
        if data.get("format") != FORMAT or data.get("kind") != "ensemble":
            raise ValueError(f"format {data.get('format')!r}, kind {data.get('kind')!r}")
        state_dim, act_dim = data["dims"]
        network = ProbabilisticEnsemble(state_dim, act_dim, EnsembleConfig(**data["config"]))
        network.load_state_dict(data["state"])
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's input
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"cannot read the world model {path}: {why}") from None
    return network.to(device).eval(), data
