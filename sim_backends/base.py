"""Sim backend contract (DESIGN.md): physics only. Batched state, ``step(controls)``, reset of a
subset of envs by index, state get/set for checkpoints. No rewards here.

A backend is registered in ``SIM_BACKENDS`` as a factory ``factory(model, num_envs, device, **kwargs) ->
SimBackend`` with a ``models`` attribute (the model names it builds); each backend subpackage registers its
own factory when imported, and ``embodied.sim_backends`` imports them all. Tasks build their sim with
``make_backend`` on a backend ``choose_backend`` picks from their ``TaskSpec.backends``.

State, controls and per-env parameters are flat ``[N, D]`` tensors whose columns a ``NamedLayout`` names:
code outside a backend reads and writes them through the names (``layout.view(x, "pos_w")``), never
through column numbers.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Mapping
from typing import ClassVar

import torch

from embodied.core.errors import UserError
from embodied.core.registry import SIM_BACKENDS, TASKS


class NamedLayout:
    """An ordered mapping ``name -> width`` laying out the last dimension of a tensor.

    ``NamedLayout(pos_w=3, quat_wb=4)`` names columns ``0:3`` and ``3:7`` of a ``[..., 7]`` tensor;
    ``view`` returns a view (writes go through to the tensor), ``pack`` builds a tensor from its parts.
    """

    def __init__(self, **widths: int):
        if not widths:
            raise ValueError("a layout needs at least one field")
        self._slices: dict[str, slice] = {}
        start = 0
        for name, width in widths.items():
            if not isinstance(width, int) or isinstance(width, bool) or width < 1:
                raise ValueError(f"width of {name!r} must be a positive int, got {width!r}")
            self._slices[name] = slice(start, start + width)
            start += width
        self.dim = start

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._slices)

    def slice(self, name: str) -> slice:
        try:
            return self._slices[name]
        except KeyError:
            raise KeyError(f"no field {name!r} in layout; fields: {', '.join(self._slices)}") from None

    def width(self, name: str) -> int:
        s = self.slice(name)
        return s.stop - s.start

    def view(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """``x[..., field]``: a ``[..., width]`` view of ``x: [..., dim]``."""
        s = self.slice(name)
        if x.shape[-1] != self.dim:
            raise ValueError(f"last dimension {x.shape[-1]} != layout dim {self.dim}")
        return x[..., s]

    def column(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """``x[..., i]`` for a width-1 field: a ``[...]`` view."""
        s = self.slice(name)
        if s.stop - s.start != 1:
            raise ValueError(f"field {name!r} has width {s.stop - s.start}; column() needs width 1")
        if x.shape[-1] != self.dim:
            raise ValueError(f"last dimension {x.shape[-1]} != layout dim {self.dim}")
        return x[..., s.start]

    def pack(self, **parts: torch.Tensor) -> torch.Tensor:
        """Concatenate ``[..., width]`` parts, one per field (all of them), in layout order."""
        if set(parts) != set(self._slices):
            missing, extra = set(self._slices) - set(parts), set(parts) - set(self._slices)
            raise ValueError(f"pack needs exactly the fields {self.names}; missing {sorted(missing)}, "
                             f"unknown {sorted(extra)}")
        for name, part in parts.items():
            if part.shape[-1] != self.width(name):
                raise ValueError(f"part {name!r} has last dimension {part.shape[-1]}, field width {self.width(name)}")
        return torch.cat([parts[name] for name in self._slices], -1)

    def items(self) -> Iterator[tuple[str, slice]]:
        return iter(self._slices.items())

    def __iter__(self) -> Iterator[str]:
        return iter(self._slices)

    def __len__(self) -> int:
        return len(self._slices)

    def __contains__(self, name: object) -> bool:
        return name in self._slices

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NamedLayout) and self._slices == other._slices

    def __hash__(self) -> int:
        return hash(tuple((n, s.start, s.stop) for n, s in self._slices.items()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={s.stop - s.start}" for n, s in self._slices.items())
        return f"NamedLayout({fields})"


class SimBackend(abc.ABC):
    """A batch of ``num_envs`` simulations on ``device``.

    ``STATE`` names the columns of the state tensor ``get_state()["x"]`` (``[N, STATE.dim]``), ``CONTROLS``
    those of ``step``'s controls; ``PARAMS`` those of the per-env parameter tensor where the backend has one.
    """

    STATE: ClassVar[NamedLayout]
    CONTROLS: ClassVar[NamedLayout]
    PARAMS: ClassVar[NamedLayout | None] = None
    num_envs: int
    device: torch.device

    @property
    def num_controls(self) -> int:
        return self.CONTROLS.dim

    @abc.abstractmethod
    def step(self, controls: torch.Tensor) -> None:
        """Advance physics one control step. ``controls: [N, num_controls]`` in physical units."""

    @abc.abstractmethod
    def set_state_idx(self, env_ids: torch.Tensor, state: torch.Tensor) -> None:
        """Overwrite the physical state of ``env_ids`` (a subset reset)."""

    @abc.abstractmethod
    def get_state(self) -> dict[str, torch.Tensor]:
        """Copies of everything that defines the simulation (state and per-env parameters)."""

    @abc.abstractmethod
    def set_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what ``get_state`` returned."""

    def finite(self) -> torch.Tensor:
        """``[N]`` bool: state of each env is finite (numerical faults are caught upstream)."""
        return torch.isfinite(self.get_state()["x"]).all(1)


