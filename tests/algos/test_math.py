"""Exact-value tests for the learning math (STYLE.md rule 11): GAE, the observation normalizer, the
squashed-Gaussian log-probability, the ensemble critic, the replay buffer, PPO's clipped surrogate
and truncation bootstrap, and SAC's critic target. Hand-computed numbers carry their arithmetic."""

from __future__ import annotations

import copy
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn
from torch.distributions import Normal, TanhTransform, TransformedDistribution

from embodied.algos.base import Transition
from embodied.algos.gae import gae
from embodied.algos.ppo import PPO, PPOConfig
from embodied.algos.replay import NStepReturns, ReplayBuffer
from embodied.algos.sac import SAC, SACConfig
from embodied.algos.td3 import TD3, TD3Config
from embodied.config import PolicyConfig
from embodied.core.base import box
from embodied.core.errors import UserError
from embodied.policies import EmpiricalNormalizer, SquashedGaussianActor, TwinQCritic
from embodied.policies.networks import EnsembleMLP

F64 = torch.float64


def t64(*rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64)


def spaces(obs_dim: int, act_dim: int):
    return gym.spaces.Dict({"policy": box(-1, 1, (obs_dim,))}), box(-1.0, 1.0, (act_dim,))


# ---- GAE ----------------------------------------------------------------------------------------
def test_gae_hand_computed():
    # gamma = 0.9, lambda = 0.8, so gamma * lambda = 0.72. T = 3 steps, N = 2 envs.
    # env 0: the episode ends at t = 1 (mid-rollout); t = 2 starts a new one and bootstraps from
    #        last_values[0] = 2.0.
    #   t=2: delta = 3 + 0.9 * 2.0 - 1.5            = 3.3    A = 3.3
    #   t=1: delta = 2 + 0 (done)  - 1.0            = 1.0    A = 1.0 + 0 (done)          = 1.0
    #   t=0: delta = 1 + 0.9 * 1.0 - 0.5            = 1.4    A = 1.4 + 0.72 * 1.0        = 2.12
    # env 1: the episode ends at the last step, so last_values[1] = 10 must be ignored.
    #   t=2: delta = 0 + 0 (done)  - (-1)           = 1.0    A = 1.0
    #   t=1: delta = -1 + 0.9 * (-1) - 0            = -1.9   A = -1.9 + 0.72 * 1.0       = -1.18
    #   t=0: delta = 0.5 + 0.9 * 0 - 1              = -0.5   A = -0.5 + 0.72 * (-1.18)   = -1.3496
    # returns R = A + V.
    # float32, the rollout dtype (gae computes 1 - done in float32, so float64 inputs gain nothing)
    rewards = torch.tensor([[1.0, 0.5], [2.0, -1.0], [3.0, 0.0]])
    values = torch.tensor([[0.5, 1.0], [1.0, 0.0], [1.5, -1.0]])
    dones = torch.tensor([[False, False], [True, False], [False, True]])
    last_values = torch.tensor([2.0, 10.0])
    adv, ret = gae(rewards, values, dones, last_values, gamma=0.9, lam=0.8)
    expected_adv = torch.tensor([[2.12, -1.3496], [1.0, -1.18], [3.3, 1.0]])
    torch.testing.assert_close(adv, expected_adv, rtol=0, atol=1e-6)
    expected_ret = torch.tensor([[2.62, -0.3496], [2.0, -1.18], [4.8, 0.0]])
    torch.testing.assert_close(ret, expected_ret, rtol=0, atol=1e-6)


def test_gae_lambda_one_is_discounted_return_minus_value():
    # lambda = 1: A_t = sum_k gamma^k r_{t+k} + gamma^(T-t) V_T - V_t (no episode end).
    # r = (1, 1), V = (0.3, 0.7), V_T = 4, gamma = 0.5:
    #   A_1 = 1 + 0.5 * 4 - 0.7 = 2.3;  A_0 = 1 + 0.5 * 1 + 0.25 * 4 - 0.3 = 2.2
    adv, _ = gae(torch.tensor([[1.0], [1.0]]), torch.tensor([[0.3], [0.7]]), torch.zeros(2, 1),
                 torch.tensor([4.0]), gamma=0.5, lam=1.0)
    torch.testing.assert_close(adv, torch.tensor([[2.2], [2.3]]), rtol=0, atol=1e-6)


# ---- EmpiricalNormalizer --------------------------------------------------------------------------
def test_normalizer_matches_numpy_over_concatenation():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, (5, 3)), rng.normal(-1.0, 0.5, (1, 3)), rng.normal(10.0, 4.0, (17, 3))]
    norm = EmpiricalNormalizer(3).double()  # statistics in float64: only the merge math is tested
    for b in batches:
        norm.update(torch.from_numpy(b))
    norm.update(torch.zeros(0, 3, dtype=F64))  # an empty batch changes nothing
    full = np.concatenate(batches)
    np.testing.assert_allclose(norm.mean.numpy(), full.mean(0), rtol=0, atol=1e-10)
    np.testing.assert_allclose(norm.var.numpy(), full.var(0), rtol=0, atol=1e-10)  # population variance
    assert float(norm.count) == 23


def test_normalizer_float32_buffers_track_numpy():
    rng = np.random.default_rng(1)
    batches = [rng.normal(0.5, 1.5, (64, 2)).astype(np.float32) for _ in range(10)]
    norm = EmpiricalNormalizer(2)
    for b in batches:
        norm.update(torch.from_numpy(b))
    full = np.concatenate(batches).astype(np.float64)
    np.testing.assert_allclose(norm.mean.numpy(), full.mean(0), rtol=0, atol=1e-6)
    np.testing.assert_allclose(norm.var.numpy(), full.var(0), rtol=1e-6, atol=1e-6)


def test_normalizer_forward_and_clip():
    norm = EmpiricalNormalizer(2, eps=1e-8, clip=5.0).double()
    norm.mean.copy_(t64(1.0, -2.0))
    norm.var.copy_(t64(4.0, 0.25))
    # y = (x - mean) / sqrt(var + eps): ((3 - 1) / sqrt(4 + 1e-8), (-1.5 + 2) / sqrt(0.25 + 1e-8))
    y = norm(t64([3.0, -1.5]))
    expected = t64([2.0 / math.sqrt(4.0 + 1e-8), 0.5 / math.sqrt(0.25 + 1e-8)])
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-15)
    # (100 - 1) / 2 = 49.5 -> 5; (-100 + 2) / 0.5 = -196 -> -5; (2 - 1) / 2 = 0.5 stays
    y = norm(t64([100.0, -100.0], [2.0, -2.0]))
    torch.testing.assert_close(y, t64([5.0, -5.0], [1.0 / math.sqrt(4.0 + 1e-8), 0.0]), rtol=0, atol=1e-15)


