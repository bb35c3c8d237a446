"""The VLA's pieces: FiLM conditioning, encoders, heads and their losses."""

from __future__ import annotations

import math

import pytest
import torch

from embodied.policies.actor_critic import sample_action
from embodied.vla.model import EntityPointers, FiLMConvEncoder, TermTokens, TinyViT, VLAPolicy, soft_bin_cross_entropy

STATE, TEXT = 10, 384


def test_film_starts_as_identity_and_conditions_once_trained():
    enc = FiLMConvEncoder((6, 32, 32), TEXT)
    img, g = torch.rand(3, 6 * 32 * 32), torch.Generator().manual_seed(0)
    t1, t2 = torch.randn(3, TEXT, generator=g), torch.randn(3, TEXT, generator=g)
    assert enc(img, t1).shape == (3, 64)
    assert torch.allclose(enc(img, t1), enc(img, t2))  # zero-initialized FiLM: the identity
    with torch.no_grad():
        for film in enc.films:
            film.weight.normal_(0, 0.1, generator=g)
    assert not torch.allclose(enc(img, t1), enc(img, t2))


def test_vit_reads_the_instruction_token():
    vit = TinyViT((6, 32, 32), TEXT)
    img = torch.rand(2, 6 * 32 * 32)
    out1, out2 = vit(img, torch.randn(2, TEXT)), vit(img, torch.randn(2, TEXT))
    assert out1.shape == (2, 128) and not torch.allclose(out1, out2)


def test_term_tokens_share_one_encoder_per_kind():
    # proprio (3), two objects of one kind (4 each), a surface (2): swapping the two objects' values together with
    # their identity embeddings leaves the output exactly as it was (one shared encoder, nothing else tells them apart)
    tok = TermTokens([[0, 3], [3, 4], [7, 4], [11, 2]], [0, 1, 1, 2], TEXT)
    assert len(tok.encoders) == 3
    g = torch.Generator().manual_seed(0)
    state, text = torch.randn(5, 13, generator=g), torch.randn(5, TEXT, generator=g)
    out = tok(state, text)
    assert out.shape == (5, 64)
    swapped = torch.cat([state[:, :3], state[:, 7:11], state[:, 3:7], state[:, 11:]], 1)
    assert not torch.allclose(tok(swapped, text), out, atol=1e-4)  # the identities differ
    with torch.no_grad():
        tok.identity[:, [2, 3]] = tok.identity[:, [3, 2]]
    assert torch.allclose(tok(swapped, text), out, atol=1e-6)
    with pytest.raises(ValueError, match="differ in size"):
        TermTokens([[0, 3], [3, 4]], [0, 0], TEXT)


