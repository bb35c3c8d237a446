"""How high can quadrotor-hover's success go (issue 8's "every seed" figure)? Several stopped runs flown on the same
``--episodes`` fresh initial states (the task's strict evaluation distribution, initial-state seed ``--seed``, each
env's first episode): each run's success, and the **union** (a start counts when at least one run's policy flies it to
success): a lower bound on the success an optimal policy reaches on this distribution, against the notes' estimate that
the hardest starts (tilted ~75 deg, falling) cannot be recovered at all. Failures are classed as ``crashed`` (left the
termination radius; ``gave up``: those that cut the motors just before) or ``not held`` (survived, outside the success
radius in the final window), and success is binned by the start's tilt and vertical velocity (and, under domain
randomization, by the plant's thrust-to-weight, with the share that crashed, and by each randomized factor in thirds
of its range). ``--ensemble`` also flies the runs' action mean (and median: the lower middle for an even count) as one
policy from the same starts: what an ensemble of independent learners would reach.
``--members``: a run trained as an ensemble (``ensemble=K``, its policy the members' action mean) also has each
member flown alone, and the members' median. Prints one JSON.

    python scripts/bench/bench_hover_ceiling.py RUN [RUN ...] [--episodes 2000] [--seed 777001] [--ensemble]
        [--members] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, first_episodes, machine_info  # noqa: E402

TILT_BINS = (0, 30, 60, 75, 90.01)  # [deg] from upright (the distribution reaches 90)
VZ_BINS = (-1.0, -0.5, 0.0, 0.5, 1.01)  # [m/s]
# thrust-to-weight under domain randomization (nominal 2.25: max thrust (rpm_max / hover_rpm)^2 m g); the default
# ranges reach 2.25 * 0.85 / 1.25 = 1.53 and 2.25 * 1.15 / 0.75 = 3.45
TW_BINS = (1.5, 1.8, 2.0, 2.25, 2.5, 3.5)
# a crash "gave up" when the policy cut its motors (mean normalized command below this, hover is +0.33) in its last
# steps: where the reward is negative (near the termination radius) ending the episode ends the cost
GAVE_UP, GAVE_UP_STEPS = -0.5, 15


def load(run: Path):
    """A quadrotor-hover run's policy and its evaluation config."""
    from embodied.checkpoint import load_checkpoint, policy_from_checkpoint
    from embodied.config import config_from_dict

    ckpt = load_checkpoint(run)
    cfg = config_from_dict(ckpt["config"])
    if cfg.task != "quadrotor-hover":
        raise SystemExit(f"{run}: a quadrotor-hover run is needed, this one is {cfg.task}")
    return policy_from_checkpoint(ckpt, run), cfg, int(ckpt["step"])


class Combined:
    """Several policies acting as one: ``combine`` of their actions ``[P, E, 4]``."""

    def __init__(self, policies: list, combine):
        self.policies, self.combine = policies, combine

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.combine(torch.stack([p.act(obs) for p in self.policies]))

    def reset(self, mask=None) -> None:
        for p in self.policies:
            p.reset(mask)


@torch.no_grad()
def fly(policy, cfg, episodes: int, seed: int) -> dict[str, torch.Tensor]:
    """The first episode of each of ``episodes`` envs: start (critic observation at the reset), success, crash, and
    whether a crash gave up (the mean motor command below ``GAVE_UP`` at some step of the last ``GAVE_UP_STEPS``)."""
    from embodied.evaluate import make_eval_env

    env = make_eval_env(cfg, num_envs=episodes)
    starts, crashed = [], torch.zeros(episodes, dtype=torch.bool)
    gave_up = torch.zeros(episodes, dtype=torch.bool)
    recent = torch.full((GAVE_UP_STEPS, episodes), 1.0)  # the last steps' mean motor commands, a ring
    step = [0]

    def watch(live: torch.Tensor, obs: dict, action: torch.Tensor) -> None:
        if not starts:  # position, rotation matrix (row-major), linear and angular velocity, before the first step;
            starts.append(obs["critic"].clone())  # then disturbances and, under randomization, the plant's factors
        recent[step[0] % GAVE_UP_STEPS] = action.mean(1)
        step[0] += 1

    def ended(mask: torch.Tensor, terminated: torch.Tensor) -> None:
        crashed[mask] = terminated[mask]
        gave_up[mask] = terminated[mask] & (recent[:, mask] < GAVE_UP).any(0)

    success = first_episodes(env, policy, seed, watch, ended)
    return {"start": starts[0], "success": success, "crashed": crashed, "gave_up": gave_up}


def members(policy, cfg, episodes: int, seed: int) -> dict:
    """Each member of an ensemble run's policy flown alone, and the members' median; {} for a single policy."""
    from embodied.policies import DeterministicPolicy, EnsembleActor

    if not isinstance(policy.actor, EnsembleActor):
        return {}
    alone = [DeterministicPolicy(m) for m in policy.actor.members]
    rate = lambda p: round(fly(p, cfg, episodes, seed)["success"].float().mean().item(), 4)  # noqa: E731
    return {"members": [rate(p) for p in alone],
            "members_median": rate(Combined(alone, lambda a: a.median(0).values))}


