"""``core/relabel.py``'s generic relabellings, exactly."""

import torch

from embodied.core.relabel import Chain, PlanarShift, Relabeller, signed, with_relabelled_copies


class _Negate(Relabeller):
    """A copy for even-numbered episodes only: their observations negated."""

    def relabel(self, obs, episode, generator):
        has = torch.arange(int(episode.max()) + 1) % 2 == 0
        return torch.where(has[episode][:, None], -obs, obs), has[episode], None


class _Flip(Relabeller):
    """A copy for odd-numbered episodes only: observations as they are, the action's second entry negated."""

    def relabel(self, obs, episode, generator):
        has = (episode % 2 == 1)
        sign = torch.ones(len(episode), 2)
        sign[has, 1] = -1.0
        return obs, has, sign


class _Prefix(Relabeller):
    """A copy of every episode but the last that keeps its first step only, its observations doubled."""

    def relabel(self, obs, episode, generator):
        first = torch.cat([torch.tensor([True]), episode[1:] != episode[:-1]])
        return obs * 2, first & (episode < episode.max()), None


def test_planar_shift_moves_each_episode_by_one_offset():
    obs = torch.arange(24, dtype=torch.float32).view(6, 4)
    episode = torch.tensor([0, 0, 1, 1, 1, 2])
    out, has, sign = PlanarShift([0, 2], [1, 3], 0.5).relabel(obs, episode, torch.Generator().manual_seed(0))
    offset = (torch.rand(3, 2, generator=torch.Generator().manual_seed(0)) * 2 - 1) * 0.5  # the same draws
    want = obs.clone()
    want[:, [0, 2]] += offset[episode, :1]
    want[:, [1, 3]] += offset[episode, 1:]
    assert torch.equal(out, want) and has.tolist() == [True] * 6 and sign is None
    assert (out - obs).abs().max() <= 0.5
    only_x = PlanarShift([0], [1], 0.5).relabel(obs, episode, torch.Generator().manual_seed(0))[0]
    assert torch.equal(only_x[:, 2:], obs[:, 2:])  # entries not named stay


def test_chain_applies_each_and_has_a_copy_where_any_gives_one():
    obs = torch.ones(5, 2)
    episode = torch.tensor([0, 1, 1, 2, 3])
    shift = PlanarShift([0], [1], 0.1)
    out, keep, _ = Chain(_Negate(), shift).relabel(obs, episode, torch.Generator().manual_seed(1))
    negated, _, _ = _Negate().relabel(obs, episode, None)
    want, _, _ = shift.relabel(negated, episode, torch.Generator().manual_seed(1))
    assert torch.equal(out, want) and keep.tolist() == [True] * 5
    assert Chain(_Negate()).relabel(obs, episode, None)[1].tolist() == [True, False, False, True, False]
    # a prefix stays a prefix where another gives a whole copy; an episode only the other copies stays whole
    assert Chain(_Prefix(), shift).relabel(obs, episode, torch.Generator())[1].tolist() == [True, True, False,
                                                                                           True, True]
    assert Chain(_Negate(), _Prefix()).relabel(obs, episode, None)[1].tolist() == [True, True, False, True, False]


def test_with_relabelled_copies_appends_numbered_copies_and_repeats_columns():
    obs = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    episode = torch.tensor([0, 0, 1, 2])
    action = torch.tensor([10.0, 20.0, 30.0, 40.0])
    out, ep, act = with_relabelled_copies(_Negate(), obs, episode, 2, None, action)
    # episodes 0 and 2 have copies, twice: numbered 3, 4 (first copy) and 5, 6 (second)
    assert out.flatten().tolist() == [1, 2, 3, 4, -1, -2, -4, -1, -2, -4]
    assert ep.tolist() == [0, 0, 1, 2, 3, 3, 4, 5, 5, 6]
    assert act.tolist() == [10, 20, 30, 40, 10, 20, 40, 10, 20, 40]
    # prefix copies: the first step of episodes 0 and 1, numbered on
    out, ep, act = with_relabelled_copies(_Prefix(), obs, episode, 1, None, action)
    assert out.flatten().tolist() == [1, 2, 3, 4, 2, 6] and ep.tolist() == [0, 0, 1, 2, 3, 4]
    assert act.tolist() == [10, 20, 30, 40, 10, 30]


def test_relabelled_actions_take_their_copies_signs():
    obs = torch.zeros(4, 1)
    episode = torch.tensor([0, 1, 1, 2])
    action = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    out, ep, act = with_relabelled_copies(_Flip(), obs, episode, 1, None, action)
    assert ep.tolist() == [0, 1, 1, 2, 3, 3]
    assert act.tolist() == [[1, 2], [3, 4], [5, 6], [7, 8], [3, -4], [5, -6]]
    # chunks of actions [T, H, A] and flattened [T, H * A]: each action of a row's chunk signed alike
    chunk = torch.arange(24, dtype=torch.float32).view(4, 3, 2)
    sign = torch.tensor([[1.0, -1.0], [-1.0, 1.0], [1.0, 1.0], [-1.0, -1.0]])
    assert torch.equal(signed(chunk, sign), chunk * sign[:, None])
    assert torch.equal(signed(chunk.flatten(1), sign), (chunk * sign[:, None]).flatten(1))
    assert signed(chunk, None) is chunk
    # Chain: the signs of the relabellings that gave a copy multiply; an episode no flip gave keeps its actions
    _, keep, sign = Chain(_Flip(), _Negate()).relabel(obs, episode, None)
    assert keep.tolist() == [True, True, True, True] and sign[:, 1].tolist() == [1, -1, -1, 1]
    _, _, sign = Chain(_Flip(), _Flip()).relabel(obs, episode, None)
    assert sign[:, 1].tolist() == [1, 1, 1, 1]
    assert Chain(_Negate(), PlanarShift([0], [0], 0.1)).relabel(obs, episode, torch.Generator())[2] is None