def test_entity_pointers_hand_over_the_entity_they_point_at():
    # proprio (3), two cubes of one kind (4 each), two surfaces of another (3 each): four entities
    ptr = EntityPointers([[0, 3], [3, 4], [7, 4], [11, 3], [14, 3]], [0, 1, 1, 2, 2], TEXT)
    assert ptr.out_dim == 2 * 64 and len(ptr.keys) == 2
    g = torch.Generator().manual_seed(0)
    state, text = torch.randn(5, 17, generator=g), torch.randn(5, TEXT, generator=g)
    assert torch.equal(ptr.entities(state), torch.stack([state[:, 3:6], state[:, 7:10], state[:, 11:14],
                                                         state[:, 14:17]], 1))
    logits, values = ptr.attention(state, text)
    assert logits.shape == (5, 2, 4) and values.shape == (5, 4, 64)
    # the value of an entity is the linear map of its own entries
    assert torch.allclose(values[:, 1], ptr.values[0](state[:, 7:11]), atol=1e-6)
    assert torch.allclose(values[:, 3], ptr.values[1](state[:, 14:17]), atol=1e-6)
    # a sharp pointer returns exactly the entity it points at: the second cube (query along that cube's identity)
    with torch.no_grad():
        for lin in (ptr.keys[0], ptr.keys[1], ptr.query):
            lin.weight.zero_()
            lin.bias.zero_()
        ptr.identity.zero_()
        ptr.identity[0, 1, 0] = 1.0
        ptr.query.bias[0] = 1e4  # pointer 0 scores entity 1 at 1e4 / 8, the rest at 0
    out = ptr(state, text)
    assert torch.allclose(out[:, :64], values[:, 1], atol=1e-6)
    assert torch.allclose(out[:, 64:], values.mean(1), atol=1e-6)  # pointer 1 scores all alike: the mean
    # two cubes swapped together with their identities: the same output
    ptr2 = EntityPointers([[0, 3], [3, 4], [7, 4], [11, 3], [14, 3]], [0, 1, 1, 2, 2], TEXT)
    out = ptr2(state, text)
    swapped = torch.cat([state[:, :3], state[:, 7:11], state[:, 3:7], state[:, 11:]], 1)
    with torch.no_grad():
        ptr2.identity[:, [0, 1]] = ptr2.identity[:, [1, 0]]
    assert torch.allclose(ptr2(swapped, text), out, atol=1e-5)
    with pytest.raises(ValueError, match="no kind of state term occurs more than once"):
        EntityPointers([[0, 3], [3, 4]], [0, 1], TEXT)


def test_pointer_vla_reads_the_objects_only_through_its_pointers():
    # [proprio 3 | cube 4 | cube 4 | instruction]: with every pointer scoring alike the trunk sees the cubes' mean
    # value, so exchanging the two cubes' entries (identities zero) leaves the action as it was
    obs_dim = 11 + TEXT
    pi = VLAPolicy(obs_dim, 2, [11, TEXT], terms=[[0, 3, 0], [3, 4, 1], [7, 4, 1]], state_encoder="pointers",
                   obs_normalization=False)
    assert pi.context_idx.tolist() == [0, 1, 2]
    with torch.no_grad():
        pi.pointers.identity.zero_()
    obs = torch.randn(4, obs_dim, generator=torch.Generator().manual_seed(1))
    swapped = torch.cat([obs[:, :3], obs[:, 7:11], obs[:, 3:7], obs[:, 11:]], 1)
    assert torch.allclose(pi.chunk(obs), pi.chunk(swapped))
    assert pi.pointer_logits(obs).shape == (4, 2, 2)
    with pytest.raises(ValueError, match="tokens or pointers"):
        VLAPolicy(obs_dim, 2, [11, TEXT], terms=[[0, 3, 0], [3, 4, 1], [7, 4, 1]], state_encoder="graph")


SCENE = [[0, 3, 0], [3, 4, 1], [7, 4, 1], [11, 3, 2], [14, 3, 2]]  # proprio 3 | cube 4 | cube 4 | surface 3 | surface 3


def _sharp_pointers(first: int, second: int, seed: int, **kw) -> tuple[VLAPolicy, torch.Tensor]:
    """A pointer VLA over ``SCENE`` (then the instruction) whose pointer 0 picks entity ``first`` and pointer 1
    entity ``second`` whatever the input (queries and keys zero, one identity entry each, scores 1e4 / 8), with a
    normalizer fitted away from the identity; and 6 observations."""
    obs_dim = 17 + TEXT
    pi = VLAPolicy(obs_dim, 2, [17, TEXT], terms=SCENE, state_encoder="pointers", **kw)
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(6, obs_dim, generator=g)
    pi.normalizer.update(torch.randn(50, 17, generator=g) * 3 + 1)
    with torch.no_grad():
        for lin in (*pi.pointers.keys, pi.pointers.query):
            lin.weight.zero_()
            lin.bias.zero_()
        pi.pointers.identity.zero_()
        pi.pointers.identity[0, first, 0] = 1.0
        pi.pointers.identity[0, second, 1] = 1.0
        pi.pointers.query.bias[0] = 1e4
        pi.pointers.query.bias[64 + 1] = 1e4
    return pi, obs