class TensorStateBackend(SimBackend):
    """A backend whose whole state is the tensor ``self.x [N, STATE.dim]``: the state hooks, once."""

    x: torch.Tensor

    def set_state_idx(self, env_ids: torch.Tensor, state: torch.Tensor) -> None:
        self.x[env_ids] = state

    def get_state(self) -> dict[str, torch.Tensor]:
        return {"x": self.x.clone()}

    def set_state(self, state: dict[str, torch.Tensor]) -> None:
        self.x = state["x"].clone().to(self.device)


def _unknown_model(backend: str, model: str, models) -> UserError:
    return UserError(f"sim backend {backend!r} has no model {model!r}; its models: {', '.join(models)}")


class BackendFactory:
    """``factory(model, num_envs, device, **kwargs) -> SimBackend`` over a table ``model -> builder``,
    ``builder(num_envs, device, **kwargs)``; ``factory.models`` lists the model names, ``factory.devices`` the
    device types its simulations run on."""

    devices: tuple[str, ...] = ("cpu", "cuda")

    def __init__(self, name: str, builders: Mapping[str, Callable[..., SimBackend]]):
        self.name = name
        self._builders = dict(builders)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self._builders)

    def has_model(self, model: str) -> bool:
        return model in self._builders

    def __call__(self, model: str, num_envs: int, device: str | torch.device, **kwargs) -> SimBackend:
        if model not in self._builders:
            raise _unknown_model(self.name, model, self.models)
        return self._builders[model](num_envs, device, **kwargs)

    def __repr__(self) -> str:
        return f"BackendFactory({self.name!r}, models={self.models})"


def make_backend(name: str, model: str, num_envs: int, device: str | torch.device, **kwargs) -> SimBackend:
    """Build ``model`` on the registered backend ``name``; an unknown backend or model is a ``UserError``."""
    factory = SIM_BACKENDS.get(name)
    if not factory.has_model(model):
        raise _unknown_model(name, model, factory.models)
    sim = factory(model, num_envs, device, **kwargs)
    if not isinstance(sim, SimBackend):
        raise TypeError(f"sim backend {name!r} built {type(sim).__name__} for {model!r}, not a SimBackend")
    return sim


def choose_backend(task: str, requested: str | None = None) -> str:
    """The backend a ``task`` runs on: ``requested`` if its ``TaskSpec.backends`` lists it, else (None) the
    first listed. A backend the task does not list is a ``UserError``."""
    backends = TASKS.get(task).backends
    if not requested:
        return backends[0]
    if requested not in backends:
        raise UserError(f"task {task!r} does not run on sim backend {requested!r}; its backends: "
                        f"{', '.join(backends)}")
    return requested
