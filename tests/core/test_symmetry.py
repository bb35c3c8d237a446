"""Symmetry groups acting by signed permutations, the symmetrized actor, replay augmentation."""

import pytest
import torch

import embodied
from embodied.algos.base import Transition
from embodied.algos.td3 import TD3
from embodied.config import PolicyConfig, TD3Config
from embodied.core.symmetry import SymmetryGroup, concat, mirror_axial, mirror_rotation, mirror_vector, permutation
from embodied.policies import DeterministicActor, SymmetrizedActor, build_policy, policy_spec

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
    # inverse undoes it
    y = g.orbit("x", x)  # [1, 2, 3]
    assert g.average_inverse("x", y).tolist() == x.tolist()


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


def test_symmetrized_actor_is_exactly_equivariant_and_rebuilds_from_its_spec():
    torch.manual_seed(0)
    inner = DeterministicActor(3, 2, [16], "tanh", obs_normalization=False)
    actor = SymmetrizedActor(policy_spec(inner), TOY)
    group = SymmetryGroup(TOY)
    x = torch.randn(5, 3)
    a = actor(x)
    for g in range(group.size):
        torch.testing.assert_close(actor(group.apply("policy", x, g)), group.apply("action", a, g))
    # a state fixed by the whole group gets an action fixed by it: both actions equal
    fixed = torch.tensor([[0.0, 0.0, 0.7]])
    out = actor(fixed)
    assert out[0, 0].item() == pytest.approx(out[0, 1].item(), abs=1e-7)
    # it is the group average of the wrapped actor
    want = torch.stack([group.apply("action", actor.actor(group.apply("policy", x, g)), g) for g in range(4)]).mean(0)
    torch.testing.assert_close(a, want)
    rebuilt = build_policy(policy_spec(actor))
    rebuilt.load_state_dict(actor.state_dict())
    torch.testing.assert_close(rebuilt.act(x), a)


def test_symmetrized_actor_normalizer_sees_the_whole_orbit():
    inner = DeterministicActor(3, 2, [8], "relu", obs_normalization=True)
    actor = SymmetrizedActor(policy_spec(inner), TOY)
    actor.normalizer.update(torch.tensor([[1.0, 2.0, 3.0]]))
    torch.testing.assert_close(actor.actor.normalizer.mean, torch.tensor([0.0, 0.0, 3.0]))


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
    g = group.sample(cfg.batch_size, gen)
    assert len(set(g.tolist())) == group.size  # all four elements occur in 64 rows
    for name, key in (("obs", "policy"), ("next_obs", "policy"), ("cobs", "critic"), ("next_cobs", "critic"),
                      ("action", "action")):
        for i in range(cfg.batch_size):
            want = group.apply(key, raw[name][i:i + 1], int(g[i]))[0]
            assert torch.equal(b[name][i], want), (name, i)
    assert torch.equal(b["reward"], raw["reward"]) and torch.equal(b["done"], raw["done"])