def test_grounded_view_is_the_proprioception_and_the_entries_of_what_the_pointers_pick():
    # pointer 0 sharp on the second cube, pointer 1 on the second surface; the view is the raw proprio, then each
    # pointed entity's raw entries (a surface's padded with a zero to a cube's 4), whatever the normalizer makes of
    # the state the pointers score
    pi, obs = _sharp_pointers(1, 3, seed=4)
    expected = torch.cat([obs[:, :3], obs[:, 7:11], obs[:, 14:17], torch.zeros(6, 1)], 1)
    assert torch.equal(pi.grounded(obs), expected)
    with torch.no_grad():  # a flat pointer: the mean of the padded entries
        pi.pointers.query.bias.zero_()
        pi.pointers.identity.zero_()
    padded = torch.stack([obs[:, 3:7], obs[:, 7:11], torch.cat([obs[:, 11:14], torch.zeros(6, 1)], 1),
                          torch.cat([obs[:, 14:17], torch.zeros(6, 1)], 1)], 1)
    assert torch.allclose(pi.grounded(obs)[:, 3:7], padded.mean(1), atol=1e-6)
    with pytest.raises(ValueError, match="pointers"):
        VLAPolicy(17 + TEXT, 2, [17, TEXT]).grounded(obs)


def test_relation_reads_the_second_pointed_position_from_the_first_in_raw_units():
    # pointer 0 sharp on the first cube, pointer 1 on the second surface: the trunk's extra input is (surface 2 -
    # cube 1) / RELATION_SCALE from the raw positions
    from embodied.vla.model import RELATION_SCALE

    pi, obs = _sharp_pointers(0, 3, seed=5, relation=True)
    seen = {}
    pi.trunk[0].register_forward_hook(lambda m, i, o: seen.update(x=i[0]))
    pi.chunk(obs)
    assert torch.allclose(seen["x"][:, -3:], (obs[:, 14:17] - obs[:, 3:6]) / RELATION_SCALE, atol=1e-5)
    plain = VLAPolicy(17 + TEXT, 2, [17, TEXT], terms=SCENE, state_encoder="pointers")
    assert pi.trunk[0].in_features == plain.trunk[0].in_features + 3
    with pytest.raises(ValueError, match="relation needs entity pointers"):
        VLAPolicy(17 + TEXT, 2, [17, TEXT], relation=True)


def test_query_gain_scales_only_the_pointers_instruction_input_and_is_rebuilt_from_the_spec():
    from embodied.policies import build_policy

    obs_dim = 11 + TEXT
    kw = dict(terms=[[0, 3, 0], [3, 4, 1], [7, 4, 1]], state_encoder="pointers", obs_normalization=False)
    plain = VLAPolicy(obs_dim, 2, [11, TEXT], **kw)
    gained = VLAPolicy(obs_dim, 2, [11, TEXT], query_gain=5.0, **kw)
    gained.load_state_dict(plain.state_dict())
    obs = torch.randn(4, obs_dim, generator=torch.Generator().manual_seed(2))
    louder = torch.cat([obs[:, :11], 5.0 * obs[:, 11:]], 1)
    # the same weights: gain 5 scores the entities as gain 1 would score an instruction five times as long
    assert torch.allclose(gained.pointer_logits(obs), plain.pointer_logits(louder), atol=1e-6)
    assert not torch.allclose(gained.pointer_logits(obs), plain.pointer_logits(obs))
    # the trunk's own instruction input is not scaled: with a flat pointer the two read the same
    with torch.no_grad():
        for pi in (plain, gained):
            pi.pointers.query.weight.zero_()
            pi.pointers.query.bias.zero_()
    assert torch.allclose(gained.chunk(obs), plain.chunk(obs))
    rebuilt = build_policy({"name": "vla", "kwargs": gained.init_kwargs})
    assert rebuilt.pointers.query_gain == 5.0


