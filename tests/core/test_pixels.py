"""Camera entries held as uint8: the packer gives back the task's floats bit for bit; datasets store them as uint8."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from embodied.core.layout import ActionTerm, Layout, Term
from embodied.core.pixels import PixelPacker, pixels_to_float


def layout(quantized: bool = True, side: int = 4) -> Layout:
    """grip (3), two RGB cameras of side x side (6 side^2), text (2); a critic group without images."""
    return Layout({"policy": (Term("grip", 3, "m"), Term("cameras", 6 * side * side, "1", shape=(6, side, side),
                                                         quantized=quantized), Term("text", 2, "1")),
                   "critic": (Term("state", 5),)}, (ActionTerm("a", 2),), 20.0)


def observations(n: int, seed: int = 0, side: int = 4) -> torch.Tensor:
    """Rows as the task makes them: floats, then ``u8 * (1/255)`` camera entries, then floats."""
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (n, 6 * side * side), generator=g, dtype=torch.uint8)
    pixels[0, :2] = torch.tensor([0, 255], dtype=torch.uint8)  # the ends of the range
    return torch.cat([torch.randn(n, 3, generator=g), pixels_to_float(pixels), torch.randn(n, 2, generator=g)], 1)


def test_packer_round_trip_is_exact_and_keeps_pixels_as_uint8():
    x = observations(7)
    packer = PixelPacker.of(layout(), "policy", 101)
    parts = packer.pack(x)
    assert parts["obs"].dtype == torch.float32 and parts["obs"].shape == (7, 5)
    assert parts["obs_pixels"].dtype == torch.uint8 and parts["obs_pixels"].shape == (7, 96)
    assert parts["obs_pixels"][0, :2].tolist() == [0, 255]
    assert torch.equal(parts["obs"], torch.cat([x[:, :3], x[:, 99:]], 1))
    back = packer.unpack(parts)
    assert back.dtype == torch.float32 and torch.equal(back, x)  # bit for bit
    assert torch.equal(packer.unpack({k: v[2:5] for k, v in parts.items()}), x[2:5])  # rows select alike
    rows = torch.tensor([4, 1])  # rows of parts that hold other columns too (GRPO's pending steps)
    assert torch.equal(packer.unpack_rows({**parts, "action": torch.zeros(7, 2)}, rows), x[rows])
    assert sum(v.element_size() * v.numel() for v in parts.values()) == 7 * (5 * 4 + 96)  # 4x less for the pixels
    # a JSON record of it (a dataset's metadata) packs alike
    assert torch.equal(PixelPacker.from_json(packer.to_json()).unpack(parts), x)


def test_packer_packs_only_quantized_image_terms():
    x = observations(3)
    for packer in (PixelPacker.of(layout(quantized=False), "policy", 101), PixelPacker.of(None, "policy", 101),
                   PixelPacker.of(layout(), "critic", 5)):
        assert not packer.packs and packer.pack(x) == {"obs": x} and packer.unpack({"obs": x}) is x
    with pytest.raises(ValueError, match="image term"):
        Term("grip", 3, quantized=True)


def test_dataset_stores_camera_entries_as_uint8_and_reads_back_the_same_floats(tmp_path):
    from minari import MinariDataset

    from embodied.datasets import read_transitions, write_minari

    space = gym.spaces.Dict({"policy": gym.spaces.Box(-np.inf, np.inf, (101,), np.float32),
                             "critic": gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)})
    obs = [observations(4, seed=s) for s in (1, 2)]  # two episodes of 3 steps
    episodes = [{"observations": {"policy": o.numpy(), "critic": np.ones((4, 5), np.float32)},
                 "actions": np.zeros((3, 2), np.float32), "rewards": np.arange(3.0), "terminations": [False] * 3,
                 "truncations": [False, False, True]} for o in obs]
    path = write_minari(tmp_path / "d", episodes, space, gym.spaces.Box(-1, 1, (2,), np.float32), layout=layout())
    stored = next(MinariDataset(path / "data").iterate_episodes()).observations
    assert stored["policy_pixels"].dtype == np.uint8 and stored["policy_pixels"].shape == (4, 96)
    assert stored["policy"].shape == (4, 5)
    data = read_transitions(path, ["policy", "critic"])
    assert torch.equal(data["state"][:3, :101], obs[0][:3]) and torch.equal(data["next_state"][3:, :101], obs[1][1:])
    assert torch.equal(data["state"][:, 101:], torch.ones(6, 5))


def test_bc_and_cotraining_hold_demonstrations_packed_and_train_on_the_same_floats(tmp_path):
    from embodied.algos.base import BuildContext
    from embodied.algos.bc import BC, BCConfig
    from embodied.algos.cotrain import DemoLoss
    from embodied.config import PolicyConfig
    from embodied.datasets import write_minari

    space = gym.spaces.Dict({"policy": gym.spaces.Box(-np.inf, np.inf, (101,), np.float32)})
    obs = observations(5, seed=3)
    episode = {"observations": {"policy": obs.numpy()}, "actions": np.zeros((4, 2), np.float32),
               "rewards": np.zeros(4), "terminations": [False] * 4, "truncations": [False, False, False, True]}
    act_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    path = write_minari(tmp_path / "d", [episode], space, act_space, layout=layout())
    ctx = BuildContext(space, act_space, 1, torch.device("cpu"), 0, 10, PolicyConfig(actor_hidden=[8]),
                       layout=layout(), data=str(path))
    bc = BC.build(BCConfig(batch_size=2, holdout=0.0), ctx)
    assert bc.obs["obs_pixels"].dtype == torch.uint8 and bc.action.shape[0] == 4
    assert torch.equal(bc.packer.unpack_rows(bc.obs, torch.arange(4)), obs[:4])
    assert np.isfinite(bc.update()["bc/loss"])
    demos = DemoLoss(str(path), bc.pi, 101, torch.device("cpu"), 2, "x", layout())
    assert demos.obs["obs_pixels"].dtype == torch.uint8
    assert torch.isfinite(demos(bc.pi, torch.Generator().manual_seed(0)))


def test_ppo_rollout_holds_camera_entries_as_uint8_and_learns_from_the_same_floats():
    from embodied.algos.base import BuildContext, Transition
    from embodied.algos.ppo import PPO, PPOConfig
    from embodied.config import PolicyConfig

    side = 36  # the CNN encoder's smallest image
    dim = 3 + 6 * side * side + 2
    space = gym.spaces.Dict({"policy": gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32)})
    ctx = BuildContext(space, gym.spaces.Box(-1, 1, (2,), np.float32), 3, torch.device("cpu"), 0, 100,
                       PolicyConfig(actor_hidden=[8], critic_hidden=[8]), layout=layout(side=side))
    algo = PPO.build(PPOConfig(num_steps=2, num_minibatches=2, num_epochs=1), ctx)
    seen = []
    for t in range(2):
        obs = {"policy": observations(3, seed=t, side=side)}
        seen.append(obs["policy"])
        action, extras = algo.act(obs)
        algo.observe(Transition(obs, action, torch.ones(3), torch.zeros(3, dtype=torch.bool),
                                torch.zeros(3, dtype=torch.bool), obs, extras))
    s = algo.storage
    assert s.packed["obs_pixels"].dtype == torch.uint8 and s.packed["obs_pixels"].shape == (2, 3, 6 * side * side)
    assert torch.equal(s.obs, torch.stack(seen)) and torch.equal(s.obs_rows(torch.tensor([4, 0])),
                                                                 torch.stack([seen[1][1], seen[0][0]]))
    assert np.isfinite(algo.update()["ppo/policy_loss"])
