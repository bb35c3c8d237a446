"""Co-training (``<algo>.bc_coef`` with ``data=PATH``): GRPO and PPO clone the demonstrations with the loss BC cloned
them with (state noise, grounding, relabelled copies), built by one piece (``algos/cotrain.py: cotraining``)."""

from __future__ import annotations

import pytest
import torch

import embodied


def test_grpo_and_ppo_cotrain_with_bcs_loss(tmp_path, mini_libero_demos, capsys):
    from embodied.algos.base import BuildContext
    from embodied.algos.bc import episode_grounding, state_noise_scale
    from embodied.algos.grpo import GRPO, GRPOConfig
    from embodied.algos.ppo import PPO, PPOConfig
    from embodied.config import PolicyConfig
    from embodied.core.errors import UserError
    from embodied.core.relabel import with_relabelled_copies
    from embodied.core.settings import LEARNER, check_settings
    from embodied.datasets import collect_demos

    env, ctx, data = mini_libero_demos.env, mini_libero_demos.ctx, mini_libero_demos.data
    state, t = data["state"], len(data["state"])
    episode = torch.cumsum(data["initial"].long(), 0) - 1
    for learner, config in ((GRPO, lambda **kw: GRPOConfig(group_size=2, **kw)), (PPO, PPOConfig)):
        algo = learner.build(config(bc_coef=0.5, bc_obs_noise=0.05, bc_ground=1.0, bc_relabel=2), ctx)
        demos = algo.demos
        # the demonstrations and two relabelled copies of each, drawn with the learner's generator (seeded with the
        # run's seed, nothing drawn from it before), their action targets the sources'
        expected = with_relabelled_copies(env.relabeller(), state, episode, 2, torch.Generator().manual_seed(0))
        obs = demos.packer.unpack_rows(demos.obs, slice(None))
        assert obs.shape[0] == 3 * t and torch.equal(obs, expected[0])
        assert torch.equal(demos.target[t:2 * t], demos.target[:t]) and torch.equal(demos.target[2 * t:],
                                                                                    demos.target[:t])
        assert torch.equal(demos.noise_scale, state_noise_scale(obs, env.layout(), 0.05))
        assert torch.equal(demos.data["ground"], episode_grounding(algo.pi, obs, expected[1]))
        assert (demos.data["ground"][:t, 0] >= 0).all()  # the expert moved a cube in every episode
        assert torch.isfinite(demos(algo.pi, torch.Generator().manual_seed(1)))
        assert learner.build(config(), ctx).demos is None  # bc_coef 0: no co-training
        with pytest.raises(UserError, match=">= 0"):
            learner.build(config(bc_coef=0.5, bc_relabel=-1), ctx)
    plain = embodied.make_env("point-reach", num_envs=2, seed=0)
    collect_demos("point-reach", 2, tmp_path / "p", num_envs=2, seed=0)
    bare = PPO.build(PPOConfig(bc_coef=0.5, bc_relabel=1), BuildContext(
        plain.single_observation_space, plain.single_action_space, 2, torch.device("cpu"), 0, 1000, PolicyConfig(),
        success_metric="success", data=str(tmp_path / "p")))
    assert bare.demos.relabel == 0 and "ppo.bc_relabel: this task has no relabelling" in capsys.readouterr().err
    for bad in (PPOConfig(bc_obs_noise=-1), GRPOConfig(bc_ground=-0.5)):  # as train's settings check sees them
        with pytest.raises(UserError, match="must be a number >= 0"):
            check_settings("ppo", bad, LEARNER)
