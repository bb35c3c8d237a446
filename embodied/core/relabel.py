"""Relabelling recorded episodes by a symmetry of a task suite: an episode of one instruction, its policy observations
re-expressed (the actions kept) as an episode of another instruction of the suite that the same motion carries out.
Mini-libero's cubes differ only in colour: a demonstration that put the red cube on the plate, with the red and the
green cube's entries swapped and the instruction saying green, is a demonstration of putting the green cube there.

A relabelling may also map the actions, by a sign per action entry (a reflection of the scene: a mirrored
episode's world-frame motions mirrored too); it keeps them where it does not.

A task that has such a relabelling offers it (``VecEnv.relabeller()``); learners that clone episodes add relabelled
copies of them to what they clone (``bc.relabel``, ``filtered-bc.relabel``)."""

from __future__ import annotations

import abc

import torch


class Relabeller(abc.ABC):
    """A suite's relabelling of recorded episodes of policy observations."""

    @abc.abstractmethod
    def relabel(self, obs: torch.Tensor, episode: torch.Tensor,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``obs [T, D]``: the policy observations of whole episodes (``episode [T]``: each step's episode, numbered
        0..n-1, contiguous). Returns one relabelled copy of every episode, drawn at random, ``[T, D]``; the rows of it
        that stand ``[T]``: all of an episode's rows where its copy is the whole episode, its first rows where the
        copy is a prefix of it (what the episode had done by then is a task of its own), none where the episode has
        no copy; and the sign of each action entry in each row's copy ``[T, A]`` (+-1: the copy's action is the
        episode's times it), or None where every copy keeps its episode's actions."""


def signed(action: torch.Tensor, sign: torch.Tensor | None) -> torch.Tensor:
    """``action [T, ..., A]`` (an action, or a chunk of them ``[T, H, A]`` or flattened ``[T, H * A]``) with each
    row's entries times its ``sign [T, A]`` (None: as it is)."""
    if sign is None:
        return action
    return (action.reshape(len(action), -1, sign.shape[1]) * sign[:, None].to(action.dtype)).reshape(action.shape)


def with_relabelled_copies(relabeller: Relabeller, obs: torch.Tensor, episode: torch.Tensor, copies: int,
                           generator: torch.Generator, action: torch.Tensor | None = None,
                           *columns: torch.Tensor | None) -> tuple:
    """Whole episodes (``obs [T, D]``, ``episode [T]`` numbered 0..n-1, contiguous) with ``copies`` relabelled copies
    of each appended (the rows of each that stand), each copy drawn independently, episodes without one left out:
    ``(obs, episode, action, *columns)`` enlarged, the copies' episodes numbered on after the sources' (contiguous),
    ``action`` (each row's action or its chunk of them; None stays None) as the relabelling maps it, each of
    ``columns`` (a target that is not an action, a group; None stays None) repeating its source row's values."""
    rows = torch.arange(len(episode), device=obs.device)
    n = int(episode.max()) + 1 if len(episode) else 0
    out, source, numbers, acts = [obs], [], [episode[:0]], [action]
    for c in range(copies):
        new, keep, sign = relabeller.relabel(obs, episode, generator)
        out.append(new[keep])
        source.append(rows[keep])
        numbers.append(episode[keep] + c * n)
        if action is not None:
            acts.append(signed(action[keep], sign[keep] if sign is not None else None))
    source = torch.cat(source) if source else rows[:0]
    number = torch.unique_consecutive(torch.cat(numbers), return_inverse=True)[1] + n
    return (torch.cat(out), torch.cat([episode, number]), torch.cat(acts) if action is not None else None,
            *(torch.cat([col, col[source]]) if col is not None else None for col in columns))


class PlanarShift(Relabeller):
    """The whole scene moved in the plane: every episode's absolute positions (the observation entries ``x`` and
    ``y``, index lists of equal length) shifted by one offset drawn per episode, uniform in ``+-half_width`` [m] on
    each axis; relative positions (an object from the grip point) are left as they are. For a task whose actions are
    motions in the world frame (a Cartesian end-effector delta), the episode's actions carry out the shifted scene's
    episode too, as far as the arm reaches: one demonstration becomes demonstrations at nearby layouts."""

    def __init__(self, x: list[int], y: list[int], half_width: float):
        if len(x) != len(y):
            raise ValueError(f"PlanarShift: as many x entries as y entries, got {len(x)} and {len(y)}")
        self.x, self.y = torch.tensor(x, dtype=torch.long), torch.tensor(y, dtype=torch.long)
        self.half_width = float(half_width)

    def relabel(self, obs: torch.Tensor, episode: torch.Tensor,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, None]:
        n = int(episode.max()) + 1 if len(episode) else 0
        offset = (torch.rand(n, 2, generator=generator, device=generator.device).to(obs.device) * 2 - 1) \
            * self.half_width
        out = obs.clone()
        out[:, self.x.to(obs.device)] += offset[episode, :1].to(obs.dtype)
        out[:, self.y.to(obs.device)] += offset[episode, 1:].to(obs.dtype)
        return out, torch.ones(len(episode), dtype=torch.bool, device=obs.device), None


class Chain(Relabeller):
    """Relabellings applied one after the other: a copy of each; an episode has a copy where any of them gives one,
    and it keeps the rows that every one of them that gave one keeps (a prefix stays a prefix); the actions' signs
    multiply."""

    def __init__(self, *relabellers: Relabeller):
        self.relabellers = relabellers

    def relabel(self, obs: torch.Tensor, episode: torch.Tensor,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        n = int(episode.max()) + 1 if len(episode) else 0
        gave = torch.zeros(n, dtype=torch.bool, device=obs.device)
        keep = torch.ones(len(episode), dtype=torch.bool, device=obs.device)
        sign = None
        for r in self.relabellers:
            obs, k, s = r.relabel(obs, episode, generator)
            g = torch.zeros(n, dtype=torch.long, device=obs.device).index_add_(0, episode, k.long()) > 0
            gave |= g
            keep &= k | ~g[episode]
            if s is not None:  # an episode without this one's copy keeps its actions
                s = torch.where(g[episode][:, None], s, torch.ones_like(s))
                sign = s if sign is None else sign * s
        return obs, keep & gave[episode], sign
