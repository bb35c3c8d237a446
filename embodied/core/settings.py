"""Settings a user can get wrong, checked by name before anything is built: one table for every learner's config
and one for every task's (a field means the same wherever it appears: ``gamma`` is a discount, ``batch_size`` and
``episode_steps`` are counts, ``friction`` a factor range), so no learner or task repeats the checks and a bad
value is one line (``ppo.num_steps=0``, ``sac.tau=2``, ``env.control_hz=0``), never a traceback or a run that
trains on nonsense. ``None`` stays allowed where a field may be off; a task adds checks across fields itself (and
a world model's settings are its own: ``tasks/world_model/env.py: check_config``)."""

from __future__ import annotations

import dataclasses
import math

from embodied.core.errors import UserError


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


def _pair(v) -> bool:
    return isinstance(v, (list, tuple)) and len(v) == 2 and all(_number(x) for x in v)


COUNT = ("an integer >= 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1)
INDEX = ("an integer >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0)
NON_NEGATIVE = ("a number >= 0", lambda v: _number(v) and math.isfinite(v) and v >= 0)
POSITIVE = ("a number > 0", lambda v: _number(v) and math.isfinite(v) and v > 0)
RATE = ("in (0, 1]", lambda v: _number(v) and 0 < v <= 1)
FRACTION = ("in [0, 1]", lambda v: _number(v) and 0 <= v <= 1)
# a factor on a nominal value drawn from [lo, hi] (a list), or a +- fraction of it (a number)
FACTORS = ("[lo, hi] with 0 < lo <= hi (or a fraction >= 0)",
           lambda v: (_pair(v) and 0 < v[0] <= v[1]) or (_number(v) and v >= 0))
SPAN = ("[lo, hi] with 0 <= lo <= hi", lambda v: _pair(v) and 0 <= v[0] <= v[1])
INTERVAL = ("[lo, hi] with lo <= hi", lambda v: _pair(v) and v[0] <= v[1])
HALF_WIDTHS = ("half-widths >= 0", lambda v: isinstance(v, (list, tuple)) and all(_number(x) and x >= 0 for x in v))


def _rules(**groups: tuple) -> dict[str, tuple]:
    return {name: rule for rule, names in groups.values() for name in names}


LEARNER = _rules(
    count=(COUNT, ("actor_every", "batch_size", "bc_batch_size", "buffer_size", "chunk", "flow_steps", "group_size",
                   "horizon", "max_fill_rollouts", "minibatch_tokens", "n_step", "num_epochs", "num_minibatches",
                   "num_steps", "starts")),
    non_negative=(NON_NEGATIVE, ("barrier", "barrier_margin", "batch_groups", "bc_coef", "bc_ground", "bc_obs_noise",
                                 "beta_steps", "clip", "clip_high", "clip_low", "critic_burn_in", "critic_warmup",
                                 "entropy", "entropy_coef", "execute", "exploration_noise", "explore_ramp", "ground",
                                 "max_grad_norm", "obs_noise", "residual_penalty", "slow_reg", "target_kl",
                                 "target_noise", "target_noise_clip", "value_clip", "value_coef", "warmup_steps",
                                 "weight_decay")),
    positive=(POSITIVE, ("adam_eps", "init_alpha", "lr", "lr_actor", "lr_alpha", "lr_critic", "retnorm_limit",
                         "temperature", "updates_per_step")),
    rate=(RATE, ("advance_at", "average_tau", "gamma", "reach_step", "retnorm_rate", "slow_rate", "tau")),
    fraction=(FRACTION, ("demo_ratio", "fraction", "gae_lambda", "lam", "restart")),
)

TASK = _rules(
    count=(COUNT, ("action_history", "cameras", "episode_steps", "frame_skip", "frame_stack", "image_height",
                   "image_size", "image_width", "interval", "probe_steps", "scenes", "sim_threads")),
    index=(INDEX, ("distractors", "moving_cars")),
    positive=(POSITIVE, ("align_tolerance", "bonus_speed", "control_hz", "episode_s", "far", "insert_depth",
                         "max_rate_rp", "max_rate_yaw", "max_rotation", "max_torque", "max_translation",
                         "success_radius", "termination_radius", "tip_limit", "tolerance")),
    non_negative=(NON_NEGATIVE, ("action_cost", "arm_noise", "contact_cost_weight", "ctrl_cost_weight",
                                 "disturbance_force", "disturbance_torque", "distractor_jitter", "goal_margin",
                                 "init_ang_vel", "init_lin_vel", "init_max_angle", "init_position", "lift_ramp",
                                 "obs_noise_ang_vel", "obs_noise_lin_vel", "obs_noise_orientation",
                                 "obs_noise_position", "object_yaw", "offroad_margin", "position_average_s",
                                 "reset_noise_scale", "start_heading", "start_lateral", "start_range",
                                 "success_bonus", "success_hold_s", "target_range")),
    fraction=(FRACTION, ("init_guidance",)),
    factors=(FACTORS, ("friction", "inertia", "mass", "motor_time_constant", "obs_noise", "thrust_constant",
                       "torque_constant")),
    span=(SPAN, ("blocking_cars", "moving_ahead", "moving_lateral", "moving_speed", "start_arc", "start_speed")),
    interval=(INTERVAL, ("healthy_angle_range", "healthy_z_range")),
    half_widths=(HALF_WIDTHS, ("goal_xy", "object_xy")),
)


RUN = _rules(  # the run's own settings (RunConfig and its log section)
    count=(COUNT, ("eval_episodes", "keep_checkpoints", "log_every", "torch_threads", "ensemble", "stop_passes",
                   "num_envs", "total_steps")),
    index=(INDEX, ("checkpoint_every", "eval_every")),
    rate=(RATE, ("stop_success",)),
    choice=(("eval or model", lambda v: v in ("eval", "model")), ("keep_best_by",)),
    replay=(("own or shared", lambda v: v in ("own", "shared")), ("ensemble_replay",)),
    confirm=(("now or next", lambda v: v in ("now", "next")), ("stop_confirm",)),
)


def check_value(name: str, value, rule: tuple) -> None:
    """``value`` (None allowed) holds ``rule``; else one ``UserError`` line naming ``name``."""
    what, ok = rule
    if value is not None and not ok(value):
        raise UserError(f"{name} must be {what}, got {value!r}")


def check_settings(section: str, cfg, rules: dict[str, tuple]) -> None:
    """Each field of the dataclass ``cfg`` (and of the dataclasses nested in it) that ``rules`` names holds a value
    its rule allows, or None; else one ``UserError`` line naming ``section.field``."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            check_settings(f"{section}.{f.name}", value, rules)
            continue
        if f.name in rules:
            check_value(f"{section}.{f.name}", value, rules[f.name])
