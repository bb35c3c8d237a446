"""Symmetries of a task: a finite group acting on every observation group and on the action by
signed permutations, ``x'[..., j] = sign[j] * x[..., index[j]]``.

A task whose dynamics, reward and initial-state distribution are invariant under such a group
declares it (``VecEnv.symmetry_group()``); learners can then augment replay batches with random
group elements, and a policy can be made exactly equivariant (``embodied.policies.networks.GroupMLP``
inside the off-policy actors). For the quadrotor the group is the mirror images that
keep the rotor spin pattern, and an equivariant policy has the set-point as its hover point by
construction instead of hovering off to one side by whatever its function-approximation error is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

Signed = tuple[Sequence[int], Sequence[float]]  # (index, sign) of one element on one tensor


class SymmetryGroup:
    """``elements[g][key] = (index, sign)`` for each tensor ``key`` (obs groups and ``"action"``);
    element 0 must be the identity. Tensors are stacked ``[G, D]`` per key."""

    def __init__(self, elements: Sequence[Mapping[str, Signed]], device: torch.device | str = "cpu"):
        if not elements:
            raise ValueError("a symmetry group needs at least the identity")
        self.elements = [{k: (list(map(int, i)), list(map(float, s))) for k, (i, s) in e.items()} for e in elements]
        self.keys = tuple(self.elements[0])
        for k in self.keys:
            idx, sign = self.elements[0][k]
            if idx != list(range(len(idx))) or any(s != 1.0 for s in sign):
                raise ValueError(f"element 0 must be the identity (key {k!r})")
        self.device = torch.device(device)
        self.index = {k: torch.tensor([e[k][0] for e in self.elements], device=self.device) for k in self.keys}
        self.sign = {k: torch.tensor([e[k][1] for e in self.elements], device=self.device) for k in self.keys}
        # inverse of each element: x[index[j]] = sign[j] * x'[j]
        inv_index = {k: torch.argsort(v, dim=1) for k, v in self.index.items()}
        self.inv_index = inv_index
        self.inv_sign = {k: self.sign[k].gather(1, inv_index[k]) for k in self.keys}

    @property
    def size(self) -> int:
        return len(self.elements)

    def to(self, device: torch.device | str) -> SymmetryGroup:
        return self if torch.device(device) == self.device else SymmetryGroup(self.elements, device)

    def apply(self, key: str, x: torch.Tensor, g: torch.Tensor | int) -> torch.Tensor:
        """Element ``g`` (an int, or one element per row ``[B]``) acting on ``x [B, D]``."""
        if isinstance(g, int):
            return x[..., self.index[key][g]] * self.sign[key][g]
        return x.gather(-1, self.index[key][g]) * self.sign[key][g]

    def compose(self, g: int, h: int) -> int:
        """The element ``g o h`` (act with ``h``, then ``g``)."""
        want = {}
        for k in self.keys:
            (ig, sg), (ih, sh) = self.elements[g][k], self.elements[h][k]
            want[k] = ([ih[i] for i in ig], [sg[j] * sh[i] for j, i in enumerate(ig)])
        for e, elem in enumerate(self.elements):
            if all(elem[k] == want[k] for k in self.keys):
                return e
        raise ValueError("the elements are not closed under composition")

    def inverse(self, g: int) -> int:
        return next(h for h in range(self.size) if self.compose(g, h) == 0)

    def to_spec(self) -> list[dict[str, list]]:
        return [{k: [i, s] for k, (i, s) in e.items()} for e in self.elements]


def mirror_vector(m: Sequence[float], offset: int) -> Signed:
    """A polar 3-vector at ``offset`` under the diagonal reflection/rotation ``diag(m)``."""
    return [offset + i for i in range(3)], list(m)


def mirror_axial(m: Sequence[float], offset: int) -> Signed:
    """An axial 3-vector (angular velocity, torque) under ``diag(m)``: ``det(M) M w``."""
    det = m[0] * m[1] * m[2]
    return [offset + i for i in range(3)], [det * x for x in m]


def mirror_rotation(m: Sequence[float], offset: int) -> Signed:
    """A row-major 3x3 rotation matrix ``R`` under ``diag(m)``: ``M R M``."""
    return [offset + i for i in range(9)], [m[i // 3] * m[i % 3] for i in range(9)]


def concat(*parts: Signed) -> Signed:
    index: list[int] = []
    sign: list[float] = []
    for i, s in parts:
        index += list(i)
        sign += list(s)
    return index, sign


def permutation(perm: Sequence[int], offset: int = 0, repeats: int = 1) -> Signed:
    """``repeats`` consecutive blocks, each permuted by ``perm``."""
    n = len(perm)
    return [offset + r * n + p for r in range(repeats) for p in perm], [1.0] * (n * repeats)
