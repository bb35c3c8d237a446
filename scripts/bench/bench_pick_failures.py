"""Where a pick-place policy fails (issue 12's residual lift diagnosis): the run's policy (``load_policy``) on the
first episode of each of ``--episodes`` envs (``embodied eval``'s starts), each episode classed by the cube's path:
``success``, ``never lifted`` (the cube never rose 1 cm: the grasp missed and was not retried), ``over the plate``
(it ended above the plate, not resting on it: split by the state before the episode's last action into ``held
above the plate``, the command closed with the cube over 1 cm above its resting height, ``moving over the plate``,
the cube at 5 cm/s or faster, and ``still off its rest``, the rest: tilted on the plate's edge or wedged) or
``lifted, not placed`` (lifted, then dropped or carried elsewhere);
the gripper splits two of them (its command's sign closes, > 0, or opens the fingers): ``never lifted`` into ``never
closed at the cube`` (the command stayed open on every step the grip point was within 2 cm of the cube) and ``closed,
not lifted``; ``lifted, not placed`` into ``released`` (the command was open on the cube's last lifted step: the
policy let go) and ``slipped`` (closed there: the cube fell out of the fingers); ``released`` again into ``released
near the goal`` (the cube within 10 cm of the goal point then: a placement that missed) and ``released away`` (a drop
on the way).
A mini-libero run (issue 13) is classed per task: ``success``, ``never reached`` (the grip point never came within
2 cm of the instructed cube), ``wrong cube lifted`` (another cube rose 1 cm; not a success), ``lifted, not placed``
(the instructed cube rose, the goal never held: split into ``ended over the goal``, within 4.5 cm of the goal point
in the plane at the episode's end, ``released`` and ``slipped`` as for pick-place) and ``reached, not lifted``; for
a VLA with entity pointers also ``pointer lost``: failed episodes in which the first pointer left the instructed cube
at some step (a tag across the classes: the clone chose, or switched to, another cube), and ``froze`` (another tag:
failed episodes whose grip point moved less than ``FROZEN_MM`` over their last ``FROZEN_STEPS`` steps: the policy
came to rest before the goal held; on mini-libero's stacking task most failures of the 10-demo ensembles, the cube
held at the carry height 3-8 mm off the support cube's centre while the members' actions there cancel, issue 13).
Prints one JSON per run.

    python scripts/bench/bench_pick_failures.py RUN [RUN ...] [--episodes 100]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, first_episodes, machine_info  # noqa: E402

# [m] a release with the cube's centre within this of the goal point in the plane (on its newest lifted step) was a
# placement that missed (let go too early or off target); farther out, a drop on the way
RELEASE_NEAR = 0.10
GOAL_NEAR = 0.045  # [m] the cube's centre within this of the goal point (the plate's half width): over the goal
FROZEN_STEPS, FROZEN_MM = 20, 2.0  # a failed episode whose grip point moved less than this over its last steps froze


@torch.no_grad()
def classify(run: Path, episodes: int) -> dict:
    from embodied.checkpoint import load_checkpoint, policy_from_checkpoint
    from embodied.config import config_from_dict
    from embodied.evaluate import eval_seed, make_eval_env
    from embodied.tasks.manipulation.tabletop import CUBE, PickPlaceEnv

    ckpt = load_checkpoint(run)
    cfg = config_from_dict(ckpt["config"])
    policy = policy_from_checkpoint(ckpt, run)
    env = make_eval_env(cfg, num_envs=episodes)
    if hasattr(env, "cube_poses"):  # mini-libero
        return {"run": str(run), "task": cfg.task, "step": int(ckpt["step"]), "episodes": episodes,
                **classify_suite(env, policy, eval_seed(cfg))}
    if not isinstance(env, PickPlaceEnv):
        raise SystemExit(f"{run}: a pick-place run is needed, this one is {cfg.task}")
    n = episodes
    lifted, over, near, closed_at, closed_up, up_near = (torch.zeros(n, dtype=torch.bool) for _ in range(6))
    held, moving, end_held, end_moving = (torch.zeros(n, dtype=torch.bool) for _ in range(4))

    def watch(live: torch.Tensor, obs: dict, action: torch.Tensor) -> None:
        pos, _ = env.object_pose()
        grip, _ = env.controller.ee_pose()
        closing = action[:, -1] > 0
        up = pos[:, 2] > CUBE + 0.01
        lifted[live] |= up[live]
        at_cube = live & ((grip - pos).norm(dim=1) < 0.02)
        closed_at[at_cube] |= closing[at_cube]
        closed_up[live & up] = closing[live & up]  # the command on the newest lifted step
        off = pos[:, :2] - env.goal[:, :2]
        up_near[live & up] = (off.norm(dim=1) < RELEASE_NEAR)[live & up]  # and where the cube was then
        near[:] = (off.abs() < env.PLATE[0]).all(1)
        held[:] = closing & (pos[:, 2] - env.goal[:, 2] > 0.01)
        moving[:] = env.sim.qvel[:, env.obj_dof:env.obj_dof + 3].norm(dim=1) >= 0.05

    def ended(mask: torch.Tensor, terminated: torch.Tensor) -> None:  # where the cube was when the episode ended
        over[mask], end_held[mask], end_moving[mask] = near[mask], held[mask], moving[mask]

    success = first_episodes(env, policy, eval_seed(cfg), watch, ended)
    dropped = ~success & lifted & ~over
    released = dropped & ~closed_up
    on_plate = ~success & lifted & over
    classes = {"success": success, "never lifted": ~success & ~lifted, "over the plate": on_plate,
               "held above the plate": on_plate & end_held, "moving over the plate": on_plate & ~end_held & end_moving,
               "still off its rest": on_plate & ~end_held & ~end_moving,
               "lifted, not placed": dropped, "never closed at the cube": ~success & ~lifted & ~closed_at,
               "closed, not lifted": ~success & ~lifted & closed_at, "released": released,
               "released near the goal": released & up_near, "released away": released & ~up_near,
               "slipped": dropped & closed_up}
    return {"run": str(run), "task": cfg.task, "step": int(ckpt["step"]), "episodes": n,
            **{k: int(v.sum()) for k, v in classes.items()}}


def classify_suite(env, policy, seed: int) -> dict:
    """mini-libero: the first episode of every env classed by what the grip and the cubes did, per task."""
    from embodied.tasks.manipulation.tabletop import CUBE

    n = env.num_envs
    rows = torch.arange(n)
    task, target = torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long)
    reached, lifted, wrong, lost, closed_up, near, over, up_near = (torch.zeros(n, dtype=torch.bool) for _ in range(8))
    pointers = next((m for m in policy.modules()
                     if hasattr(m, "pointer_logits") and getattr(m, "pointers", None) is not None), None)
    first = True
    path: list[torch.Tensor] = []  # the grip point before every step
    length = torch.zeros(n, dtype=torch.long)  # each first episode's steps

    def watch(live: torch.Tensor, obs: dict, action: torch.Tensor) -> None:
        nonlocal first
        if first:  # each env's first episode's task, read after the reset that drew it
            task[:], target[:] = env.task_id, env.target
            first = False
        pos, _ = env.cube_poses()
        grip, _ = env.controller.ee_pose()
        path.append(grip.clone())
        length[live] += 1
        up = pos[:, :, 2] > CUBE + 0.01
        others = up.clone()
        others[rows, target] = False
        reached[live] |= ((grip - pos[rows, target]).norm(dim=1) < 0.02)[live]
        lifted[live] |= up[rows, target][live]
        mine_up = live & up[rows, target]
        closed_up[mine_up] = (action[:, -1] > 0)[mine_up]  # the gripper command on the cube's newest lifted step
        off = (pos[rows, target, :2] - env.goal_point()[:, :2]).norm(dim=1)
        up_near[mine_up] = (off < RELEASE_NEAR)[mine_up]  # and where the cube was then
        near[:] = off < GOAL_NEAR
        wrong[live] |= others.any(1)[live]
        if pointers is not None:
            lost[live] |= (pointers.pointer_logits(obs["policy"])[:, 0].argmax(-1) != target)[live]

    def ended(mask: torch.Tensor, terminated: torch.Tensor) -> None:  # where the cube was when the episode ended
        over[mask] = near[mask]

    success = first_episodes(env, policy, seed, watch, ended)
    fail = ~success
    froze = fail & frozen(torch.stack(path), length)
    placed_not = fail & ~wrong & lifted
    released = placed_not & ~over & ~closed_up
    classes = {"success": success, "never reached": fail & ~wrong & ~lifted & ~reached,
               "wrong cube lifted": fail & wrong,
               "lifted, not placed": placed_not, "reached, not lifted": fail & ~wrong & reached & ~lifted,
               "ended over the goal": placed_not & over, "released": released,
               "released near the goal": released & up_near, "released away": released & ~up_near,
               "slipped": placed_not & ~over & closed_up}
    if pointers is not None:
        classes["pointer lost"] = fail & lost
    classes["froze"] = froze
    per_task = {name: {"episodes": int((task == i).sum())} | {k: int((v & (task == i)).sum()) for k, v in
                                                             classes.items()} for i, name in enumerate(env.task_names)}
    return {**{k: int(v.sum()) for k, v in classes.items()}, "per_task": per_task}


def frozen(path: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """``[N]``: whether each episode's grip point (``path [T, N, 3]``, its first ``length [N]`` rows its episode's)
    moved less than ``FROZEN_MM`` between its ``FROZEN_STEPS``-th last step and its last (episodes shorter than
    ``FROZEN_STEPS`` + 1 steps: never)."""
    rows = torch.arange(path.shape[1])
    last = (length - 1).clamp_min(0)
    moved = (path[last, rows] - path[(last - FROZEN_STEPS).clamp_min(0), rows]).norm(dim=1) * 1000.0
    return (length > FROZEN_STEPS) & (moved < FROZEN_MM)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--episodes", type=int, default=100)
    args = ap.parse_args()
    emit({"bench": "pick_failures", "machine": machine_info(),
          "runs": [classify(Path(r), args.episodes) for r in args.runs]}, None)


if __name__ == "__main__":
    main()
