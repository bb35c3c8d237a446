"""The flow-matching chunk head (issue 12, ``bc.head=flow``): the time embedding, the loss and the Euler integration
on hand-made values, and its export: the unrolled program equals the actor, and the bundle's ONNX and C keep the
chunk queue with parity."""

from __future__ import annotations

import numpy as np
import torch

from embodied.policies import FlowChunkActor
from embodied.policies.export import ProgramModule, fold, program, run_numpy
from embodied.policies.flow import time_embedding


def _constant_velocity(c: torch.Tensor, **kwargs) -> FlowChunkActor:
    """A flow whose velocity is ``c`` everywhere (last layer's weights zero, its bias ``c``)."""
    pi = FlowChunkActor(3, 2, [8], horizon=2, execute=1, **kwargs)
    with torch.no_grad():
        pi.net[-1].weight.zero_()
        pi.net[-1].bias.copy_(c)
    return pi


def test_time_embedding_exact_values():
    e = time_embedding(torch.tensor([0.0, 0.5]), 4)  # frequencies 1/2, 1: [sin pi t, sin 2 pi t, cos pi t, cos 2 pi t]
    assert torch.allclose(e[0], torch.tensor([0.0, 0.0, 1.0, 1.0]))
    assert torch.allclose(e[1], torch.tensor([1.0, 0.0, 0.0, -1.0]), atol=1e-6)
    assert time_embedding(torch.rand(5, 3)).shape == (5, 3, 16)


def test_flow_loss_exact_value():
    """With ``v = c`` the loss is the mean of ``(c - (x1 - x0))^2`` over the drawn noise ``x0``."""
    c = torch.tensor([0.5, -0.25, 0.0, 1.0])
    pi = _constant_velocity(c)
    obs, target = torch.randn(6, 3), torch.rand(6, 2, 2) * 2 - 1
    loss = pi.bc_loss(obs, target, generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(6, 4, generator=g)  # the same draws, in the same order
    expected = ((c - (target.reshape(6, 4) - x0)) ** 2).mean()
    assert torch.allclose(loss, expected)


def test_euler_integration_exact_values():
    """A constant velocity carries ``x_0`` to ``x_0 + c`` (clipped to the action box) in any number of steps."""
    c = torch.tensor([0.5, -0.25, 0.75, 3.0])
    for steps in (1, 4):
        pi = _constant_velocity(c, steps=steps)
        chunk = pi(torch.randn(2, 3))
        assert torch.allclose(chunk, torch.tensor([[0.5, -0.25], [0.75, 1.0]]).expand(2, 2, 2), atol=1e-6), steps
        x0 = torch.tensor([[0.1, 0.2, -0.3, -3.0]])
        assert torch.allclose(pi.integrate(torch.zeros(1, 3), x0).reshape(-1), torch.tensor([0.6, -0.05, 0.45, 0.0]),
                              atol=1e-6)


def test_flow_program_and_bundle_match_the_actor(tmp_path):
    from embodied.core.layout import ActionTerm, Layout, Term
    from embodied.hardware import load_bundle
    from embodied.hardware.bundle import write_bundle

    torch.manual_seed(0)
    pi = FlowChunkActor(5, 2, [32, 32], horizon=4, execute=2, steps=6, obs_normalization=True)
    pi.normalizer.update(torch.randn(64, 5) * 2 + 1)
    for p in pi.parameters():
        p.data.normal_(0.0, 0.2)
    x = torch.randn(40, 5)
    ref = pi(x).reshape(40, -1).detach()
    ops, dim = program(pi)
    assert dim == 5 and [op.kind for op in ops].count("add_saved") == 5 and ops[-1].kind == "clip"
    assert np.abs(run_numpy(ops, x.numpy()) - ref.double().numpy()).max() < 1e-5
    assert (ProgramModule(fold(ops))(x) - ref).abs().max() < 1e-5
    layout = Layout({"policy": (Term("s", 5),)}, (ActionTerm("u", 2),), 10.0)
    meta = write_bundle(pi, layout, x.numpy(), tmp_path / "b", "all")
    assert meta["parity"]["passed"] and meta["policy"]["chunk"] == {"horizon": 4, "execute": 2}
    runner = load_bundle(tmp_path / "b", "c")
    pi.reset()
    for t in range(5):
        s = x[t].numpy()
        assert np.abs(runner.act(s) - pi.act(x[t:t + 1])[0].numpy()).max() < 1e-5, t
    # sampling starts from noise: reproducible under a seed, inside the action box, not the deterministic chunk
    a, b = (pi.sample(x[:3], torch.Generator().manual_seed(0)) for _ in range(2))
    assert torch.equal(a, b) and float(a.abs().max()) <= 1.0 and not torch.allclose(a, ref[:3].reshape(3, 4, 2))
