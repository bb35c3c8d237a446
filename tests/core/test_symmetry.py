"""Symmetry groups acting by signed permutations, the symmetrized actor, replay augmentation."""

import pytest
import torch

import embodied
from embodied.algos.base import Transition
from embodied.algos.td3 import TD3, TD3Config
from embodied.config import PolicyConfig
from embodied.core.errors import UserError
from embodied.core.symmetry import SymmetryGroup, concat, mirror_axial, mirror_rotation, mirror_vector, permutation
from embodied.policies import DeterministicActor, SquashedGaussianActor, build_policy, policy_spec, update_normalizer

# Z2 x Z2 on a toy 3-dim obs / 2-dim action: swap the two actions and flip obs[0]; flip obs[1] alone
TOY = [
    {"policy": ([0, 1, 2], [1, 1, 1]), "action": ([0, 1], [1, 1])},
    {"policy": ([0, 1, 2], [-1, 1, 1]), "action": ([1, 0], [1, 1])},
    {"policy": ([0, 1, 2], [1, -1, 1]), "action": ([0, 1], [1, 1])},
    {"policy": ([0, 1, 2], [-1, -1, 1]), "action": ([1, 0], [1, 1])},
]


def test_apply_by_hand():
    g = SymmetryGroup([{"x": ([0, 1, 2], [1, 1, 1])}, {"x": ([2, 0, 1], [1, -1, 1])}])
    x = torch.tensor([[1.0, 2.0, 3.0]])
    assert g.apply("x", x, 1).tolist() == [[3.0, -1.0, 2.0]]
    per_row = g.apply("x", torch.cat([x, x]), torch.tensor([0, 1]))
    assert per_row.tolist() == [[1.0, 2.0, 3.0], [3.0, -1.0, 2.0]]
    # the inverse tables undo it: x[index[j]] = sign[j] x'[j]
    y = g.apply("x", x, 1)
    undone = y[:, g.inv_index["x"][1]] * g.inv_sign["x"][1]
    assert undone.tolist() == x.tolist()


def test_identity_must_come_first():
    with pytest.raises(ValueError, match="identity"):
        SymmetryGroup([{"x": ([1, 0], [1, 1])}])


def test_mirror_builders():
    m = (1.0, -1.0, 1.0)  # y -> -y, det -1
    assert mirror_vector(m, 0) == ([0, 1, 2], [1.0, -1.0, 1.0])
    assert mirror_axial(m, 3) == ([3, 4, 5], [-1.0, 1.0, -1.0])
    idx, sign = mirror_rotation(m, 0)
    R = torch.linalg.qr(torch.randn(3, 3))[0]
    M = torch.diag(torch.tensor(m))
    torch.testing.assert_close((R.reshape(-1)[idx] * torch.tensor(sign)).reshape(3, 3), M @ R @ M)
    assert permutation([1, 0], offset=2, repeats=2) == ([3, 2, 5, 4], [1.0] * 4)
    assert concat(([0], [1.0]), ([2], [-1.0])) == ([0, 2], [1.0, -1.0])


def s3_group():
    """The permutations of 3 items acting on a 3-vector and a 3-action alike (non-abelian)."""
    from itertools import permutations
    return [{"policy": (list(p), [1.0] * 3), "action": (list(p), [1.0] * 3)} for p in permutations(range(3))]


def test_compose_and_inverse():
    g = SymmetryGroup(s3_group())
    x = torch.randn(2, 3)
    for a in range(g.size):
        assert g.compose(a, g.inverse(a)) == 0
        for b in range(g.size):
            torch.testing.assert_close(g.apply("policy", x, g.compose(a, b)),
                                       g.apply("policy", g.apply("policy", x, b), a))