def test_hard_pointers_hand_over_one_entity_and_pass_the_softmax_gradient():
    from embodied.policies import build_policy

    ptr = EntityPointers([[0, 3], [3, 4], [7, 4], [11, 3], [14, 3]], [0, 1, 1, 2, 2], TEXT, hard=True)
    logits = torch.tensor([[[0.5, 2.0, -1.0, 0.0], [1.0, 1.0, 3.0, -2.0]]], requires_grad=True)
    w = ptr.weigh(logits)
    assert torch.equal(w.detach(), torch.tensor([[[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]]))
    # the gradient is the softmax's: d(sum c * w) / d logits = s * (c - c . s) per pointer
    c = torch.tensor([[[1.0, -2.0, 0.5, 3.0], [0.0, 4.0, -1.0, 2.0]]])
    (w * c).sum().backward()
    s = torch.softmax(logits.detach(), -1)
    assert torch.allclose(logits.grad, s * (c - (c * s).sum(-1, keepdim=True)), atol=1e-6)
    # the trunk is handed exactly the value of the top-scored entity, however close the runner-up scores
    g = torch.Generator().manual_seed(3)
    state, text = torch.randn(5, 17, generator=g), torch.randn(5, TEXT, generator=g)
    with torch.no_grad():
        scores, values = ptr.attention(state, text)
        out = ptr(state, text)
    top = scores.argmax(-1)  # [5, 2]
    for p in range(2):
        assert torch.equal(out[:, 64 * p:64 * (p + 1)], values[torch.arange(5), top[:, p]])
    # a VLA with hard pointers: the relation reads the raw offset of the two top-scored entities, and the flag is
    # rebuilt from the spec; without pointers it is refused
    pi = VLAPolicy(17 + TEXT, 2, [17, TEXT], terms=SCENE, state_encoder="pointers", relation=True,
                   hard_pointers=True, obs_normalization=False)
    obs = torch.randn(6, 17 + TEXT, generator=g)
    seen = {}
    pi.trunk[0].register_forward_hook(lambda m, i, o: seen.update(x=i[0]))
    with torch.no_grad():
        pi.chunk(obs)
        top = pi.pointer_logits(obs)[:, :2].argmax(-1)
    at = pi.pointers.entities(obs[:, :17])[torch.arange(6)[:, None], top]  # [6, 2, 3]
    from embodied.vla.model import RELATION_SCALE
    assert torch.allclose(seen["x"][:, -3:], (at[:, 1] - at[:, 0]) / RELATION_SCALE, atol=1e-5)
    assert build_policy({"name": "vla", "kwargs": pi.init_kwargs}).pointers.hard
    with pytest.raises(ValueError, match="hard_pointers needs entity pointers"):
        VLAPolicy(17 + TEXT, 2, [17, TEXT], hard_pointers=True)


def test_trunk_without_text_reads_the_instruction_only_through_the_pointers():
    from embodied.policies import build_policy

    pi, obs = _sharp_pointers(1, 2, seed=4, text_features=0)
    other = torch.cat([obs[:, :17], torch.randn(6, TEXT, generator=torch.Generator().manual_seed(5))], 1)
    # the pointers' choice is fixed (queries zero): another instruction leaves the action exactly as it was
    assert torch.equal(pi.chunk(obs), pi.chunk(other))
    # the trunk's input is the proprioception's features then the two pointers' values (and nothing of the text)
    seen = {}
    pi.trunk[0].register_forward_hook(lambda m, i, o: seen.update(x=i[0]))
    with torch.no_grad():
        pi.chunk(obs)
    assert pi.text_net is None and seen["x"].shape == (6, 128 + 2 * 64)
    assert build_policy({"name": "vla", "kwargs": pi.init_kwargs}).text_net is None
    # with the default the same pointers' choice still lets the instruction through the trunk's own text input
    full, _ = _sharp_pointers(1, 2, seed=4)
    assert not torch.allclose(full.chunk(obs), full.chunk(other))
    with pytest.raises(ValueError, match="needs entity pointers"):
        VLAPolicy(17 + TEXT, 2, [17, TEXT], text_features=0)
    with pytest.raises(ValueError, match="text_features >= 0"):
        VLAPolicy(17 + TEXT, 2, [17, TEXT], terms=SCENE, state_encoder="pointers", text_features=-1)


def test_state_terms_of_a_language_task_group_objects_by_kind():
    from embodied.core.layout import Layout, Term
    from embodied.vla.build import state_terms

    cube = dict(size=5, unit="m", frame="world", description="pose")
    layout = Layout({"policy": (Term("grip", 3, "m"), Term("red", **cube), Term("blue", **cube),
                                Term("plate", 3, "m", "world"), Term("instruction", TEXT, source="instruction"))},
                    (), 20.0)
    assert state_terms(layout) == [[0, 3, 0], [3, 5, 1], [8, 5, 1], [13, 3, 2]]
    # in the policy: the state vector leaves the instruction out; tokens are read from it
    obs_dim = 16 + TEXT
    pi = VLAPolicy(obs_dim, 7, [16, TEXT], terms=state_terms(layout))
    assert pi.tokens.terms == [(0, 3), (3, 5), (8, 5), (13, 3)] and pi(torch.rand(2, obs_dim)).shape == (2, 7)


@pytest.mark.parametrize("kwargs", [{}, {"image": [STATE, 6, 32, 32]}, {"image": [STATE, 6, 32, 32], "vision": "vit"},
                                    {"head": "continuous"}])
def test_heads_shapes(kwargs):
    obs_dim = STATE + TEXT + (6 * 32 * 32 if "image" in kwargs else 0)
    pi = VLAPolicy(obs_dim, 7, [obs_dim - TEXT, TEXT], chunk=4, execute=2, **kwargs)
    obs = torch.rand(5, obs_dim)
    assert pi.chunk(obs).shape == (5, 4, 7) and pi(obs).shape == (5, 7) and pi.value(obs).shape == (5,)
    assert pi.chunk(obs).abs().max() <= 1.0
    if pi.head == "tokens":
        assert pi.logits(pi.features(obs)).shape == (5, 4, 7, 256)
    d = pi.dist(obs, temperature=1.6)
    a = sample_action(d, torch.Generator().manual_seed(0))
    assert a.shape == (5, 7) and d.log_prob(a).shape == (5, 7) and d.entropy().shape == (5, 7)
    loss = pi.bc_loss(obs, torch.rand(5, 4, 7) * 2 - 1)
    loss.backward()
    assert math.isfinite(float(loss.detach()))
    # the queue executes two actions of each chunk: the second act of an env returns the chunk's second action
    first, second = pi.act(obs), pi.act(obs)
    chunk = pi.chunk(obs)
    assert torch.allclose(first, chunk[:, 0]) and torch.allclose(second, chunk[:, 1])


def test_binned_log_prob_is_the_sampled_bins_log_softmax():
    pi = VLAPolicy(STATE + TEXT, 3, [STATE, TEXT], bins=8)
    obs = torch.rand(4, STATE + TEXT)
    d = pi.dist(obs, temperature=2.0)
    a = d.sample(torch.Generator().manual_seed(3))
    logits = pi.logits(pi.features(obs))[:, 0] / 2.0
    expected = torch.log_softmax(logits, -1).gather(-1, pi.encode(a)[..., None]).squeeze(-1)
    assert torch.allclose(d.log_prob(a), expected)


def test_soft_bin_cross_entropy_exact_value():
    logits = torch.tensor([[0.0, math.log(2.0), math.log(3.0)]])  # p = 1/6, 2/6, 3/6
    w = torch.tensor([math.exp(-0.5), 1.0, math.exp(-0.5)])  # sigma 1 around bin 1
    q = w / w.sum()
    expected = -(q * torch.log(torch.tensor([1 / 6, 2 / 6, 3 / 6]))).sum()
    assert torch.allclose(soft_bin_cross_entropy(logits, torch.tensor([1.0]), 1.0), expected)
    # smoothing mixes the target with a uniform
    q2 = 0.9 * q + 0.1 / 3
    expected2 = -(q2 * torch.log(torch.tensor([1 / 6, 2 / 6, 3 / 6]))).sum()
    assert torch.allclose(soft_bin_cross_entropy(logits, torch.tensor([1.0]), 1.0, 0.1), expected2)


def test_token_bc_loss_is_cross_entropy_on_the_target_bins():
    pi = VLAPolicy(STATE + TEXT, 2, [STATE, TEXT], bins=16, chunk=1)
    obs, target = torch.rand(6, STATE + TEXT), torch.rand(6, 1, 2) * 2 - 1
    logits = pi.logits(pi.features(obs)).reshape(-1, 16)
    expected = torch.nn.functional.cross_entropy(logits, pi.encode(target).reshape(-1))
    assert torch.allclose(pi.bc_loss(obs, target), expected)


def test_gaussian_bc_loss_at_a_temperature_fits_the_tempered_std():
    """``std_temperature`` T: the continuous head's likelihood with its log-std term weighted by T^2, exactly; T = 1 is
    the plain likelihood; the mean's gradient does not depend on T; and the std fitted to fixed residuals of spread r
    settles at r / T (the policy sampled at T then has their spread)."""
    pi = VLAPolicy(STATE + TEXT, 2, [STATE, TEXT], head="continuous", chunk=2, width=32)
    g = torch.Generator().manual_seed(0)
    obs, target = torch.rand(6, STATE + TEXT, generator=g), torch.rand(6, 2, 2, generator=g) * 2 - 1
    with torch.no_grad():
        pi.log_std.copy_(torch.tensor([-1.5, -0.5]))
    mean = pi.chunk(obs)
    sq = 0.5 * ((target - mean) / pi.log_std.exp()) ** 2
    assert torch.allclose(pi.bc_loss(obs, target), (sq + pi.log_std).mean())
    assert torch.allclose(pi.bc_loss(obs, target, std_temperature=0.5), (sq + 0.25 * pi.log_std).mean())
    grads = []
    for t in (1.0, 0.5):
        pi.zero_grad()
        pi.bc_loss(obs, target, std_temperature=t).backward()
        grads.append(pi.action_head.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1])
    # the std's optimum for the chunk's residuals: their rms per dimension / T (the loss's gradient in it vanishes)
    rms = (target - mean.detach()).pow(2).mean((0, 1)).sqrt()
    for t in (1.0, 0.5):
        with torch.no_grad():
            pi.log_std.copy_((rms / t).log())
        pi.zero_grad()
        pi.bc_loss(obs, target, std_temperature=t).backward()
        assert torch.allclose(pi.log_std.grad, torch.zeros(2), atol=1e-6)
    with torch.no_grad():  # at the plain fit, the tempered loss still raises the std
        pi.log_std.copy_(rms.log())
    pi.zero_grad()
    pi.bc_loss(obs, target, std_temperature=0.5).backward()
    assert (pi.log_std.grad < 0).all()


def test_text_noise_perturbs_only_the_instruction_reproducibly():
    pi = VLAPolicy(STATE + TEXT, 2, [STATE, TEXT], bins=16, chunk=1)
    obs, target = torch.rand(6, STATE + TEXT), torch.rand(6, 1, 2) * 2 - 1
    obs[:, STATE:] /= obs[:, STATE:].norm(dim=1, keepdim=True)
    clean = pi.bc_loss(obs, target)
    noisy = [pi.bc_loss(obs, target, text_noise=0.05, generator=torch.Generator().manual_seed(1)) for _ in range(2)]
    assert torch.equal(noisy[0], noisy[1]) and not torch.equal(noisy[0], clean)