# ---- SquashedGaussianActor.sample -------------------------------------------------------------------
@pytest.mark.parametrize("mean_shift", [0.0, 8.0])  # 8: |u| large, where 1 - tanh(u)^2 underflows naively
def test_squashed_gaussian_log_prob_matches_torch_distributions(mean_shift):
    torch.manual_seed(0)
    actor = SquashedGaussianActor(3, 2, [16], "tanh", obs_normalization=False).double()
    with torch.no_grad():
        actor.net[-1].bias[:2] += mean_shift  # first act_dim outputs are the mean
    obs = torch.randn(6, 3, dtype=F64)
    action, log_prob = actor.sample(obs, torch.Generator().manual_seed(7))

    mean, log_std = actor(obs)
    eps = torch.randn(mean.shape, generator=torch.Generator().manual_seed(7), dtype=F64)  # same noise
    u = mean + log_std.exp() * eps
    tanh = TanhTransform(cache_size=1)
    reference = TransformedDistribution(Normal(mean, log_std.exp()), [tanh])
    a_ref = tanh(u)  # caches u, so log_prob inverts tanh exactly
    torch.testing.assert_close(action, a_ref, rtol=0, atol=1e-15)
    expected = reference.log_prob(a_ref).sum(-1)
    assert log_prob.shape == (6,)
    assert torch.isfinite(log_prob).all()
    torch.testing.assert_close(log_prob, expected, rtol=1e-12, atol=1e-10)


# ---- EnsembleMLP / TwinQCritic ------------------------------------------------------------------------
def member_as_linears(net: EnsembleMLP, e: int, act: type[nn.Module]) -> nn.Sequential:
    """Member ``e`` of an ensemble rebuilt as plain ``nn.Linear`` layers with the same weights."""
    layers: list[nn.Module] = []
    for i, layer in enumerate(net.layers):
        in_dim, out_dim = layer.weight.shape[1:]
        lin = nn.Linear(in_dim, out_dim).double()
        with torch.no_grad():
            lin.weight.copy_(layer.weight[e].T)  # EnsembleLinear stores [E, in, out]; nn.Linear [out, in]
            lin.bias.copy_(layer.bias[e, 0])
        layers.append(lin)
        if i < len(net.layers) - 1:
            layers.append(act())
    return nn.Sequential(*layers)


def test_twin_q_equals_separate_members():
    torch.manual_seed(0)
    q = TwinQCritic(3, 2, [5, 4], "tanh").double()
    obs, action = torch.randn(7, 3, dtype=F64), torch.randn(7, 2, dtype=F64)
    out = q(obs, action)
    assert out.shape == (2, 7)
    x = torch.cat([obs, action], -1)
    for e in range(2):
        expected = member_as_linears(q.net, e, nn.Tanh)(x).squeeze(-1)
        torch.testing.assert_close(out[e], expected, rtol=1e-12, atol=1e-12)


def test_ensemble_mlp_per_member_inputs():
    torch.manual_seed(1)
    net = EnsembleMLP(3, 4, [6], 2, "relu").double()
    x = torch.randn(3, 5, 4, dtype=F64)  # [E, B, in]: a different batch per member
    out = net(x)
    assert out.shape == (3, 5, 2)
    for e in range(3):
        torch.testing.assert_close(out[e], member_as_linears(net, e, nn.ReLU)(x[e]), rtol=1e-12, atol=1e-12)


def test_ensemble_mlp_layer_norm_hand_computed():
    """critic_layer_norm: each hidden pre-activation normalized over its units, (h - mean) / sqrt(var + 1e-5) with
    the biased variance, no affine; the output layer is not normalized."""
    torch.manual_seed(2)
    net = EnsembleMLP(2, 3, [4], 1, "relu", layer_norm=True).double()
    x = torch.randn(5, 3, dtype=F64)
    out = net(x)
    for e in range(2):
        h = x @ net.layers[0].weight[e] + net.layers[0].bias[e]
        h = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + 1e-5)
        expected = torch.relu(h) @ net.layers[1].weight[e] + net.layers[1].bias[e]
        torch.testing.assert_close(out[e], expected, rtol=1e-12, atol=1e-12)
    assert TwinQCritic(3, 2, [4], "relu", layer_norm=True).net.layer_norm


# ---- ReplayBuffer -------------------------------------------------------------------------------------
OBS, COBS, ACT = 2, 3, 1


def rows(ids) -> dict[str, torch.Tensor]:
    """Transitions whose every field encodes its row id ``i``, so a sample can be checked field by field."""
    i = torch.as_tensor(ids, dtype=torch.float32)[:, None]
    return {"obs": i + torch.tensor([0.0, 0.01]), "cobs": i + torch.tensor([0.1, 0.11, 0.12]),
            "action": i + 0.2, "reward": (i + 0.3).squeeze(1), "discount": (i % 2).squeeze(1),
            "next_obs": i + torch.tensor([0.4, 0.41]), "next_cobs": i + torch.tensor([0.5, 0.51, 0.52])}


def assert_rows(batch: dict[str, torch.Tensor], ids) -> None:
    expected = rows(ids)
    assert set(batch) == set(expected)
    for k, v in expected.items():
        assert batch[k].shape == v.shape, k
        torch.testing.assert_close(batch[k], v, rtol=0, atol=0, msg=k)


def slot_ids(buf: ReplayBuffer) -> list[int]:
    return [round(float(x)) for x in buf.storage[:, 0]]


def test_replay_buffer_wraparound_keeps_newest_rows():
    buf = ReplayBuffer(5, OBS, COBS, ACT, torch.device("cpu"))
    buf.add(**rows([0, 1, 2]))
    assert (buf.size, buf.pos) == (3, 3)
    buf.add(**rows([3, 4, 5]))  # 3, 4 fill slots 3, 4; 5 wraps to slot 0 (overwriting row 0)
    assert (buf.size, buf.pos) == (5, 1)
    assert slot_ids(buf) == [5, 1, 2, 3, 4]
    buf.add(**rows([6, 7, 8]))  # slots 1, 2, 3
    assert (buf.size, buf.pos) == (5, 4)
    assert slot_ids(buf) == [5, 6, 7, 8, 4]  # exactly the newest 5 rows
    stored = {k: buf.storage[:, s] for k, s in buf.slices.items()}  # every field of every slot
    stored["reward"], stored["discount"] = stored["reward"].squeeze(1), stored["discount"].squeeze(1)
    assert_rows(stored, [5, 6, 7, 8, 4])


