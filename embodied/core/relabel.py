"""Relabelling recorded episodes by a symmetry of a task suite: an episode of one instruction, its policy observations
re-expressed (the actions kept) as an episode of another instruction of the suite that the same motion carries out.
Mini-libero's cubes differ only in colour: a demonstration that put the red cube on the plate, with the red and the
green cube's entries swapped and the instruction saying green, is a demonstration of putting the green cube there.

A task that has such a relabelling offers it (``VecEnv.relabeller()``); learners that clone episodes add relabelled
copies of them to what they clone (``bc.relabel``, ``filtered-bc.relabel``)."""

from __future__ import annotations

import abc

import torch


class Relabeller(abc.ABC):
    """A suite's relabelling of whole episodes of policy observations."""

    @abc.abstractmethod
    def relabel(self, obs: torch.Tensor, episode: torch.Tensor,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``obs [T, D]``: the policy observations of whole episodes (``episode [T]``: each step's episode, numbered
        0..n-1, contiguous). Returns one relabelled copy of every episode, drawn at random, ``[T, D]``, and per
        episode whether it has one ``[n]`` (an episode without one comes back unchanged)."""


def relabelled_copies(relabeller: Relabeller, obs: torch.Tensor, episode: torch.Tensor, copies: int,
                      generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``copies`` relabelled copies of the episodes in ``obs [T, D]`` (``episode [T]`` numbered 0..n-1, contiguous),
    each copy of each episode drawn independently, episodes without one left out: the copies' observations
    ``[M, D]``, each row's source row in ``obs`` ``[M]`` (its action and reward are the source's) and its episode
    ``[M]`` (the copies' episodes numbered 0, 1, ..., contiguous)."""
    rows = torch.arange(len(episode), device=obs.device)
    n = int(episode.max()) + 1 if len(episode) else 0
    out, source, numbers = [obs[:0]], [rows[:0]], [episode[:0]]
    for c in range(copies):
        new, has = relabeller.relabel(obs, episode, generator)
        keep = has[episode]
        out.append(new[keep])
        source.append(rows[keep])
        numbers.append(episode[keep] + c * n)
    number = torch.cat(numbers)
    return torch.cat(out), torch.cat(source), torch.unique_consecutive(number, return_inverse=True)[1]
