"""Device names: ``cuda`` resolves to the current GPU's index, so an env's device and its tensors' devices compare
equal (``torch.device("cuda") != torch.device("cuda", 0)``: on a GPU every tensor task's step refused its own
actions before this). CUDA is simulated by patching ``torch.cuda``'s queries: the logic, not the GPU, is tested."""

from __future__ import annotations

import pytest
import torch

from embodied.core.base import resolve_device
from embodied.core.errors import UserError
from embodied.core.registry import SIM_BACKENDS


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)


def test_cuda_resolves_to_the_current_gpu_index(two_gpus):
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device(torch.device("cuda")) == torch.device("cuda", 1)
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(UserError, match="2 GPU"):
        resolve_device("cuda:2")


def test_backends_declare_where_they_simulate():
    import embodied.sim_backends  # noqa: F401  (registers the backends)

    assert SIM_BACKENDS.get("mujoco_cpu").devices == ("cpu",)
    assert SIM_BACKENDS.get("torch_vec").devices == ("cpu", "cuda")
