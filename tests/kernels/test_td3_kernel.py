"""The numba TD3 step (embodied/kernels/td3_numba.py) against the torch step it replaces, given the same draws."""

from __future__ import annotations

from pathlib import Path

import numba
import pytest
import torch

from embodied.config import load_config
from embodied.core.errors import UserError
from embodied.train import build


def _learner(tmp: Path, name: str, overrides: list[str]):
    runner = build(load_config("quadrotor-hover", overrides=["num_envs=4", "td3.warmup_steps=300",
                                                              "td3.batch_size=64", *overrides]), tmp / name)
    runner.start()
    return runner


def _replay(algo, idx, g, eps):
    """The torch learner's next step draws these rows, group elements and target noise."""
    def sample():
        rows = algo.buffer.storage.index_select(0, idx)
        if algo.cfg.symmetry_augmentation:
            index, sign = algo._buffer_row_symmetry()
            rows = rows.gather(1, index[g]) * sign[g]
        out = {k: rows[:, s] for k, s in algo.buffer.slices.items()}
        return {**out, "reward": out["reward"].squeeze(1), "discount": out["discount"].squeeze(1)}
    algo._sample = sample
    algo._target_noise = lambda shape: eps.clone()


def _state(algo) -> dict[str, torch.Tensor]:
    nets = {"q": algo.q, "q_target": algo.q_target, "pi": algo.pi, "pi_target": algo.pi_target,
            "pi_average": algo.pi_average}
    out = {f"{n}.{k}": v for n, m in nets.items() for k, v in m.state_dict().items()}
    for i, (ms, vs) in enumerate(zip(algo.opt.exp_avg, algo.opt.exp_avg_sq)):
        out.update({f"m{i}.{j}": t for j, t in enumerate(ms)})
        out.update({f"v{i}.{j}": t for j, t in enumerate(vs)})
        out[f"steps{i}"] = torch.stack(list(algo.opt.steps[i]))
    return out


@pytest.mark.parametrize("overrides", [
    # quadrotor-hover's learner: equivariant actor, LayerNorm critics, symmetry-augmented rows; the batch's
    # gradients in two slices on two threads
    [],
    ["td3.kernel_threads=1"],  # one slice
    ["policy.symmetrize=false", "td3.symmetry_augmentation=false", "policy.critic_layer_norm=false",
     "policy.activation=tanh", "td3.max_grad_norm=null", "policy.actor_hidden=[32,16,8]"],
    ["td3.average_tau=0.25"],  # a shipped average at its own rate, moved beside the kernel's step
], ids=["hover", "hover-one-thread", "plain-tanh", "average"])
def test_numba_step_matches_the_torch_step(tmp_path, overrides):
    fast = _learner(tmp_path, "fast", ["td3.kernel=numba", *overrides])
    ref = _learner(tmp_path, "ref", ["td3.kernel=torch", *overrides])
    a, b = fast.algo, ref.algo
    assert a._fused is not None and b._fused is None
    assert a._fused.parts == (1 if "td3.kernel_threads=1" in overrides else min(2, numba.config.NUMBA_NUM_THREADS))
    while a.buffer.size < 400:
        fast.collect()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():  # targets away from the online networks, so mixing them up shows
        for p in [*a.q_target.parameters(), *a.pi_target.parameters()]:
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    b.load_state_dict(a.state_dict())
    a.num_updates = b.num_updates = 0
    for step in range(6):  # critic-only and actor + delayed-target steps, Adam's early steps
        ma = a._gradient_step()
        f = a._fused
        _replay(b, torch.from_numpy(f.idx.copy()), torch.from_numpy(f.g.copy()), torch.from_numpy(f.eps.copy()))
        mb = b._gradient_step()
        assert ma.keys() == mb.keys()
        for k in ma:
            assert float(ma[k]) == pytest.approx(float(mb[k]), rel=2e-5, abs=1e-6), (step, k)
        sa, sb = _state(a), _state(b)
        for k in sa:  # atol: Adam moves a weight whose gradient is near its eps (1e-8) by a fraction of lr that
            # depends on that gradient's last digits (one critic weight with a 3e-8 gradient, against a 2e-3 median,
            # moves 2.9e-6 apart when the 85-entry hover observation sums in another order)
            torch.testing.assert_close(sa[k], sb[k], rtol=1e-4, atol=5e-6,
                                       msg=lambda m, s=step, k=k: f"step {s} {k}: {m}")
    # the torch modules see the kernel's writes: acting and the target actor read the new weights
    x = torch.randn(5, a._head_dims[0])
    torch.testing.assert_close(a.pi.act(x), b.pi.act(x), rtol=1e-4, atol=2e-6)
    torch.testing.assert_close(a._fused.act(x), a.pi.act(x), rtol=1e-5, atol=1e-6)  # exploration's kernel path
    with torch.no_grad():
        for p in a.pi.parameters():
            p.mul_(0.5)  # weights written from outside (a warm start): the kernel's acting copy follows
    torch.testing.assert_close(a._fused.act(x), a.pi.act(x), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a.actor()(x), b.actor()(x), rtol=1e-4, atol=2e-6)
    for r in (fast, ref):
        r.collector.close()


def test_kernel_choice_errors(tmp_path):
    with pytest.raises(UserError, match="td3.kernel"):
        _learner(tmp_path, "bad", ["td3.kernel=cuda"])
    with pytest.raises(UserError, match="td3.kernel_threads"):
        _learner(tmp_path, "threads", ["td3.kernel_threads=-1"])
    with pytest.raises(UserError, match="observation normalization"):
        _learner(tmp_path, "norm", ["td3.kernel=numba", "policy.obs_normalization=true"])
    assert _learner(tmp_path, "auto", ["policy.obs_normalization=true"]).algo._fused is None  # auto: torch



@pytest.mark.parametrize("kernel", ["numba", "torch"])
def test_linear_learning_rate_schedule(tmp_path, kernel):
    """``lr_schedule=linear``: every group's rate is base x (1 - env steps stored / total_steps) when the updates
    owed are taken; the kernel's step reads it (at 0 the weights no longer move, on either path)."""
    run = _learner(tmp_path, kernel, [f"td3.kernel={kernel}", "td3.lr_schedule=linear", "total_steps=2000",
                                      "td3.lr_actor=4e-4"])
    algo = run.algo
    while algo.num_observed < 500:
        run.collect()
        algo.update()
    algo._credit = 1.0  # one step owed: the rate is set at the steps stored now
    algo.update()
    frac = 1.0 - algo.num_observed / 2000
    assert [g["lr"] for g in algo.opt.groups] == pytest.approx([1e-3 * frac, 4e-4 * frac], rel=1e-12)
    if kernel == "numba":
        assert algo._fused.hp[[2, 3]].tolist() == pytest.approx([1e-3 * frac, 4e-4 * frac], rel=1e-12)
    algo.num_observed = 2000  # the end of the budget: rate 0
    algo._credit = 2.0
    before = [p.clone() for p in [*algo.q.parameters(), *algo.pi.parameters()]]
    algo.update()
    assert [g["lr"] for g in algo.opt.groups] == [0.0, 0.0]
    for p, b in zip([*algo.q.parameters(), *algo.pi.parameters()], before):
        assert torch.equal(p, b)
    run.collector.close()
    with pytest.raises(UserError, match="lr_schedule"):
        _learner(tmp_path, "bad", ["td3.lr_schedule=cosine"])
