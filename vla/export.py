"""The VLA's action path as ONNX with the instruction embedding as its own input.

Inputs: ``obs`` ``[B, obs_dim - 384]`` (the policy observation without its instruction term, the other terms in the
layout's order) and ``instruction`` ``[B, 384]`` (the MiniLM embedding; the bundle carries the embeddings of the
instructions its task knows); output ``action`` ``[B, act_dim]``: the first action of the deterministic chunk (the
deploy side runs it every control step). A policy that samples (``SampledActor``) takes a third input, ``noise``
``[B, act_dim]`` (standard normal, drawn by the runner): its action is the mean plus its scale times that noise.
The text encoder itself is not in the policy's graph."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from embodied.core.errors import UserError


class InstructionInput(nn.Module):
    """``(obs without the instruction, instruction) -> action`` around an actor that reads one flat vector."""

    def __init__(self, actor: nn.Module, text: list[int], obs_dim: int):
        super().__init__()
        self.actor = actor
        self.start, self.size, self.obs_dim = int(text[0]), int(text[1]), int(obs_dim)

    def forward(self, obs: torch.Tensor, instruction: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        full = torch.cat([obs[:, :self.start], instruction, obs[:, self.start:]], 1)
        return self.actor(full) if noise is None else self.actor(full, noise)


def split_instruction(obs: np.ndarray, text: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """A flat observation ``[B, obs_dim]`` as the two ONNX inputs."""
    a, n = int(text[0]), int(text[1])
    return (np.ascontiguousarray(np.concatenate([obs[:, :a], obs[:, a + n:]], 1), np.float32),
            np.ascontiguousarray(obs[:, a:a + n], np.float32))


@torch.no_grad()
def export_onnx(actor: nn.Module, text: list[int], obs_dim: int, path: Path, opset: int = 17) -> None:
    """Write ``actor``'s deterministic first action (a ``SampledActor``'s: given its noise) as ONNX at ``path``
    (dynamic batch)."""
    from embodied.policies.sampled import SampledActor

    wrapper = InstructionInput(actor.eval(), text, obs_dim).eval()
    inputs = (torch.zeros(2, obs_dim - int(text[1])), torch.zeros(2, int(text[1])))
    names = ["obs", "instruction"]
    if isinstance(actor, SampledActor):
        inputs, names = (*inputs, torch.zeros(2, actor.act_dim)), [*names, "noise"]
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # the fused transformer layer has no ONNX form; the plain one
    try:
        with warnings.catch_warnings():  # the TorchScript exporter: deprecated, but it needs no onnxscript
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(wrapper, inputs, str(path), input_names=names, output_names=["action"],
                              dynamic_axes={name: {0: "batch"} for name in [*names, "action"]},
                              opset_version=opset, dynamo=False)
    except Exception as e:  # noqa: BLE001 - torch's exporter fails in many ways; the user gets one line
        raise UserError(f"ONNX export of the VLA failed: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
