"""The numba n-step windows (embodied/kernels/replay_numba.py) against the torch push they replace."""

import torch


def test_nstep_kernel_matches_the_torch_push():
    """NStepReturns.push on CPU (the numba kernel) against ``_push_torch`` on 200 random steps of 5 envs with
    terminations, truncations and dropped steps: the same rows in the same order, the same windows after."""
    from embodied.algos.replay import NStepReturns

    gen = torch.Generator().manual_seed(0)
    fast, ref = (NStepReturns(3, 0.97, 5, 4, torch.device("cpu")) for _ in range(2))
    for t in range(200):
        head, tail = torch.randn(5, 4, generator=gen), torch.randn(5, 2, generator=gen)
        reward = torch.randn(5, generator=gen)
        terminated, truncated = torch.rand(5, generator=gen) < 0.1, torch.rand(5, generator=gen) < 0.05
        fresh = torch.rand(5, generator=gen) < 0.03 if t % 2 else None
        a = fast.push(head, reward, terminated, truncated, tail, fresh)
        b = ref._push_torch(head, reward, terminated, truncated, tail, fresh)
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)
    for k, v in fast.state_dict().items():
        if k != "t":
            torch.testing.assert_close(v, ref.state_dict()[k], rtol=1e-6, atol=1e-6)