def test_replay_buffer_add_more_rows_than_capacity():
    buf = ReplayBuffer(4, OBS, COBS, ACT, torch.device("cpu"))
    buf.add(**rows([0, 1, 2]))  # pos = 3
    buf.add(**rows([3, 4, 5, 6, 7, 8]))  # 6 rows > capacity 4: the newest are 5, 6, 7, 8
    assert buf.size == 4
    # the same slots as writing the 6 rows one by one from slot 3: 3,0,1,2,3,0
    assert slot_ids(buf) == [8, 5, 6, 7] and buf.pos == 1


def test_replay_buffer_sample_returns_stored_rows():
    buf = ReplayBuffer(8, OBS, COBS, ACT, torch.device("cpu"))
    buf.add(**rows(range(6)))
    batch = buf.sample(32, torch.Generator().manual_seed(3))
    ids = torch.randint(6, (32,), generator=torch.Generator().manual_seed(3))  # the same draw
    assert_rows(batch, ids.tolist())
    assert batch["reward"].shape == (32,) and batch["discount"].shape == (32,)


def test_replay_buffer_state_dict_round_trip():
    buf = ReplayBuffer(5, OBS, COBS, ACT, torch.device("cpu"))
    buf.add(**rows([0, 1, 2, 3]))
    state = copy.deepcopy(buf.state_dict())
    other = ReplayBuffer(5, OBS, COBS, ACT, torch.device("cpu"))
    other.load_state_dict(state)
    assert (other.size, other.pos) == (4, 4)
    torch.testing.assert_close(other.storage, buf.storage, rtol=0, atol=0)
    for b in (buf, other):  # both continue identically: 4 -> slot 4, 5 -> slot 0
        b.add(**rows([4, 5]))
    torch.testing.assert_close(other.storage, buf.storage, rtol=0, atol=0)
    assert slot_ids(other) == [5, 1, 2, 3, 4]
    a, b = (x.sample(16, torch.Generator().manual_seed(0)) for x in (buf, other))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


# ---- PPO -------------------------------------------------------------------------------------------
def make_ppo(num_envs: int = 4, **ppo) -> PPO:
    obs_space, act_space = spaces(2, 1)
    return PPO(PPOConfig(**ppo), PolicyConfig(actor_hidden=[8], critic_hidden=[8]), obs_space, act_space,
               num_envs, torch.device("cpu"), seed=0)


def test_vtrace_hand_example():
    """gamma 0.5, rewards (1, 2), V = (0.5, 1), V_T = 2, rho = (2, 0.5) truncated to (1, 0.5):
    delta = (1, 1); v_1 = 1 + 1 = 2, v_0 = 0.5 + 1 + 0.5 * 1 * 1 = 2; A = (1 + 0.5 * 2 - 0.5, 0.5 (2 + 1 - 1))."""
    from embodied.algos.gae import vtrace

    r, v, last = torch.tensor([[1.0], [2.0]]), torch.tensor([[0.5], [1.0]]), torch.tensor([2.0])
    log_rho = torch.log(torch.tensor([[2.0], [0.5]]))
    vs, adv = vtrace(r, v, torch.zeros(2, 1), last, log_rho, gamma=0.5)
    torch.testing.assert_close(vs, torch.tensor([[2.0], [2.0]]))
    torch.testing.assert_close(adv, torch.tensor([[1.5], [1.0]]))
    # the episode ends at step 0: no bootstrap and no trace across it
    vs, adv = vtrace(r, v, torch.tensor([[1.0], [0.0]]), last, log_rho, gamma=0.5)
    torch.testing.assert_close(vs[0], torch.tensor([1.0]))
    torch.testing.assert_close(adv[0], torch.tensor([0.5]))
    # on-policy (rho = 1): the lambda = 1 returns of GAE
    _, returns = gae(r, v, torch.zeros(2, 1), last, 0.5, 1.0)
    torch.testing.assert_close(vtrace(r, v, torch.zeros(2, 1), last, torch.zeros(2, 1), 0.5)[0], returns)


def test_ppo_reward_normalization_hand_example():
    """r / sqrt(Var[G] + eps), G_t = gamma G_{t-1} + r_t reset after an episode end (gymnasium's
    NormalizeReward): two envs, gamma 0.5, rewards (1, 2) then (3, 4) with env 0 ending at step 1."""
    algo = make_ppo(num_envs=2, gamma=0.5, normalize_rewards=True)
    r1 = algo._scale_rewards(torch.tensor([1.0, 2.0]), torch.tensor([True, False]))
    # G = (1, 2): population variance 0.25
    torch.testing.assert_close(r1, torch.tensor([1.0, 2.0]) / math.sqrt(0.25 + 1e-8))
    r2 = algo._scale_rewards(torch.tensor([3.0, 4.0]), torch.tensor([False, False]))
    # env 0 restarted: G = (3, 0.5 * 2 + 4 = 5); all four returns 1, 2, 3, 5: variance 2.1875
    torch.testing.assert_close(r2, torch.tensor([3.0, 4.0]) / math.sqrt(2.1875 + 1e-8))


