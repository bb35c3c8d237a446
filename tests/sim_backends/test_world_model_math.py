"""Exact values of the DreamerV3 tricks (symlog / symexp, two-hot, unimix, categorical KL with free bits and
balancing), and the ensemble recovering a known linear system."""

from __future__ import annotations

import math

import pytest
import torch

from embodied.sim_backends.world_model import EnsembleConfig, ProbabilisticEnsemble, fit
from embodied.sim_backends.world_model.tricks import (
    TwoHot,
    categorical_kl,
    kl_loss,
    straight_through_sample,
    symexp,
    symlog,
    unimix,
)


def test_symlog_and_symexp():
    x = torch.tensor([0.0, math.e - 1, -(math.e - 1), math.e ** 3 - 1])
    assert torch.allclose(symlog(x), torch.tensor([0.0, 1.0, -1.0, 3.0]))
    y = torch.linspace(-1e4, 1e4, 101, dtype=torch.float64)
    assert torch.allclose(symexp(symlog(y)), y, rtol=1e-12)
    assert torch.allclose(symexp(torch.tensor([2.0])), torch.tensor([math.e ** 2 - 1]))


def test_two_hot_weights_decode_and_loss():
    th = TwoHot(-2.0, 2.0, 5)  # bins -2, -1, 0, 1, 2 in symlog space
    y = torch.tensor([math.exp(0.25) - 1, 1000.0, -1000.0, 0.0])
    t = th.encode(y)
    assert torch.allclose(t[0], torch.tensor([0.0, 0.0, 0.75, 0.25, 0.0]))
    assert torch.allclose(t[1], torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0]))  # beyond the range: the end bin
    assert torch.allclose(t[2], torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0]))
    assert torch.allclose(t[3], torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0]))
    # a prediction whose softmax is the target decodes to the target (inside the range)
    assert torch.allclose(th.decode(torch.log(t[0].clamp_min(1e-30))), y[0], atol=1e-6)
    # uniform logits: cross-entropy log(5) whatever the target
    assert torch.allclose(th.loss(torch.zeros(4, 5), y), torch.full((4,), math.log(5)))
    # DreamerV3's bins
    assert TwoHot().bins.shape == (255,) and abs(float(TwoHot().bins[127])) < 1e-6


def test_unimix_and_categorical_kl():
    logp = unimix(torch.tensor([[math.log(3.0), 0.0]]), 0.01)
    assert torch.allclose(logp.exp(), torch.tensor([[0.99 * 0.75 + 0.005, 0.99 * 0.25 + 0.005]]))
    assert torch.isfinite(unimix(torch.tensor([[0.0, -1e9]]))).all()  # no class at probability 0
    p = torch.log(torch.tensor([[[0.5, 0.5]]]))  # [batch 1, groups 1, classes 2]
    q = torch.log(torch.tensor([[[0.25, 0.75]]]))
    expected = 0.5 * math.log(2.0) + 0.5 * math.log(0.5 / 0.75)
    assert torch.allclose(categorical_kl(p, q), torch.tensor([expected]))
    two_groups = torch.cat([p, p], 1), torch.cat([q, q], 1)  # KL sums over groups
    assert torch.allclose(categorical_kl(*two_groups), torch.tensor([2 * expected]))


def test_free_bits_and_kl_balance():
    p = torch.log(torch.tensor([[[0.5, 0.5]]]))
    q = torch.log(torch.tensor([[[0.25, 0.75]]]))
    kl = 0.5 * math.log(2.0) + 0.5 * math.log(0.5 / 0.75)
    loss, dyn, rep = kl_loss(p, q, free_nats=1.0, dyn=0.5, rep=0.1)
    assert torch.allclose(loss, torch.tensor([0.6]))  # both terms below 1 nat: clipped to 1
    assert torch.allclose(dyn, torch.tensor([kl])) and torch.allclose(rep, torch.tensor([kl]))
    loss, _, _ = kl_loss(p, q, free_nats=0.1, dyn=0.5, rep=0.1)
    assert torch.allclose(loss, torch.tensor([0.6 * kl]))
    # below the free nats no gradient reaches either side
    post, prior = p.clone().requires_grad_(), q.clone().requires_grad_()
    kl_loss(post, prior, free_nats=1.0)[0].sum().backward()
    assert float(post.grad.abs().sum()) == 0.0 and float(prior.grad.abs().sum()) == 0.0
    # the dynamics term trains only the prior, the representation term only the posterior
    post, prior = p.clone().requires_grad_(), q.clone().requires_grad_()
    kl_loss(post, prior, free_nats=0.0, dyn=1.0, rep=0.0)[0].sum().backward()
    assert float(post.grad.abs().sum()) == 0.0 and float(prior.grad.abs().sum()) > 0.0
    post, prior = p.clone().requires_grad_(), q.clone().requires_grad_()
    kl_loss(post, prior, free_nats=0.0, dyn=0.0, rep=1.0)[0].sum().backward()
    assert float(post.grad.abs().sum()) > 0.0 and float(prior.grad.abs().sum()) == 0.0


def test_straight_through_sample_is_one_hot_with_gradient():
    logits = torch.randn(4, 3, 5, requires_grad=True)
    s = straight_through_sample(unimix(logits), torch.Generator().manual_seed(0))
    assert torch.allclose(s.detach().sum(-1), torch.ones(4, 3))
    assert torch.allclose(s.detach(), s.detach().round(), atol=1e-6)  # one-hot up to the p - sg(p) rounding
    (s * torch.arange(5.0)).sum().backward()
    assert logits.grad.abs().sum() > 0


