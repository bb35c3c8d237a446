"""``core/relabel.py``'s generic relabellings, exactly."""

import torch

from embodied.core.relabel import Chain, PlanarShift, Relabeller, with_relabelled_copies


class _Negate(Relabeller):
    """A copy for even-numbered episodes only: their observations negated."""

    def relabel(self, obs, episode, generator):
        has = torch.arange(int(episode.max()) + 1) % 2 == 0
        return torch.where(has[episode][:, None], -obs, obs), has[episode]


class _Prefix(Relabeller):
    """A copy of every episode but the last that keeps its first step only, its observations doubled."""

    def relabel(self, obs, episode, generator):
        first = torch.cat([torch.tensor([True]), episode[1:] != episode[:-1]])
        return obs * 2, first & (episode < episode.max())


def test_planar_shift_moves_each_episode_by_one_offset():
    obs = torch.arange(24, dtype=torch.float32).view(6, 4)
    episode = torch.tensor([0, 0, 1, 1, 1, 2])
    out, has = PlanarShift([0, 2], [1, 3], 0.5).relabel(obs, episode, torch.Generator().manual_seed(0))
    offset = (torch.rand(3, 2, generator=torch.Generator().manual_seed(0)) * 2 - 1) * 0.5  # the same draws
    want = obs.clone()
    want[:, [0, 2]] += offset[episode, :1]
    want[:, [1, 3]] += offset[episode, 1:]
    assert torch.equal(out, want) and has.tolist() == [True] * 6
    assert (out - obs).abs().max() <= 0.5
    only_x = PlanarShift([0], [1], 0.5).relabel(obs, episode, torch.Generator().manual_seed(0))[0]
    assert torch.equal(only_x[:, 2:], obs[:, 2:])  # entries not named stay


def test_chain_applies_each_and_has_a_copy_where_any_gives_one():
    obs = torch.ones(5, 2)
    episode = torch.tensor([0, 1, 1, 2, 3])
    shift = PlanarShift([0], [1], 0.1)
    out, keep = Chain(_Negate(), shift).relabel(obs, episode, torch.Generator().manual_seed(1))
    negated, _ = _Negate().relabel(obs, episode, None)
    want, _ = shift.relabel(negated, episode, torch.Generator().manual_seed(1))
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
