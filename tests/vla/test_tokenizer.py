"""The action tokenizer (OpenVLA's percentile bins) and the VLA's own copy of it."""

from __future__ import annotations

import torch

from embodied.vla.model import VLAPolicy
from embodied.vla.tokenizer import ActionTokenizer


def test_exact_bins_and_centres():
    tok = ActionTokenizer(torch.tensor([-1.0]), torch.tensor([1.0]), bins=4)
    a = torch.tensor([[-1.0], [-0.51], [-0.49], [0.0], [0.99], [1.0], [3.0]])
    assert tok.encode(a).squeeze(1).tolist() == [0, 0, 1, 2, 3, 3, 3]
    assert tok.decode(torch.tensor([[0], [1], [2], [3]])).squeeze(1).tolist() == [-0.75, -0.25, 0.25, 0.75]


def test_round_trip_error_is_at_most_half_a_bin():
    g = torch.Generator().manual_seed(0)
    actions = torch.randn(5000, 7, generator=g) * torch.tensor([0.1, 0.3, 1.0, 2.0, 0.5, 0.05, 1.0])
    tok = ActionTokenizer.fit(actions, bins=256)
    inside = actions.clamp(tok.low, tok.high)  # the percentile range; outside it, actions are clipped
    err = (tok.decode(tok.encode(inside)) - inside).abs()
    half_bin = (tok.high - tok.low) / (2 * 256)
    assert (err <= half_bin * (1 + 1e-4)).all()
    assert torch.allclose(tok.low, torch.quantile(actions, 0.01, dim=0))
    assert torch.allclose(tok.high, torch.quantile(actions, 0.99, dim=0))


def test_constant_dimension_decodes_to_its_value():
    tok = ActionTokenizer.fit(torch.tensor([[0.3, 0.0], [0.3, 1.0], [0.3, 0.5]]), bins=256)
    assert torch.allclose(tok.decode(tok.encode(torch.tensor([[0.3, 0.5]])))[:, 0], torch.tensor([0.3]), atol=3e-3)


def test_policy_tokenizer_matches_and_decoded_bins_encode_back():
    pi = VLAPolicy(10 + 384, 7, [10, 384])
    g = torch.Generator().manual_seed(1)
    pi.fit_action_range(torch.rand(1000, 7, generator=g) * 1.6 - 0.8)
    tok = pi.tokenizer()
    a = torch.rand(64, 7, generator=g) * 2 - 1
    assert torch.equal(pi.encode(a), tok.encode(a))
    assert torch.allclose(pi.decode(pi.encode(a)), tok.decode(tok.encode(a)))
    bins = torch.randint(256, (64, 7), generator=g)
    assert torch.equal(pi.encode(pi.decode(bins)), bins)  # what makes log_prob(action) exact
