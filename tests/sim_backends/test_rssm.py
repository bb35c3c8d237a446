"""The RSSM: shapes for image and vector observations, an episode start resets the state exactly, the reward head
starts at exactly 0 (zero-initialized two-hot), training lowers the loss, and the open-loop report's bookkeeping."""

from __future__ import annotations

import pytest
import torch

from embodied.sim_backends.world_model.rssm import PRESETS, RSSM, RSSMConfig
from embodied.sim_backends.world_model.sequences import (
    fit_rssm,
    open_loop_psnr,
    parameter_count,
    sample_batch,
    to_sequences,
)

SMALL = RSSMConfig(deter=32, hidden=16, stoch=4, classes=4, units=16, depth=4, batch_size=4, length=8)


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _episodes(e: int = 6, t: int = 20, image: bool = True) -> dict[str, torch.Tensor]:
    """A bright square that moves one pixel right per unit of action (images), or a linear system (vectors)."""
    g = torch.Generator().manual_seed(0)
    action = torch.rand(e, t, 1, generator=g) * 2 - 1
    pos = torch.cat([torch.zeros(e, 1), torch.cumsum(action[..., 0], 1)], 1)  # [E, T+1]
    if image:
        frames = torch.zeros(e, t + 1, 3, 16, 16)
        col = (8 + pos).round().long().clamp(0, 15)
        for i in range(e):
            for j in range(t + 1):
                frames[i, j, :, 6:10, col[i, j]] = 1.0
        state = frames.flatten(2)
    else:
        state = torch.stack([pos, 0.5 * pos], 2)
    return {"state": state, "action": action, "reward": -pos[:, 1:].abs(),
            "terminated": torch.zeros(e, t, dtype=torch.bool), "valid": torch.ones(e, t, dtype=torch.bool)}


def test_sizes_of_the_presets():
    # DreamerV3's size1m: deter 512, hidden 64, classes 4, units 64 (32 categoricals)
    assert PRESETS["size1m"] == {"deter": 512, "hidden": 64, "classes": 4, "units": 64}
    model = RSSM(1, RSSMConfig(**PRESETS["size1m"]), image=(3, 64, 64))
    assert model.feat_dim == 512 + 32 * 4
    assert 1e6 < parameter_count(model) < 1e7


def test_first_resets_the_state_and_reward_head_starts_at_zero():
    model = RSSM(1, SMALL, image=(3, 16, 16), vector=2)
    obs = torch.rand(3, 3 * 16 * 16 + 2)
    embed = model.embed(obs)
    assert embed.shape == (3, model.img_enc.out_dim + SMALL.units)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    busy = {"deter": torch.randn(3, 32), "stoch": torch.rand(3, 16)}
    first = torch.ones(3, dtype=torch.bool)
    a, _, _ = model.obs_step(busy, torch.randn(3, 1), embed, first, g1)
    b, _, _ = model.obs_step(model.initial(3), torch.zeros(3, 1), embed, first, g2)
    assert torch.equal(a["deter"], b["deter"]) and torch.equal(a["stoch"], b["stoch"])
    feat = model.feat(a)
    assert torch.allclose(model.reward(feat), torch.zeros(3), atol=1e-5)  # softmax(0) over symmetric bins
    assert model.decode(feat).shape == obs.shape
    decoded = model.decode(feat)[:, : 3 * 16 * 16].detach()
    assert float(decoded.min()) >= 0.0 and float(decoded.max()) <= 1.0


def test_sequences_align_like_dreamer_and_windows_stay_inside_episodes():
    data = _episodes(e=2, t=5, image=False)
    data["valid"][1, 3:] = False
    seqs = to_sequences(data)
    assert seqs["length"].tolist() == [6, 4]
    assert torch.equal(seqs["prev_action"][:, 1:], data["action"]) and float(seqs["prev_action"][:, 0].abs().sum()) == 0
    assert torch.equal(seqs["reward"][:, 1:], data["reward"]) and seqs["first"][:, 0].all()
    batch = sample_batch(seqs, 64, 5, torch.Generator().manual_seed(0))
    assert batch["obs"].shape == (64, 5, 2) and batch["first"][:, 0].all() and not batch["first"][:, 1:].any()
    # only episode 0 holds 5 observations
    assert set(batch["obs"][:, 0, 0].tolist()) <= set(data["state"][0, :2, 0].tolist())


@pytest.mark.parametrize("image", [True, False])
def test_training_lowers_the_loss_and_the_report_counts_horizons(image):
    torch.manual_seed(0)
    seqs = to_sequences(_episodes(image=image))
    model = RSSM(1, SMALL, image=(3, 16, 16) if image else None, vector=0 if image else 2)
    g = torch.Generator().manual_seed(0)
    b = sample_batch(seqs, 8, 8, g)
    before = float(model.loss(b["obs"], b["prev_action"], b["reward"], b["cont"], b["first"], g)[0].detach())
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    fit_rssm(model, opt, seqs, 60, g)
    after = float(model.loss(b["obs"], b["prev_action"], b["reward"], b["cont"], b["first"], g)[0].detach())
    assert after < 0.7 * before, (before, after)
    report = open_loop_psnr(model, seqs, context=3, horizon=10)
    assert report["episodes"] == 6 and len(report["reward_mae"]) == 10
    if image:
        assert len(report["psnr"]) == 10 and report["frames"].shape == (10, 3, 16, 16)
        assert sorted(report["mean_psnr"], key=int) == ["1", "5"]