def test_ppo_clipped_surrogate_hand_example():
    algo = make_ppo(clip=0.2, normalize_advantages=False, value_clip=0.1, value_coef=0.5, entropy_coef=0.01)
    algo.pi.double()
    algo.v.double()
    with torch.no_grad():  # mean 0, std 0.5 for every observation; V = 0.5 for every observation
        algo.pi.net[-1].weight.zero_()
        algo.pi.net[-1].bias.zero_()
        algo.pi.log_std.fill_(math.log(0.5))
        algo.v.net[-1].weight.zero_()
        algo.v.net[-1].bias.fill_(0.5)
    obs = torch.randn(4, 2, dtype=F64)
    actions = t64([0.1], [-0.2], [0.3], [0.0])
    # log N(a; 0, 0.5) = -0.5 (a / 0.5)^2 - log 0.5 - 0.5 log(2 pi); old_logp is set so that the
    # ratio pi / pi_old is exactly r = (1.5, 0.5, 0.9, 1.3)
    ratio = t64(1.5, 0.5, 0.9, 1.3)
    logp = -0.5 * (actions[:, 0] / 0.5) ** 2 - math.log(0.5) - 0.5 * math.log(2 * math.pi)
    old_logp = logp - ratio.log()
    adv = t64(1.0, -1.0, 2.0, -2.0)
    # min(r A, clip(r, 0.8, 1.2) A):
    #   r=1.5, A= 1: min( 1.5,  1.2) =  1.2   (clipped: no credit beyond 1 + eps)
    #   r=0.5, A=-1: min(-0.5, -0.8) = -0.8   (clipped: no credit below 1 - eps)
    #   r=0.9, A= 2: min( 1.8,  1.8) =  1.8   (inside the clip range)
    #   r=1.3, A=-2: min(-2.6, -2.4) = -2.6   (pessimistic: the unclipped, worse term)
    # L = -(1.2 - 0.8 + 1.8 - 2.6) / 4 = 0.1
    old_values, returns = t64(0.3, 0.45, 0.5, 0.9), t64(1.0, 0.0, 0.5, 2.0)
    # V = 0.5; clipped V = old + clip(0.5 - old, +-0.1) = (0.4, 0.5, 0.5, 0.8)
    # max((V - R)^2, (Vc - R)^2) = max(0.25, 0.36), max(0.25, 0.25), 0, max(2.25, 1.44) -> mean 2.86 / 4
    out = algo._minibatch_loss(obs, obs, actions, old_logp, old_values, adv, returns)
    assert float(out["ppo/policy_loss"]) == pytest.approx(0.1, abs=1e-12)
    assert float(out["ppo/value_loss"]) == pytest.approx(0.715, abs=1e-12)
    entropy = 0.5 + 0.5 * math.log(2 * math.pi) + math.log(0.5)  # Normal entropy, one action dim
    assert float(out["ppo/entropy"]) == pytest.approx(entropy, abs=1e-12)
    assert float(out["loss"].detach()) == pytest.approx(0.1 + 0.5 * 0.715 - 0.01 * entropy, abs=1e-12)
    kl = sum((r - 1) - math.log(r) for r in (1.5, 0.5, 0.9, 1.3)) / 4  # k3 estimator
    assert out["ppo/approx_kl"] == pytest.approx(kl, abs=1e-12)
    assert out["ppo/clip_frac"] == 0.75  # |r - 1| > 0.2 for r = 1.5, 0.5, 1.3; not 0.9

    # with advantage normalization A' = (A - mean) / (std + 1e-8); here mean = 0 and the unbiased
    # std is sqrt((1 + 1 + 4 + 4) / 3); min(r A, clip(r) A) is positively homogeneous in A, so L scales
    algo.cfg = PPOConfig(clip=0.2, normalize_advantages=True)
    out = algo._minibatch_loss(obs, obs, actions, old_logp, old_values, adv, returns)
    assert float(out["ppo/policy_loss"]) == pytest.approx(0.1 / (math.sqrt(10 / 3) + 1e-8), abs=1e-12)


def test_explained_variance_hand_example():
    from embodied.algos.gae import explained_variance

    returns, values = t64(1.0, 2.0, 3.0, 4.0), t64(1.5, 1.5, 3.5, 3.5)
    # Var[R] = 1.25; R - V = (-0.5, 0.5, -0.5, 0.5): Var = 0.25 -> 1 - 0.25 / 1.25 = 0.8
    assert explained_variance(values, returns) == pytest.approx(0.8, abs=1e-12)
    assert explained_variance(returns, returns) == 1.0
    assert explained_variance(torch.full((4,), 2.5, dtype=F64), returns) == pytest.approx(0.0, abs=1e-12)
    assert explained_variance(values, torch.ones(4, dtype=F64)) is None  # targets that do not vary


def test_ppo_observe_bootstraps_only_truncated_not_terminated():
    algo = make_ppo(num_envs=4, gamma=0.9, normalize_rewards=False)  # rewards stored as given
    obs = {"policy": torch.randn(4, 2)}
    next_obs = {"policy": torch.randn(4, 2)}
    action, extras = algo.act(obs)
    with torch.no_grad():
        v_next = algo.v(next_obs["policy"])  # before observe updates the normalizers
        v_now = algo.v(obs["policy"])
    reward = torch.tensor([1.0, 2.0, 3.0, 4.0])
    terminated = torch.tensor([False, True, True, False])
    truncated = torch.tensor([True, False, True, False])
    algo.observe(Transition(obs, action, reward, terminated, truncated, next_obs, extras))
    s = algo.storage
    # env 0 truncated only: r + gamma V(s_final); env 1 terminated; env 2 both: terminal wins; env 3 running
    expected = torch.tensor([1.0 + 0.9 * float(v_next[0]), 2.0, 3.0, 4.0])
    torch.testing.assert_close(s.rewards[0], expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(s.dones[0], torch.tensor([1.0, 1.0, 1.0, 0.0]), rtol=0, atol=0)
    torch.testing.assert_close(s.values[0], v_now, rtol=0, atol=1e-6)
    torch.testing.assert_close(s.actions[0], action, rtol=0, atol=0)
    assert s.step == 1


def _nstep_rows(acc: NStepReturns, t: int, terminated, truncated) -> list[tuple]:
    """Step t of two envs: head 10 e + t, reward t + 1, tail 100 + 10 e + t; rows sorted by head."""
    e = torch.arange(2.0)
    out = acc.push((10 * e + t)[:, None], torch.full((2,), t + 1.0), torch.tensor(terminated),
                   torch.tensor(truncated), (100 + 10 * e + t)[:, None])
    return sorted((float(h), float(r), float(d), float(x)) for h, r, d, x in zip(out[0][:, 0], out[1], out[2],
                                                                                out[3][:, 0]))


def test_nstep_returns_hand_example():
    """n = 3, gamma 0.5, rewards 1..5. Env 0 runs on: the row started at t closes at t + 2 with
    r_t + 0.5 r_{t+1} + 0.25 r_{t+2} and discount 0.125. Env 1 terminates at t = 1 (both open rows
    close with discount 0 and the true next observation) and is truncated at t = 3 (rows close and
    bootstrap: discount gamma^m)."""
    acc = NStepReturns(3, 0.5, 2, 1, torch.device("cpu"))
    f, t = False, True
    assert _nstep_rows(acc, 0, [f, f], [f, f]) == []
    assert _nstep_rows(acc, 1, [f, t], [f, f]) == [(10, 1 + 0.5 * 2, 0.0, 111), (11, 2, 0.0, 111)]
    assert _nstep_rows(acc, 2, [f, f], [f, f]) == [(0, 1 + 0.5 * 2 + 0.25 * 3, 0.125, 102)]
    state = acc.state_dict()
    rows3 = _nstep_rows(acc, 3, [f, f], [f, t])
    assert rows3 == [(1, 2 + 0.5 * 3 + 0.25 * 4, 0.125, 103), (12, 3 + 0.5 * 4, 0.25, 113), (13, 4, 0.5, 113)]
    assert _nstep_rows(acc, 4, [f, f], [f, f]) == [(2, 3 + 0.5 * 4 + 0.25 * 5, 0.125, 104)]
    resumed = NStepReturns(3, 0.5, 2, 1, torch.device("cpu"))
    resumed.load_state_dict(state)
    assert _nstep_rows(resumed, 3, [f, f], [f, t]) == rows3


def test_nstep_returns_never_link_across_a_dropped_step():
    # env 1's step is marked fresh (an engine dropped the step before it): its open windows (started
    # at t = 0 and 1) are discarded, not closed with the new step's reward; env 0 is unaffected
    acc = NStepReturns(3, 0.5, 2, 1, torch.device("cpu"))
    f = [False, False]
    _nstep_rows(acc, 0, f, f)
    _nstep_rows(acc, 1, f, f)
    e = torch.arange(2.0)
    head, reward, discount, tail = acc.push((10 * e + 2)[:, None], torch.full((2,), 3.0), torch.tensor(f),
                                            torch.tensor(f), (100 + 10 * e + 2)[:, None], torch.tensor([False, True]))
    assert head[:, 0].tolist() == [0.0] and reward.tolist() == [1 + 0.5 * 2 + 0.25 * 3]
    assert acc.live[:, 1].sum() == 1  # only the window the fresh step opened


def test_nstep_returns_with_n_1_are_one_step_rows():
    acc = NStepReturns(1, 0.9, 3, 1, torch.device("cpu"))
    head, reward, discount, tail = acc.push(torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([0.5, 0.6, 0.7]),
                                            torch.tensor([False, True, False]), torch.tensor([False, False, True]),
                                            torch.tensor([[4.0], [5.0], [6.0]]))
    assert head[:, 0].tolist() == [1, 2, 3] and tail[:, 0].tolist() == [4, 5, 6]
    torch.testing.assert_close(reward, torch.tensor([0.5, 0.6, 0.7]))
    torch.testing.assert_close(discount, torch.tensor([0.9, 0.0, 0.9]))


# ---- SAC --------------------------------------------------------------------------------------------
def fill_tiny_buffer(algo) -> torch.Generator:
    """8 random transitions (obs 2, action 1) with terminal and running rows; returns the generator."""
    g = torch.Generator().manual_seed(5)
    algo.buffer.add(obs=torch.randn(8, 2, generator=g), cobs=torch.randn(8, 2, generator=g),
                    action=torch.rand(8, 1, generator=g) * 2 - 1, reward=torch.randn(8, generator=g),
                    discount=0.9 * torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0]),  # gamma (1 - done)
                    next_obs=torch.randn(8, 2, generator=g), next_cobs=torch.randn(8, 2, generator=g))
    return g