@pytest.mark.parametrize("elements", [TOY, s3_group()], ids=["klein", "s3"])
def test_equivariant_actor_is_exactly_equivariant_and_rebuilds_from_its_spec(elements):
    torch.manual_seed(0)
    group = SymmetryGroup(elements)
    n = group.size
    actor = DeterministicActor(3, len(elements[0]["action"][0]), [4 * n, 2 * n], "tanh", group=elements)
    x = torch.randn(5, 3)
    a = actor(x)
    for g in range(n):
        torch.testing.assert_close(actor(group.apply("policy", x, g)), group.apply("action", a, g))
    rebuilt = build_policy(policy_spec(actor))
    rebuilt.load_state_dict(actor.state_dict())
    torch.testing.assert_close(rebuilt.act(x), a)
    # the parameters are shared along the group: one lifting layer, [G, out, in] group weights
    assert actor.net.lift.weight.shape == (4, 3) and actor.net.weights[0].shape == (n, 2, 4)
    assert policy_spec(actor)["name"] == "deterministic_mlp"


def test_equivariant_actor_fixed_state_gets_fixed_action_and_matches_a_plain_mlp_at_g1():
    actor = DeterministicActor(3, 2, [8, 8], "tanh", group=TOY)
    out = actor(torch.tensor([[0.0, 0.0, 0.7]]))  # fixed by every element: both actions equal
    assert out[0, 0].item() == pytest.approx(out[0, 1].item(), abs=1e-7)
    trivial = [{"policy": ([0, 1, 2], [1, 1, 1]), "action": ([0, 1], [1, 1])}]
    one = DeterministicActor(3, 2, [8, 8], "relu", group=trivial)
    x = torch.randn(4, 3)
    net = one.net
    h = torch.relu(net.lift(x))
    h = torch.relu(h @ net.weights[0][0].t() + net.biases[0])
    torch.testing.assert_close(one(x), torch.tanh(net.out(h)))


def test_equivariant_actor_reuses_its_weights_without_gradients_until_they_change():
    torch.manual_seed(0)
    actor = DeterministicActor(3, 2, [8, 8], "relu", group=TOY)
    x = torch.randn(4, 3)
    with torch.no_grad():
        first = actor(x)
        assert torch.equal(actor(x), first) and torch.equal(first, actor(x))
        cached = actor.net._cache
        actor(x)
        assert actor.net._cache is cached  # assembled once while the parameters stay
    torch.testing.assert_close(actor(x), first, rtol=0, atol=0)  # the recorded path assembles afresh
    opt = torch.optim.Adam(actor.parameters(), lr=0.1)
    actor(x).sum().backward()
    opt.step()  # in place: the cache follows
    with torch.no_grad():
        after = actor(x)
    assert not torch.equal(after, first)
    torch.testing.assert_close(after, actor(x).detach(), rtol=0, atol=0)
    copy = __import__("copy").deepcopy(actor)
    with torch.no_grad():
        copy.net.out.bias.add_(1.0)
        assert not torch.equal(copy(x), after) and torch.equal(actor(x), after)


@pytest.mark.parametrize("elements", [TOY, s3_group()], ids=["klein", "s3"])
def test_equivariant_weights_gathered_at_once_equal_the_layer_by_layer_assembly(elements):
    torch.manual_seed(0)
    n = len(elements)
    net = DeterministicActor(3, len(elements[0]["action"][0]), [4 * n, 2 * n], "relu", group=elements).net
    with torch.no_grad():
        for p in net.parameters():
            p.normal_()
    fast, ref = net._assemble(), net._assemble_reference()
    assert len(fast) == len(ref) == 3
    for (b, w), (b_ref, w_ref) in zip(fast, ref):
        assert torch.equal(b, b_ref) and torch.equal(w, w_ref)
    assert fast[-1][1].t().is_contiguous()  # the narrow projection as a transposed [out, G c] (BLAS's fast layout)
    x, params = torch.randn(7, 3), list(net.parameters())

    def grads(layers):
        h = x
        for i, (b, w) in enumerate(layers):
            h = torch.addmm(b, h, w)
            h = torch.relu(h) if i < len(layers) - 1 else h
        return torch.autograd.grad((h ** 2).sum(), params)

    for g, g_ref in zip(grads(net._assemble()), grads(net._assemble_reference())):
        torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=1e-5)