def binned(success: torch.Tensor, x: torch.Tensor, edges) -> list[dict]:
    """Mean of ``success [E]`` (per start, in [0, 1]) over the starts whose ``x`` falls in each bin."""
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (x >= lo) & (x < hi)
        out.append({"range": [lo, hi], "starts": int(m.sum()),
                    "success": round(success[m].mean().item(), 4) if bool(m.any()) else None})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--episodes", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=777001, help="initial-state seed shared by every run")
    ap.add_argument("--ensemble", action="store_true", help="also fly the runs' action mean and median")
    ap.add_argument("--members", action="store_true", help="an ensemble run's members alone, and their median")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    loaded = [load(Path(r)) for r in args.runs]
    flown = [fly(p, cfg, args.episodes, args.seed) | {"step": step} for p, cfg, step in loaded]
    for f in flown[1:]:
        if not torch.equal(f["start"], flown[0]["start"]):
            raise SystemExit("the runs were flown from different starts (another task config?)")
    start = flown[0]["start"]
    tilt = torch.rad2deg(torch.acos(start[:, 11].clamp(-1, 1)))  # R[2, 2]: the body z axis against the world's
    vz = start[:, 14]
    wins = torch.stack([f["success"] for f in flown])
    crashes = torch.stack([~f["success"] & f["crashed"] for f in flown])  # failures that left the termination radius
    union, mean = wins.any(0), wins.float().mean(0)  # mean: the runs' average per start
    plant = {}
    if loaded[0][1].env.domain_randomization.enabled:  # the critic's last entries: log factors, DR_LOG order
        from embodied.sim_backends.torch_vec.quadrotor import QuadrotorParams
        from embodied.tasks.quadrotor.hover import DR_CRITIC, DR_LOG

        logf = dict(zip(DR_LOG, start[:, -DR_CRITIC:].T))
        p = QuadrotorParams()
        tw = (p.rpm_max / p.hover_rpm) ** 2 * torch.exp(logf["thrust_constant"] - logf["mass"])
        plant["by_thrust_to_weight"] = {"mean": binned(mean, tw, TW_BINS), "union": binned(union.float(), tw, TW_BINS),
                                        "crashed": binned(crashes.float().mean(0), tw, TW_BINS)}
        # each factor alone, in thirds of its training range (DR_LOG and ranges() share the order)
        ranges = loaded[0][1].env.domain_randomization.ranges().values()
        thirds = lambda lo, hi: [lo + (hi - lo) * k / 3 for k in range(3)] + [hi * 1.001]  # noqa: E731
        plant["by_factor"] = {name: binned(mean, logf[name].exp(), thirds(lo, hi))
                              for name, (lo, hi) in zip(DR_LOG, ranges)}
    never = ~union
    runs = [{"run": r, "step": f["step"], "success": round(f["success"].float().mean().item(), 4),
             "crashed": int(lost.sum()), "gave up": int(f["gave_up"].sum()),
             "not held": int((~f["success"] & ~f["crashed"]).sum())}
            for r, f, lost in zip(args.runs, flown, crashes)]
    if args.members:
        for row, (policy, cfg, _) in zip(runs, loaded):
            row.update(members(policy, cfg, args.episodes, args.seed))
    ensemble = {}
    if args.ensemble:
        policies, cfg = [p for p, _, _ in loaded], loaded[0][1]
        for name, combine in (("mean", lambda a: a.mean(0)), ("median", lambda a: a.median(0).values)):
            won = fly(Combined(policies, combine), cfg, args.episodes, args.seed)["success"]
            ensemble[name] = round(won.float().mean().item(), 4)
    emit({"bench": "hover_ceiling", "machine": machine_info(), "episodes": args.episodes, "seed": args.seed,
          "runs": runs, "union_success": round(union.float().mean().item(), 4), "ensemble_success": ensemble,
          "flown_by_k_runs": [int((wins.sum(0) == k).sum()) for k in range(len(flown) + 1)],
          "mean_success": round(mean.mean().item(), 4),
          "by_tilt_deg": {"mean": binned(mean, tilt, TILT_BINS), "union": binned(union.float(), tilt, TILT_BINS)},
          "by_vz": {"mean": binned(mean, vz, VZ_BINS), "union": binned(union.float(), vz, VZ_BINS)},
          **plant,
          "never_flown": {"starts": int(never.sum()), **({
              "tilt_deg_mean": round(tilt[never].mean().item(), 1), "vz_mean": round(vz[never].mean().item(), 3),
              "z_mean": round(start[never, 2].mean().item(), 3)} if bool(never.any()) else {})}},
         args.out)


if __name__ == "__main__":
    main()