def test_sac_critic_target_and_loss():
    cfg = SACConfig(batch_size=4, warmup_steps=0, gamma=0.9, init_alpha=0.3, tau=0.1, buffer_size=16,
                    actor_every=2)
    obs_space, act_space = spaces(2, 1)
    algo = SAC(cfg, PolicyConfig(actor_hidden=[8], critic_hidden=[8]), obs_space, act_space, 8,
               torch.device("cpu"), seed=0)
    g = fill_tiny_buffer(algo)
    with torch.no_grad():  # target critics differ from the online ones, so using the wrong one shows
        for p in algo.q_target.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    pi, q, q_target = (copy.deepcopy(m) for m in (algo.pi, algo.q, algo.q_target))
    gen_state = algo.generator.get_state()

    metrics = algo._gradient_step()

    gen = torch.Generator().manual_seed(0)
    gen.set_state(gen_state)  # replay the same minibatch and next-action noise
    with torch.no_grad():
        b = algo.buffer.sample(4, gen)
        next_a, next_logp = pi.sample(b["next_obs"], gen)
        q1, q2 = q_target(b["next_cobs"], next_a)
        # y = r + gamma (1 - done) (min(Q1', Q2') - alpha log pi(a'|s')), alpha = 0.3
        y = b["reward"] + b["discount"] * (torch.minimum(q1, q2) - 0.3 * next_logp)
        qa, qb = q(b["cobs"], b["action"])
        # L = 0.5 * (mean (Q1 - y)^2 + mean (Q2 - y)^2)
        expected = 0.5 * (((qa - y) ** 2).mean() + ((qb - y) ** 2).mean())
    assert 0 < (b["discount"] == 0).sum() < 4, "the batch should mix terminal and running rows"
    assert float(metrics["sac/critic_loss"]) == pytest.approx(float(expected), rel=1e-6)
    assert float(metrics["sac/alpha"]) == pytest.approx(0.3, rel=1e-6)
    # Polyak: theta' <- theta' + tau (theta_new - theta')
    for p_t, p_old, p_new in zip(algo.q_target.parameters(), q_target.parameters(), algo.q.parameters()):
        torch.testing.assert_close(p_t, p_old + 0.1 * (p_new - p_old), rtol=1e-6, atol=1e-7)


