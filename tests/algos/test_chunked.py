"""Action-chunked policies (issue 12): the chunk targets of a flat dataset, the per-env queues of ``act`` (executed
open loop, restarted by ``reset``, not advanced by ``peek``), and a residual over a chunked base acting exactly as the
base at initialization."""

from __future__ import annotations

import torch

from embodied.algos.bc import chunk_targets, grounding_labels
from embodied.policies import ChunkedActor, ResidualActor, policy_spec
from embodied.policies.actor_critic import DeterministicActor


def test_chunk_targets_exact_values():
    action = torch.tensor([[0.0], [1.0], [2.0], [10.0], [11.0]])  # episode 0: steps 0-2, episode 1: steps 3-4
    episode = torch.tensor([0, 0, 0, 1, 1])
    out = chunk_targets(action, episode, 3)[..., 0]
    assert out.tolist() == [[0, 1, 2], [1, 2, 2], [2, 2, 2], [10, 11, 11], [11, 11, 11]]


def test_grounding_labels_exact_values():
    # three entities; episode 0 (3 steps) carries entity 1 onto entity 2 (1 cm off in x), episode 1 (2 steps) lifts
    # entity 0 straight up (it ends over no other entity), episode 2 (1 step) moves nothing: no labels
    pos = torch.zeros(6, 3, 3)
    pos[:, 2] = torch.tensor([0.3, 0.0, 0.0])
    pos[:3, 1] = torch.tensor([[0.0, 0.2, 0.0], [0.1, 0.1, 0.1], [0.31, 0.0, 0.04]])
    pos[3:5, 0] = torch.tensor([[0.0, -0.2, 0.0], [0.0, -0.2, 0.15]])
    pos[5, 1] = torch.tensor([0.5, 0.5, 0.0])
    episode = torch.tensor([0, 0, 0, 1, 1, 2])
    moved, onto = grounding_labels(pos, episode)
    assert moved.tolist() == [1, 1, 1, 0, 0, -1]
    assert onto.tolist() == [2, 2, 2, -1, -1, -1]
    _, onto = grounding_labels(pos, episode, near=0.005)  # 1 cm off is not on it at a 5 mm radius
    assert onto.tolist() == [-1, -1, -1, -1, -1, -1]
    # episode 1 lifts entity 0 to 0.15 m right over entity 2 instead: held up over it (0.15 m >= above), on nothing;
    # with a taller ``above`` it counts as on it; episode 0's 0.04 m over entity 2 is on it either way
    pos[4, 0] = torch.tensor([0.3, 0.0, 0.15])
    assert grounding_labels(pos, episode)[1].tolist() == [2, 2, 2, -1, -1, -1]
    assert grounding_labels(pos, episode, above=0.2)[1].tolist() == [2, 2, 2, 2, 2, -1]
    assert grounding_labels(pos, episode, above=0.03)[1].tolist() == [-1, -1, -1, -1, -1, -1]


def _counting_actor() -> ChunkedActor:
    """A chunk of ``tanh(obs[0] + k / 10)`` for k = 0..3: each action says which chunk and which step it is."""
    pi = ChunkedActor(1, 1, [], horizon=4, execute=2)
    with torch.no_grad():
        pi.net[0].weight.fill_(1.0)
        pi.net[0].bias.copy_(torch.arange(4) / 10)
    return pi


def test_chunk_queues_execute_reset_and_peek_per_env():
    pi = _counting_actor()
    a = lambda x: torch.atanh(pi.act(torch.tensor(x)[:, None]))[:, 0]  # noqa: E731
    assert torch.allclose(a([0.0, 0.5]), torch.tensor([0.0, 0.5]), atol=1e-5)
    # the second action of the same chunks, whatever the observation now
    assert torch.allclose(a([0.9, 0.9]), torch.tensor([0.1, 0.6]), atol=1e-5)
    assert torch.allclose(a([0.2, -0.3]), torch.tensor([0.2, -0.3]), atol=1e-5)  # executed 2: new chunks
    pi.reset(torch.tensor([False, True]))  # env 1 starts a new episode: its queue is dropped
    peeked = torch.atanh(pi.peek(torch.tensor([[0.7], [0.7]])))[:, 0]
    assert torch.allclose(peeked, torch.tensor([0.3, 0.7]), atol=1e-5)  # peek: nothing advances
    assert torch.allclose(a([0.7, 0.7]), torch.tensor([0.3, 0.7]), atol=1e-5)
    pi.reset()
    assert torch.allclose(a([-0.4, -0.4]), torch.tensor([-0.4, -0.4]), atol=1e-5)


def test_a_residual_over_a_chunked_base_starts_as_the_base():
    torch.manual_seed(0)
    base = ChunkedActor(3, 2, [16], horizon=4, execute=3)
    residual = DeterministicActor(5, 2, [16])
    with torch.no_grad():
        residual.net[-1].weight.zero_()
        residual.net[-1].bias.zero_()
    combined = ResidualActor(policy_spec(base), policy_spec(residual))
    combined.base.load_state_dict(base.state_dict())
    combined.residual.load_state_dict(residual.state_dict())
    for t in range(7):
        obs = torch.randn(4, 3)
        assert torch.equal(combined.act(obs), base.act(obs)), t
        if t == 4:
            mask = torch.tensor([True, False, True, False])
            combined.reset(mask)
            base.reset(mask)


def test_temporal_ensembling_exact_values():
    """ACT's temporal ensembling: every step a new chunk; the action is the mean of the kept chunks' predictions
    for this step weighted exp(m * age), per env, forgotten on reset; peek does not advance."""
    import math

    pi = _counting_actor()  # chunk from obs x: tanh(x + k / 10), k = 0..3
    pi.ensemble = 0.5
    w = [math.exp(0.5 * j) for j in range(4)]
    a = lambda x: pi.act(torch.tensor(x)[:, None])[:, 0]  # noqa: E731
    xs = [0.0, 0.3, -0.2, 0.5, 0.1]
    for t, x in enumerate(xs):
        # the chunk made j steps ago (from xs[t - j]) predicts this step with its entry j
        preds = [(w[j], math.tanh(xs[t - j] + j / 10)) for j in range(min(t + 1, 4))]
        expected = sum(wj * p for wj, p in preds) / sum(wj for wj, _ in preds)
        if t == 3:
            assert math.isclose(float(pi.peek(torch.tensor([[x], [x]]))[0, 0]), expected, abs_tol=1e-6)
        assert math.isclose(float(a([x, x])[0]), expected, abs_tol=1e-6), t
    pi.reset(torch.tensor([True, False]))
    out = a([0.25, 0.25])
    assert math.isclose(float(out[0]), math.tanh(0.25), abs_tol=1e-6) and not math.isclose(float(out[1]),
                                                                                             math.tanh(0.25))
