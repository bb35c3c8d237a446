"""Which of quadrotor-hover's strict starts can be flown at all? A lower bound on the best success any controller
reaches on the task's initial-state (and, under domain randomization, plant) distribution, for issue 8's figures.

A stopped run's policy is flown from ``--episodes`` starts (each env's start a function of its seed alone:
``reset_envs``). For every start it fails, a cross-entropy search looks for a controller that flies it: the policy
plus open-loop action offsets over the first ``--window`` seconds (piecewise constant over ``--knot`` steps, sampled
around a mean that the elites move), the policy alone afterwards. The plant, its disturbance and its start are the
start's own (the same seed), so a found offset sequence is a controller that flies that start (the observation noise
is drawn anew each rollout: a success is a flight, not a replay). The search stops for a start at its first success.

``--eval-seed S`` searches the starts of ``embodied eval --run RUN --episodes N --seed S`` instead (the evaluation
env's own reset from ``S``, states, plants and disturbances copied into the search's envs): whether a fresh
100-start check can be passed at all.

The figure is ``feasible_at_least``: the share of starts flown by the policy or by a found controller. Starts that
no search flew are not proven impossible; they are listed by tilt, vertical velocity and (randomized plants)
thrust-to-weight. Prints one JSON.

    python scripts/bench/bench_hover_feasibility.py RUN [--episodes 2000] [--population 64] [--iterations 8]
        [--window 1.0] [--knot 5] [--batch 32] [--eval-seed S] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, machine_info  # noqa: E402
from bench_hover_ceiling import TILT_BINS, TW_BINS, VZ_BINS, binned, load  # noqa: E402

SEED0 = 777001  # the starts' seeds are SEED0 + 0, 1, ... (reset_envs: a start is its seed's alone)


class Captured:
    """The starts of an evaluation env reset from ``seed`` (``embodied eval --seed``): start ``i`` is its env ``i``'s
    state, plant (disturbance included) and noise factor, put into any env of the torch path."""

    def __init__(self, env, seed: int):
        env.reset(seed=seed)
        self.x, self.p, self.noise = env.sim.x.clone(), env.sim.p.clone(), env.noise_scale.clone()

    def __call__(self, env, ids: torch.Tensor):
        env.reset()  # episode bookkeeping as at a start; the noise stream goes on
        every = torch.arange(env.num_envs)
        env.sim.set_state_idx(every, self.x[ids])
        env.sim.set_params_idx(every, self.p[ids])
        env.noise_scale.copy_(self.noise[ids])
        return env._keep_average(env._observe())


def by_seed(env, seeds: torch.Tensor):
    return env.reset_envs(seeds)


@torch.no_grad()
def fly(env, policy, seeds: torch.Tensor, offsets: torch.Tensor | None = None, knot: int = 5, place=by_seed):
    """Each env's first episode from its start (``place(env, seeds)``: by default each start is its seed's), the policy
    acting plus ``offsets [N, K, 4]`` (normalized action units, knot ``k`` over steps ``k * knot ... (k + 1) * knot -
    1``). Returns success ``[N]``, steps survived ``[N]``, the critic observation at the start ``[N, C]`` and the final
    distance to the set-point ``[N]``."""
    obs = place(env, seeds)
    start = obs["critic"].clone()
    policy.reset()
    n = env.num_envs
    done = torch.zeros(n, dtype=torch.bool)
    success, steps, dist = torch.zeros(n, dtype=torch.bool), torch.zeros(n), torch.zeros(n)
    for t in range(env.max_episode_steps):
        action = policy.act(obs["policy"])
        if offsets is not None and t // knot < offsets.shape[1]:
            action = (action + offsets[:, t // knot]).clamp(-1.0, 1.0)
        obs, _, terminated, truncated, info = env.step(action)
        now = (terminated | truncated) & ~done
        if bool(now.any()):
            success[now] = info["final_info"]["success"][now].bool()
            steps[now] = t + 1.0
            dist[now] = info["final_obs"]["critic"][now, :3].norm(dim=1)
        policy.reset(terminated | truncated)
        done |= now
        if bool(done.all()):
            break
    return success, steps, start, dist


def search(env, policy, seeds: torch.Tensor, population: int, iterations: int, knots: int, knot: int,
           std0: float, elites: int, place=by_seed) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy search over open-loop offsets for each start of ``seeds [B]`` (``population`` rollouts a start
    an iteration). Returns found ``[B]`` bool and the iteration it was found at (-1: never)."""
    b = seeds.numel()
    mean, std = torch.zeros(b, knots, 4), torch.full((b, knots, 4), std0)
    found, at = torch.zeros(b, dtype=torch.bool), torch.full((b,), -1)
    rows = seeds.repeat_interleave(population)
    gen = torch.Generator().manual_seed(int(seeds[0]))
    for it in range(iterations):
        eps = torch.randn(b, population, knots, 4, generator=gen)
        eps[:, 0] = 0.0  # the mean itself is always flown
        offsets = mean[:, None] + std[:, None] * eps
        success, steps, _, dist = fly(env, policy, rows, offsets.reshape(b * population, knots, 4), knot, place)
        success, steps, dist = (v.reshape(b, population) for v in (success, steps, dist))
        new = success.any(1) & ~found
        at[new] = it
        found |= new
        if bool(found.all()):
            break
        # score: a success first, then the steps survived, then the final distance (the last only breaks ties)
        score = success.float() * 1e6 + steps * 10.0 - dist
        top = score.topk(elites, dim=1).indices
        chosen = torch.gather(offsets, 1, top[:, :, None, None].expand(b, elites, knots, 4))
        mean, std = chosen.mean(1), chosen.std(1).clamp_min(0.05)
    return found, at


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run")
    ap.add_argument("--episodes", type=int, default=2000)
    ap.add_argument("--population", type=int, default=64, help="rollouts a start an iteration")
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--window", type=float, default=1.0, help="[s] the offsets' span from the start")
    ap.add_argument("--knot", type=int, default=5, help="steps an offset is held")
    ap.add_argument("--std", type=float, default=0.5, help="the offsets' first std (normalized action units)")
    ap.add_argument("--elites", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32, help="starts searched at once")
    ap.add_argument("--eval-seed", type=int, default=None,
                    help="search the starts of `embodied eval --run RUN --episodes EPISODES --seed S`")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from embodied.evaluate import make_eval_env
    from embodied.sim_backends.torch_vec.quadrotor import QuadrotorParams
    from embodied.tasks.quadrotor.hover import DR_CRITIC, DR_LOG

    policy, cfg, step = load(Path(args.run))
    place, seeds = by_seed, SEED0 + torch.arange(args.episodes)
    if args.eval_seed is not None:  # the evaluation's env, as `embodied eval` builds it (its own kernel)
        place, seeds = Captured(make_eval_env(cfg, num_envs=args.episodes), args.eval_seed), torch.arange(args.episodes)
    cfg.env = dataclasses.replace(cfg.env, kernel="torch")  # reset_envs: each start from its own seed
    t0 = time.perf_counter()
    env = make_eval_env(cfg, num_envs=args.episodes)
    success, _, start, _ = fly(env, policy, seeds, place=place)
    policy_s = time.perf_counter() - t0
    failed = seeds[~success]
    knots = max(1, round(args.window / QuadrotorParams().dt / args.knot))
    found = torch.zeros(failed.numel(), dtype=torch.bool)
    at = torch.full((failed.numel(),), -1)
    t1 = time.perf_counter()
    for i in range(0, failed.numel(), args.batch):
        chunk = failed[i:i + args.batch]
        big = make_eval_env(cfg, num_envs=chunk.numel() * args.population)
        found[i:i + args.batch], at[i:i + args.batch] = search(
            big, policy, chunk, args.population, args.iterations, knots, args.knot, args.std, args.elites, place)
        print(f"searched {i + chunk.numel()}/{failed.numel()}: found {int(found.sum())} "
              f"({time.perf_counter() - t1:.0f} s)", file=sys.stderr, flush=True)
    flown = success.clone()
    flown[~success] = found
    tilt = torch.rad2deg(torch.acos(start[:, 11].clamp(-1, 1)))
    vz = start[:, 14]
    plant = {}
    if cfg.env.domain_randomization.enabled:
        logf = dict(zip(DR_LOG, start[:, -DR_CRITIC:].T))
        p = QuadrotorParams()
        tw = (p.rpm_max / p.hover_rpm) ** 2 * torch.exp(logf["thrust_constant"] - logf["mass"])
        never = ~flown
        plant = {"by_thrust_to_weight": {"policy": binned(success.float(), tw, TW_BINS),
                                         "feasible_at_least": binned(flown.float(), tw, TW_BINS)},
                 "unflown_thrust_to_weight": [round(v, 2) for v in tw[never].tolist()],
                 "unflown_inertia": [round(v, 2) for v in logf["inertia_xx"][never].exp().tolist()]}
    never = ~flown
    emit({"bench": "hover_feasibility", "machine": machine_info(), "run": args.run, "step": step,
          "starts": f"embodied eval --seed {args.eval_seed}" if args.eval_seed is not None else f"seeds {SEED0}+",
          "domain_randomization": cfg.env.domain_randomization.enabled, "episodes": args.episodes,
          "search": {"population": args.population, "iterations": args.iterations, "window_s": args.window,
                     "knot_steps": args.knot, "std": args.std, "elites": args.elites},
          "policy_success": round(success.float().mean().item(), 4),
          "searched": int(failed.numel()), "found": int(found.sum()),
          "found_at_iteration": [int((at == k).sum()) for k in range(args.iterations)],
          "feasible_at_least": round(flown.float().mean().item(), 4),
          "by_tilt_deg": {"policy": binned(success.float(), tilt, TILT_BINS),
                          "feasible_at_least": binned(flown.float(), tilt, TILT_BINS)},
          "by_vz": {"policy": binned(success.float(), vz, VZ_BINS),
                    "feasible_at_least": binned(flown.float(), vz, VZ_BINS)},
          **plant,
          "unflown": {"starts": int(never.sum()), "seeds": seeds[never].tolist(),
                      "tilt_deg": [round(v, 1) for v in tilt[never].tolist()],
                      "vz": [round(v, 2) for v in vz[never].tolist()],
                      "z": [round(v, 3) for v in start[never, 2].tolist()]},
          "wall_s": {"policy": round(policy_s, 1), "search": round(time.perf_counter() - t1, 1)}},
         args.out)


if __name__ == "__main__":
    main()
