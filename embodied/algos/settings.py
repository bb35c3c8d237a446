"""The learners' settings a user can get wrong, checked by name before any learner is built: one table for every
algorithm's config (a field means the same wherever it appears: ``gamma`` is a discount, ``batch_size`` a count), so
no learner repeats the checks and a bad value is one line (``ppo.num_steps=0``, ``sac.tau=2``), never a traceback
or a run that trains on nonsense. ``None`` stays allowed where a field may be off."""

from __future__ import annotations

import dataclasses
import math

from embodied.core.errors import UserError

COUNT = ("an integer >= 1", lambda v: isinstance(v, int) and v >= 1)
NON_NEGATIVE = ("a number >= 0", lambda v: v >= 0)
POSITIVE = ("a number > 0", lambda v: v > 0)
RATE = ("in (0, 1]", lambda v: 0 < v <= 1)
FRACTION = ("in [0, 1]", lambda v: 0 <= v <= 1)

RULES = {
    **dict.fromkeys(("actor_every", "batch_size", "bc_batch_size", "buffer_size", "chunk", "flow_steps", "group_size",
                     "horizon", "max_fill_rollouts", "minibatch_tokens", "n_step", "num_epochs", "num_minibatches",
                     "num_steps", "starts"), COUNT),
    **dict.fromkeys(("batch_groups", "bc_coef", "beta_steps", "clip", "clip_high", "clip_low", "critic_burn_in",
                     "critic_warmup", "entropy", "entropy_coef", "execute", "exploration_noise", "explore_ramp",
                     "max_grad_norm", "obs_noise", "residual_penalty", "slow_reg", "target_kl", "target_noise",
                     "target_noise_clip", "value_clip", "value_coef", "warmup_steps", "weight_decay"), NON_NEGATIVE),
    **dict.fromkeys(("adam_eps", "init_alpha", "lr", "lr_actor", "lr_alpha", "lr_critic", "retnorm_limit",
                     "temperature", "updates_per_step"), POSITIVE),
    **dict.fromkeys(("average_tau", "gamma", "retnorm_rate", "slow_rate", "tau"), RATE),
    **dict.fromkeys(("demo_ratio", "gae_lambda", "lam"), FRACTION),
}


def check_settings(section: str, cfg) -> None:
    """Each field of the dataclass ``cfg`` that ``RULES`` names holds a value its rule allows (or None); else one
    ``UserError`` line naming ``section.field``."""
    for f in dataclasses.fields(cfg):
        rule = RULES.get(f.name)
        value = getattr(cfg, f.name)
        if rule is None or value is None:
            continue
        what, ok = rule
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not (number and ok(value)):
            raise UserError(f"{section}.{f.name} must be {what}, got {value!r}")