def test_ensemble_recovers_a_linear_system():
    torch.manual_seed(0)
    a = torch.tensor([[0.9, 0.1, 0.0], [0.0, 0.95, 0.05], [-0.1, 0.0, 0.8]])
    b = torch.tensor([[0.0], [0.1], [0.5]])
    c = torch.tensor([1.0, -0.5, 0.25])
    g = torch.Generator().manual_seed(0)
    x = torch.rand(4000, 3, generator=g) * 2 - 1
    u = torch.rand(4000, 1, generator=g) * 2 - 1
    x_next = x @ a.T + u @ b.T
    r = x @ c + 0.3 * u[:, 0]
    cfg = EnsembleConfig(members=3, elites=2, hidden=[64, 64], epochs=60, max_updates=10_000, lr=3e-3)
    model = ProbabilisticEnsemble(3, 1, cfg)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    out = fit(model, opt, x, u, r, x_next, torch.zeros(4000, dtype=torch.bool), cfg, g)
    assert out["model/holdout_mse"] < 1e-3
    # the model's mean prediction, read back as a linear map by least squares on fresh points
    xt = torch.rand(500, 3, generator=g) * 2 - 1
    ut = torch.rand(500, 1, generator=g) * 2 - 1
    pred = model.predict(xt, ut, g, deterministic=True)
    design = torch.cat([xt, ut, torch.ones(500, 1)], 1)
    coef = torch.linalg.lstsq(design, torch.cat([pred["next_state"], pred["reward"][:, None]], 1)).solution
    assert torch.allclose(coef[:3, :3].T, a, atol=0.03), coef[:3, :3].T
    assert torch.allclose(coef[3, :3], b[:, 0], atol=0.03)
    assert torch.allclose(coef[:3, 3], c, atol=0.03) and abs(float(coef[3, 3]) - 0.3) < 0.03
    assert float(pred["p_terminal"].max()) < 0.05
    assert float(pred["disagreement"].mean()) < 0.1


def test_ensemble_holds_entries_constant_in_the_data_exactly():
    """An entry no transition changes (a per-episode disturbance) is predicted as constant: no drift, no sampled
    noise, no share in the disagreement; the other entries are still predicted."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(600, 2, generator=g) * 2 - 1  # entry 1: a per-row constant
    u = torch.rand(600, 1, generator=g) * 2 - 1
    x_next = torch.stack([0.9 * x[:, 0] + 0.1 * u[:, 0], x[:, 1]], 1)
    cfg = EnsembleConfig(members=3, elites=2, hidden=[16], epochs=2)
    model = ProbabilisticEnsemble(2, 1, cfg)
    fit(model, torch.optim.Adam(model.parameters(), lr=1e-3), x, u, x[:, 0], x_next,
        torch.zeros(600, dtype=torch.bool), cfg, g)
    assert model.out_free.tolist() == [1.0, 0.0, 1.0]  # delta of entry 0, of entry 1, the reward
    xt = torch.rand(50, 2, generator=g) * 4 - 2  # off the data too
    for pred in (model.predict(xt, u[:50], g), model.predict(xt, u[:50], g, deterministic=True),
                 model.expected(xt, u[:50])):
        assert torch.equal(pred["next_state"][:, 1], xt[:, 1])
        assert not torch.equal(pred["next_state"][:, 0], xt[:, 0])
    model.out_free.fill_(1.0)  # the same network predicting every entry: entry 1 drifts
    assert not torch.equal(model.expected(xt, u[:50])["next_state"][:, 1], xt[:, 1])
    state = {k: v for k, v in model.state_dict().items() if k != "out_free"}  # a model saved before out_free
    model.load_state_dict(state)


@pytest.mark.parametrize("elites", [0, 4])
def test_ensemble_rejects_bad_elites(elites):
    with pytest.raises(ValueError):
        ProbabilisticEnsemble(3, 1, EnsembleConfig(members=3, elites=elites))


def test_one_members_step_is_the_ensembles_pick_and_carries_gradients():
    torch.manual_seed(0)
    net = ProbabilisticEnsemble(3, 2, EnsembleConfig(members=3, elites=1, hidden=[8, 8])).eval()
    with torch.no_grad():
        net.elite_idx.fill_(2)
        net.in_mean.normal_()
        net.out_std.uniform_(0.5, 2.0)
        net.out_free[1] = 0.0  # an entry held constant
    state, action = torch.randn(5, 3), torch.randn(5, 2)
    g = torch.Generator().manual_seed(7)
    sampled = net.predict(state, action, g)
    g.manual_seed(7)
    torch.randint(1, (5,), generator=g)  # predict draws each row's elite first, then the noise
    noise = torch.randn(5, 4, generator=g)
    one = net.member_step(state, action, 2, noise)
    mean = net.member_step(state, action, 2)
    for k in ("next_state", "reward"):
        torch.testing.assert_close(one[k], sampled[k], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(mean[k], net.predict(state, action, deterministic=True)[k], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(one["p_terminal"], sampled["p_terminal"], rtol=1e-6, atol=1e-6)
    assert torch.equal(one["next_state"][:, 1], state[:, 1] + net.out_mean[1])  # held: no drift, no noise
    action.requires_grad_(True)
    net.member_step(state, action, 2, noise)["reward"].sum().backward()
    assert torch.isfinite(action.grad).all() and action.grad.abs().sum() > 0