def test_hidden_width_must_divide_by_group_size():
    with pytest.raises(UserError, match="multiples"):
        DeterministicActor(3, 2, [6], "relu", group=TOY)


def test_equivariant_actor_normalizer_sees_the_whole_orbit():
    actor = DeterministicActor(3, 2, [8], "relu", obs_normalization=True, group=TOY)
    update_normalizer(actor, torch.tensor([[1.0, 2.0, 3.0]]))
    torch.testing.assert_close(actor.normalizer.mean, torch.tensor([0.0, 0.0, 3.0]))
    x = torch.randn(5, 3)
    a = actor(x)
    group = SymmetryGroup(TOY)
    for g in range(group.size):  # normalization commutes with the group
        torch.testing.assert_close(actor(group.apply("policy", x, g)), group.apply("action", a, g))


def test_equivariant_squashed_gaussian_mean_is_equivariant_and_std_permutes():
    """Klein group with a sign-flipping action element: the mean flips, the log std does not."""
    elements = [{"policy": ([0, 1, 2], [1, 1, 1]), "action": ([0, 1], [1, 1])},
                {"policy": ([0, 1, 2], [-1, 1, 1]), "action": ([1, 0], [1, 1])},
                {"policy": ([0, 1, 2], [1, -1, 1]), "action": ([0, 1], [-1, -1])},
                {"policy": ([0, 1, 2], [-1, -1, 1]), "action": ([1, 0], [-1, -1])}]
    group = SymmetryGroup(elements)
    for g in range(4):  # a representation: closed under composition
        for h in range(4):
            group.compose(g, h)
    actor = SquashedGaussianActor(3, 2, [8, 8], "tanh", group=elements)
    x = torch.randn(6, 3)
    mean, log_std = actor(x)
    for g in range(4):
        m, ls = actor(group.apply("policy", x, g))
        torch.testing.assert_close(m, group.apply("action", mean, g))
        idx = group.index["action"][g]
        torch.testing.assert_close(ls, log_std[:, idx])
    rebuilt = build_policy(policy_spec(actor))
    rebuilt.load_state_dict(actor.state_dict())
    torch.testing.assert_close(rebuilt.act(x), actor.act(x))


def test_augmented_td3_batch_is_a_group_image_of_stored_rows():
    env = embodied.make_env("quadrotor-hover", num_envs=2)
    group = env.symmetry_group()
    cfg = TD3Config(batch_size=64, warmup_steps=0, symmetry_augmentation=True)
    algo = TD3(cfg, PolicyConfig(actor_hidden=[8], critic_hidden=[8], obs_normalization=False),
               env.single_observation_space, env.single_action_space, 2, "cpu", 0, total_steps=100, symmetry=group)
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        action = torch.rand(2, 4) * 2 - 1
        nxt, r, term, trunc, info = env.step(action)
        algo.observe(Transition(obs, action, r, term, trunc, nxt))
        obs = nxt
    state = algo.generator.get_state()
    b = algo._sample()
    gen = torch.Generator().set_state(state)  # replay the same draws: raw rows, then group elements
    raw = algo.buffer.sample(cfg.batch_size, gen)
    g = torch.randint(group.size, (cfg.batch_size,), generator=gen)
    assert len(set(g.tolist())) == group.size  # all four elements occur in 64 rows
    for name, key in (("obs", "policy"), ("next_obs", "policy"), ("cobs", "critic"), ("next_cobs", "critic"),
                      ("action", "action")):
        for i in range(cfg.batch_size):
            want = group.apply(key, raw[name][i:i + 1], int(g[i]))[0]
            assert torch.equal(b[name][i], want), (name, i)
    assert torch.equal(b["reward"], raw["reward"]) and torch.equal(b["discount"], raw["discount"])