def test_td3_target_actor_loss_and_delayed_targets():
    cfg = TD3Config(batch_size=4, warmup_steps=0, gamma=0.9, tau=0.1, buffer_size=16, actor_every=2,
                    target_noise=0.2, target_noise_clip=0.1)
    obs_space, act_space = spaces(2, 1)
    algo = TD3(cfg, PolicyConfig(actor_hidden=[8], critic_hidden=[8]), obs_space, act_space, 8,
               torch.device("cpu"), seed=0)
    g = fill_tiny_buffer(algo)
    with torch.no_grad():  # targets differ from the online networks, so using the wrong one shows
        for p in [*algo.q_target.parameters(), *algo.pi_target.parameters()]:
            p.add_(0.1 * torch.randn(p.shape, generator=g))

    def replay_step():
        pi, pi_t, q, q_t = (copy.deepcopy(m) for m in (algo.pi, algo.pi_target, algo.q, algo.q_target))
        gen = torch.Generator().manual_seed(0)
        gen.set_state(algo.generator.get_state())  # replay the same minibatch and smoothing noise
        metrics = algo._gradient_step()
        with torch.no_grad():
            b = algo.buffer.sample(4, gen)
            mu = pi_t(b["next_obs"])
            eps = torch.randn(mu.shape, generator=gen) * 0.2
            # a' = clip(pi'(s') + clip(eps, -0.1, 0.1), -1, 1); y = r + 0.9 (1 - d) min(Q1', Q2')(s', a')
            next_a = (mu + eps.clamp(-0.1, 0.1)).clamp(-1, 1)
            y = b["reward"] + b["discount"] * q_t(b["next_cobs"], next_a).min(0).values
            qa, qb = q(b["cobs"], b["action"])
            expected = 0.5 * (((qa - y) ** 2).mean() + ((qb - y) ** 2).mean())
            actor_loss = -q(b["cobs"], pi(b["obs"]))[0].mean()  # -E[Q1(s, pi(s))] with pre-step critic
        return metrics, expected, actor_loss, pi_t, q_t

    metrics, expected, _, pi_t, q_t = replay_step()  # update 1: critic only, targets frozen
    assert float(metrics["td3/critic_loss"]) == pytest.approx(float(expected), rel=1e-6)
    assert "td3/actor_loss" not in metrics
    for a, b in zip([*algo.q_target.parameters(), *algo.pi_target.parameters()],
                    [*q_t.parameters(), *pi_t.parameters()]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    metrics, expected, actor_loss, pi_t, q_t = replay_step()  # update 2: actor and targets move
    assert float(metrics["td3/critic_loss"]) == pytest.approx(float(expected), rel=1e-6)
    assert float(metrics["td3/actor_loss"]) == pytest.approx(float(actor_loss), rel=1e-6)
    for p_t, p_old, p_new in zip(algo.pi_target.parameters(), pi_t.parameters(), algo.pi.parameters()):
        torch.testing.assert_close(p_t, p_old + 0.1 * (p_new - p_old), rtol=1e-6, atol=1e-7)


def test_td3_target_actor_scales_its_inputs_as_the_actor_and_follows_a_warm_start():
    """Polyak averaging moves the target actor's weights only; its observation normalizer's statistics (buffers)
    are the actor's at every gradient step (they were the initial zeros/ones forever), and a warm-started actor
    (``init=RUN``: ``actor_loaded``) is its own target from the start."""
    from embodied.policies import update_normalizer

    cfg = TD3Config(batch_size=4, warmup_steps=0, buffer_size=16, actor_every=2)
    obs_space, act_space = spaces(2, 1)
    algo = TD3(cfg, PolicyConfig(actor_hidden=[8], critic_hidden=[8]), obs_space, act_space, 8,
               torch.device("cpu"), seed=0)
    fill_tiny_buffer(algo)
    update_normalizer(algo.pi, torch.arange(20.0).reshape(10, 2))  # mean (9, 10), var 33
    algo._gradient_step()  # a critic-only step: the target's weights stay, its input scaling is the actor's
    assert algo.pi_target.normalizer.mean.tolist() == [9.0, 10.0]
    torch.testing.assert_close(algo.pi_target.normalizer.var, algo.pi.normalizer.var, rtol=0, atol=0)
    with torch.no_grad():
        for p in algo.pi.parameters():
            p.add_(1.0)  # weights from elsewhere (a warm start)
    algo.actor_loaded()
    x = torch.randn(5, 2)
    torch.testing.assert_close(algo.pi_target(x), algo.pi(x), rtol=0, atol=0)


def test_td3_deploy_average_ships_the_target_actor():
    """deploy_average: ``actor()`` (evaluation, checkpoints, export) is the Polyak-averaged target actor with the
    actor's input scaling, while exploration acts with the actor; a warm start loaded into it reaches both."""
    from embodied.policies import update_normalizer

    cfg = TD3Config(batch_size=4, warmup_steps=0, buffer_size=16, actor_every=1, tau=0.5, deploy_average=True,
                    exploration_noise=0.0)
    obs_space, act_space = spaces(2, 1)
    algo = TD3(cfg, PolicyConfig(actor_hidden=[8], critic_hidden=[8]), obs_space, act_space, 8,
               torch.device("cpu"), seed=0)
    fill_tiny_buffer(algo)
    before = [p.clone() for p in algo.pi.parameters()]
    algo._gradient_step()  # actor and target move: target = (before + actor) / 2 at tau 0.5
    for t, b, p in zip(algo.pi_target.parameters(), before, algo.pi.parameters()):
        torch.testing.assert_close(t, b + 0.5 * (p - b), rtol=1e-6, atol=1e-7)
    assert algo.actor() is algo.pi_target and algo.pi_average is algo.pi_target
    update_normalizer(algo.pi, torch.arange(20.0).reshape(10, 2))
    assert algo.actor().normalizer.mean.tolist() == [9.0, 10.0]
    x = torch.randn(8, 2)
    assert torch.equal(algo.act({"policy": x}), algo.pi.act(x))  # exploration: the actor (noise 0)
    assert not torch.equal(algo.actor().act(x), algo.pi.act(x))
    with torch.no_grad():
        for p in algo.actor().parameters():
            p.add_(1.0)  # a warm start loads into actor()
    algo.actor_loaded()
    torch.testing.assert_close(algo.pi(x), algo.pi_target(x), rtol=0, atol=0)


def _one_averaged_step(algo_cls, cfg, rate: float):
    """A learner with ``deploy_average`` after one gradient step, its average checked to have moved by ``rate``."""
    obs_space, act_space = spaces(2, 1)
    algo = algo_cls(cfg, PolicyConfig(actor_hidden=[8], critic_hidden=[8]), obs_space, act_space, 8,
                    torch.device("cpu"), seed=0)
    fill_tiny_buffer(algo)
    avg = [p.clone() for p in algo.pi_average.parameters()]
    algo._gradient_step()
    for a, old, new in zip(algo.pi_average.parameters(), avg, algo.pi.parameters()):
        torch.testing.assert_close(a, old + rate * (new - old), rtol=1e-6, atol=1e-7)
    return algo


def test_sac_deploy_average_is_a_polyak_copy_checkpointed():
    """SAC with deploy_average keeps a copy of its actor that each actor step moves by tau; ``actor()`` is that
    copy; it round-trips through ``state_dict``."""
    cfg = SACConfig(batch_size=4, warmup_steps=0, buffer_size=16, actor_every=1, tau=0.25, deploy_average=True)
    obs_space, act_space = spaces(2, 1)
    algo = _one_averaged_step(SAC, cfg, 0.25)
    assert algo.actor() is algo.pi_average and not torch.equal(algo.pi.net[0].weight, algo.pi_average.net[0].weight)
    other = SAC(cfg, PolicyConfig(actor_hidden=[8], critic_hidden=[8]), obs_space, act_space, 8,
                torch.device("cpu"), seed=1)
    other.load_state_dict(algo.state_dict())
    for a, b in zip(other.pi_average.parameters(), algo.pi_average.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("algo_cls,cfg_cls", [(TD3, TD3Config), (SAC, SACConfig)], ids=["td3", "sac"])
def test_deploy_average_at_its_own_rate(algo_cls, cfg_cls):
    """average_tau: the shipped average moves by its own rate on actor steps, apart from the critic targets' tau
    (TD3 then keeps it beside its target actor)."""
    cfg = cfg_cls(batch_size=4, warmup_steps=0, buffer_size=16, actor_every=1, tau=0.5, deploy_average=True,
                  average_tau=0.125)
    algo = _one_averaged_step(algo_cls, cfg, 0.125)
    obs_space, act_space = spaces(2, 1)
    assert algo.actor() is algo.pi_average and algo.pi_average is not getattr(algo, "pi_target", None)
    with pytest.raises(UserError, match="average_tau"):
        algo_cls(cfg_cls(average_tau=0.0), PolicyConfig(actor_hidden=[8]), obs_space, act_space, 8,
                 torch.device("cpu"), seed=0)


def test_td3_exploration_stays_in_action_space():
    cfg = TD3Config(warmup_steps=0, exploration_noise=5.0)
    obs_space, act_space = spaces(2, 1)
    algo = TD3(cfg, PolicyConfig(actor_hidden=[8]), obs_space, act_space, 64, torch.device("cpu"), seed=0)
    a = algo.act({"policy": torch.randn(64, 2)})
    assert a.shape == (64, 1) and a.abs().max() <= 1.0 and a.std() > 0.5


def test_fused_adam_matches_torch_adam_with_skipped_groups_and_clipping():
    """FusedAdam over explicit gradients == torch.optim.Adam(fused=True) over .grad, including a
    group that sits out some steps (grad None in torch) and global-norm clipping per group."""
    from embodied.algos.optim import FusedAdam, clip_grad_norm_

    torch.manual_seed(0)
    nets = [nn.Linear(3, 4), nn.Linear(4, 2)]
    twins = copy.deepcopy(nets)
    ref = torch.optim.Adam([{"params": nets[0].parameters(), "lr": 1e-2, "weight_decay": 1e-4},
                            {"params": nets[1].parameters(), "lr": 3e-3, "weight_decay": 0.0}], fused=True)
    mine = FusedAdam([{"params": list(twins[0].parameters()), "lr": 1e-2, "weight_decay": 1e-4},
                      {"params": list(twins[1].parameters()), "lr": 3e-3, "weight_decay": 0.0}])
    for t in range(6):
        x = torch.randn(8, 3)
        both = t % 2 == 1
        ref.zero_grad(set_to_none=True)
        (nets[1](nets[0](x)) ** 2).sum().backward(inputs=[p for n in (nets if both else nets[:1])
                                                          for p in n.parameters()])
        for n in (nets if both else nets[:1]):
            nn.utils.clip_grad_norm_(list(n.parameters()), 0.5)
        ref.step()
        params = [list(n.parameters()) for n in (twins if both else twins[:1])]
        flat = torch.autograd.grad((twins[1](twins[0](x)) ** 2).sum(), [p for ps in params for p in ps])
        grads = {0: flat[:2]} | ({1: flat[2:]} if both else {})
        for g in grads.values():
            clip_grad_norm_(g, 0.5)
        mine.step(grads)
        for a, b in zip([p for n in nets for p in n.parameters()], [p for n in twins for p in n.parameters()]):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
    assert int(mine.steps[0][0]) == 6 and int(mine.steps[1][0]) == 3
    # a step is an in-place write: the moved parameters' version counters say so, the others' do not
    versions = [p._version for n in twins for p in n.parameters()]
    mine.step({1: [torch.ones_like(p) for p in twins[1].parameters()]})
    assert [p._version for n in twins for p in n.parameters()] == [*versions[:2], *(v + 1 for v in versions[2:])]


def test_ppo_linear_lr_schedule_and_adam_eps():
    """lr_schedule=linear: the k-th update runs at lr (1 - k N T / total_steps); adam_eps reaches Adam."""
    from embodied.algos.ppo import PPO, PPOConfig
    from embodied.config import PolicyConfig

    obs_space = gym.spaces.Dict({"policy": gym.spaces.Box(-1, 1, (3,), np.float32)})
    act_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    cfg = PPOConfig(num_steps=4, num_minibatches=1, num_epochs=1, lr=1e-3, lr_schedule="linear", adam_eps=1e-5)
    algo = PPO(cfg, PolicyConfig(), obs_space, act_space, num_envs=2, device="cpu", seed=0, total_steps=32)
    assert algo.opt.param_groups[0]["eps"] == 1e-5
    lrs = []
    for _ in range(3):
        for _ in range(4):
            obs = {"policy": torch.rand(2, 3)}
            action, extras = algo.act(obs)
            algo.observe(Transition(obs, action, torch.rand(2), torch.zeros(2, dtype=torch.bool),
                                    torch.zeros(2, dtype=torch.bool), {"policy": torch.rand(2, 3)}, extras))
        lrs.append(algo.update()["ppo/lr"])
    assert lrs == pytest.approx([1e-3, 1e-3 * (1 - 8 / 32), 1e-3 * (1 - 16 / 32)])


def test_lambda_returns_exact():
    from embodied.algos.returns import segment_lambda_returns

    r = torch.tensor([[1.0, 2.0]])
    v = torch.tensor([[10.0, 20.0]])  # v(s_1), v(s_2): each step's next observation
    no = torch.zeros(1, 2, dtype=torch.bool)
    # R_2 = 20; R_1 = 2 + 0.5 (0.5 * 20 + 0.5 * 20) = 12; R_0 = 1 + 0.5 (0.5 * 10 + 0.5 * 12) = 6.5
    assert torch.allclose(segment_lambda_returns(r, no, no, v, 0.5, 0.5), torch.tensor([[6.5, 12.0]]))
    # the episode ends (terminates) after step 1: R_1 = 2, R_0 = 1 + 0.5 (5 + 1) = 4
    end = torch.tensor([[False, True]])
    assert torch.allclose(segment_lambda_returns(r, end, end, v, 0.5, 0.5), torch.tensor([[4.0, 2.0]]))
    # lam = 0: one-step TD targets; lam = 1: discounted rewards plus the bootstrap at the horizon
    assert torch.allclose(segment_lambda_returns(r, no, no, v, 0.5, 0.0), torch.tensor([[6.0, 12.0]]))
    assert torch.allclose(segment_lambda_returns(r, no, no, v, 0.5, 1.0),
                          torch.tensor([[1 + 0.5 * 2 + 0.25 * 20, 2 + 0.5 * 20]]))
    with pytest.raises(ValueError):
        segment_lambda_returns(r, no, no, v[:, :1], 0.5, 0.5)


def test_imagined_lambda_returns_exact():
    from embodied.algos.returns import imagined_lambda_returns

    r = torch.tensor([[1.0], [2.0]])  # [H = 2, B = 1]
    v = torch.tensor([[0.0], [10.0], [20.0]])  # v(s_0), v(s_1), v(s_2)
    c = torch.tensor([[1.0], [0.5]])  # the episode goes on after step 0 surely, after step 1 with probability 0.5
    # R_2 = 20; R_1 = 2 + 0.5 * 0.5 (0.5 * 20 + 0.5 * 20) = 7; R_0 = 1 + 0.5 * 1 * (0.5 * 10 + 0.5 * 7) = 5.25
    assert imagined_lambda_returns(r, c, v, 0.5, 0.5).flatten().tolist() == [5.25, 7.0]
    # differentiable: dR_0/dr_1 = gamma c_0 lam = 0.25, dR_0/dv_2 = gamma c_0 lam gamma c_1 = 0.0625
    r.requires_grad_(True)
    v.requires_grad_(True)
    imagined_lambda_returns(r, c, v, 0.5, 0.5)[0, 0].backward()
    assert r.grad.flatten().tolist() == [1.0, 0.25] and v.grad.flatten().tolist() == [0.0, 0.25, 0.0625]
    with pytest.raises(ValueError):
        imagined_lambda_returns(r, c, v[:2], 0.5, 0.5)


def test_percentile_scale_exact():
    from embodied.algos.returns import PercentileScale

    s = PercentileScale(rate=0.01, limit=1.0)
    returns = torch.linspace(0, 100, 101)  # P5 = 5, P95 = 95
    assert float(s.update(returns)) == 1.0  # EMAs 0.05 and 0.95: spread 0.9, below the limit
    assert float(s.low) == pytest.approx(0.05) and float(s.high) == pytest.approx(0.95)
    for _ in range(2000):
        s.update(returns)
    assert float(s.scale) == pytest.approx(90.0, rel=1e-5)  # float32 EMAs
    copy = PercentileScale()
    copy.load_state_dict(s.state_dict())
    assert float(copy.scale) == float(s.scale)


def test_segment_lambda_returns_cut_at_episode_ends():
    from embodied.algos.returns import segment_lambda_returns

    r = torch.ones(1, 3)
    v = torch.tensor([[5.0, 9.0, 7.0]])  # value of each step's own next observation
    f, t = torch.tensor([[False, False, False]]), torch.tensor([[False, True, False]])
    # terminated at t=1: R_2 = 1 + 0.5 * 7 = 4.5 (the segment's end bootstraps); R_1 = 1; R_0 = 1 + 0.5 (2.5 + 0.5)
    assert torch.allclose(segment_lambda_returns(r, t, t, v, 0.5, 0.5), torch.tensor([[2.5, 1.0, 4.5]]))
    # truncated at t=1: R_1 = 1 + 0.5 * 9 (its final state), R_0 = 1 + 0.5 (0.5 * 5 + 0.5 * 5.5)
    assert torch.allclose(segment_lambda_returns(r, f, t, v, 0.5, 0.5), torch.tensor([[3.625, 5.5, 4.5]]))
    # nothing ends: R_2 = 4.5, R_1 = 1 + 0.5 (0.5 * 9 + 0.5 * 4.5) = 4.375, R_0 = 1 + 0.5 (0.5 * 5 + 0.5 * 4.375)
    assert torch.allclose(segment_lambda_returns(r, f, f, v, 0.5, 0.5), torch.tensor([[3.34375, 4.375, 4.5]]))


def test_td3_correlated_exploration_noise_is_an_ar1_process_through_each_episode():
    """td3.noise_correlation: a = mu + std n_t, n_t = rho n_{t-1} + sqrt(1 - rho^2) e_t with e_t the generator's
    standard normals, n fresh (= e_t) at each env's episode start; stationary N(0, 1) with lag-1 correlation rho;
    rho 0 draws exactly what plain TD3 draws; the state rides in the checkpoint; outside [0, 1) one clear error."""
    rho, std, n, act_dim = 0.8, 0.01, 4, 2
    obs_space, act_space = spaces(3, act_dim)

    def make(corr):
        cfg = TD3Config(warmup_steps=0, exploration_noise=std, noise_correlation=corr, kernel="torch")
        return TD3(cfg, PolicyConfig(actor_hidden=[8], obs_normalization=False), obs_space, act_space, n,
                   torch.device("cpu"), seed=3)

    algo, white = make(rho), make(0.0)
    obs = {"policy": torch.randn(n, 3)}
    mu = algo.pi.act(obs["policy"])
    replay = torch.Generator().manual_seed(0)
    replay.set_state(algo.generator.get_state())
    expected = None
    for t in range(5):
        if t == 3:  # env 1's episode ends after the third step: its fourth starts a fresh noise
            ended = torch.tensor([False, True, False, False])
            algo.observe(Transition(obs, torch.zeros(n, act_dim), torch.zeros(n), ended, torch.zeros(n, dtype=bool),
                                    obs))
        e = torch.randn(n, act_dim, generator=replay)
        expected = e if expected is None else rho * expected + math.sqrt(1 - rho * rho) * e
        if t == 3:
            expected[1] = e[1]
        got = algo.act(obs)
        torch.testing.assert_close(got, mu + std * expected, rtol=0, atol=1e-7)
    state = algo.state_dict()
    twin = make(rho)
    twin.load_state_dict(state)
    torch.testing.assert_close(twin.noise, algo.noise, rtol=0, atol=0)
    torch.testing.assert_close(twin.act(obs), algo.act(obs), rtol=0, atol=0)
    # rho 0: the plain draws (same generator, same actor)
    white.pi.load_state_dict(algo.pi.state_dict())
    replay.set_state(white.generator.get_state())
    torch.testing.assert_close(white.act(obs), (mu + std * torch.randn(n, act_dim, generator=replay)).clamp(-1, 1),
                               rtol=0, atol=1e-7)
    # the process's statistics over a long episode: unit variance, lag-1 correlation rho
    many = TD3(TD3Config(warmup_steps=0, exploration_noise=1.0, noise_correlation=rho, kernel="torch"),
               PolicyConfig(actor_hidden=[8], obs_normalization=False), obs_space, act_space, 256,
               torch.device("cpu"), seed=1)
    big = {"policy": torch.zeros(256, 3)}
    noises = []
    for _ in range(200):
        many.act(big)
        noises.append(many.noise.clone())
    x = torch.stack(noises[20:])  # [T, N, A]
    assert float(x.var()) == pytest.approx(1.0, abs=0.03)
    assert float((x[1:] * x[:-1]).mean() / x.var()) == pytest.approx(rho, abs=0.02)
    for bad in (1.0, -0.1):
        with pytest.raises(UserError, match="noise_correlation"):
            make(bad)
