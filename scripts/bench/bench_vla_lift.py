"""RL lift of the VLA on mini-libero (issue 13): per seed and demonstration budget (1 and 10 per task),

- ``bc{k}``: ``embodied collect-demos --task mini-libero --episodes 13k`` (spread over the 13 tasks), then
  ``embodied train algo=bc policy.arch=vla data=DEMOS`` (``--bc-steps`` gradient steps);
- ``grpo{k}``: ``embodied train algo=grpo policy.arch=vla init=BC_RUN`` for ``--rl-steps`` env steps;
- ``ppo{k}``: ``embodied train algo=ppo policy.arch=vla init=BC_RUN`` (critic warm-up) for the same env steps;
- ``residual-sac{k}``: ``embodied train algo=residual-sac base=BC_RUN`` (a residual over the frozen clone, 16 envs);
- ``residual-ppo{k}``: ``embodied train algo=residual-ppo base=BC_RUN`` (ResiP's residual PPO, 64 envs);
- ``residual-td3{k}``: ``embodied train algo=residual-td3 base=BC_RUN`` (pick-place's residual recipe, 16 envs);
- ``filtered-bc{k}``: ``embodied train algo=filtered-bc init=BC_RUN`` (success-filtered self-imitation; with
  ``--rl-set data=DEMOS`` the demonstrations stay in its pool);

ensembles of clones: ``--bc-set ensemble=5`` clones five at once (their action mean is the BC policy), then
``--variants filtered-bc --rl-set data=DEMOS filtered-bc.members=5`` fine-tunes them as one;

each scored by ``embodied eval --episodes 130`` (10 per task in expectation; per-task and per-group success), the
BC runs also on the held-out paraphrases (``env.phrasing=heldout``). Observations: ``--observation state`` (the
objects' state; default) or ``pixels`` (agentview + wrist). Wall-clock per step and the pipeline's (demos + BC + RL:
the sum of those commands' walls, evaluations during training included) are recorded. Goal: RL adds >= 30 points to
the 1-demo BC policy and reaches >= 90% from the 10-demo one; BC + RL <= 2 hours on 2 cores (aim 30 minutes).

Resumable: one JSON per (variant, seed) under ``--out``; finished ones are skipped. ``--extend`` continues finished
RL runs that made fewer than ``--rl-steps`` env steps from their last checkpoint (``embodied train --resume RUN
total_steps=N``) and scores them again; the JSON keeps each earlier score under ``earlier`` and adds the extension's
wall to the run's. ``--plot`` draws the curves (eval success against env steps of the RL runs) as a PNG beside them.

    python scripts/bench/bench_vla_lift.py [--seeds 0 1 2] [--demos 1 10] [--variants bc grpo ppo] [--rl-steps N]"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, machine_info, run_json  # noqa: E402

TASK = "mini-libero"
TASKS_PER_SUITE = 13
COMMON = ["log.progress=false", "log.checkpoint_every=0", "torch_threads=2", "policy.arch=vla"]
BC = ["algo=bc", "policy.vla.label_sigma=8", "bc.batch_size=256", "num_envs=26", "log.eval_every=0",
      "log.eval_episodes=26"]
# GRPO updates after every rollout that holds a mixed group (batch_groups=1): waiting for 8 (the default at 64 envs)
# took 3-4 rollouts of ~9.6k steps each at a 10% success rate (3 updates in 100k steps); lr 3e-4 fell (0.16 -> 0.06)
RL = {"grpo": ["algo=grpo", "num_envs=64", "grpo.group_size=8", "grpo.batch_groups=1", "grpo.lr=1e-4",
               "grpo.temperature=1.0",
               "log.eval_every=50000", "log.eval_episodes=65"],
      "ppo": ["algo=ppo", "num_envs=64", "ppo.num_steps=50", "ppo.lr=1e-4", "ppo.critic_warmup=5",
              "policy.critic_hidden=[256,256]", "ppo.entropy_coef=0.0", "log.eval_every=50000",
              "log.eval_episodes=65"],
      # residual SAC over the frozen clone (issue 12's learner) on the task's dense reward terms
      "residual-sac": ["algo=residual-sac", "num_envs=16", "log.eval_every=50000", "log.eval_episodes=65"],
      # residual TD3 over the frozen clone with pick-place's recipe (issue 12: a deterministic residual, LayerNorm
      # critics, its slow average deployed)
      "residual-td3": ["algo=residual-td3", "num_envs=16", "policy.critic_layer_norm=true",
                       "residual-td3.deploy_average=true", "residual-td3.average_tau=0.0005", "log.eval_every=50000",
                       "log.eval_episodes=65"],
      # success-filtered BC from the clone: its successful rollouts (temperature 1) join the demonstrations, 200
      # cloning steps (lr 1e-3) after every rollout (give the demonstrations with --rl-set data=DEMOS)
      "filtered-bc": ["algo=filtered-bc", "num_envs=64", "log.eval_every=50000", "log.eval_episodes=65"],
      # residual PPO (ResiP's settings, issue 12's learner): a small Gaussian residual over the frozen clone
      "residual-ppo": ["algo=residual-ppo", "num_envs=64", "log.eval_every=50000", "log.eval_episodes=65"]}


def _run(cmd: list[str], timeout_s: float) -> tuple[dict, float, str]:
    return run_json(cmd, timeout_s)


def _collect_demos(demos: Path, per_task: int, seed: int, timeout_s: float, extra: list[str]) -> tuple[dict, float]:
    """``per_task`` expert demonstrations of every mini-libero task into ``demos`` (afresh), the seed's set; the
    collector's summary and wall [s]."""
    if demos.exists():  # a collection stopped part-way starts afresh
        shutil.rmtree(demos)
    summary, wall, _ = _run(["embodied", "collect-demos", "--task", TASK, "--episodes", str(per_task * TASKS_PER_SUITE),
                             "--out", str(demos), "--seed", str(1000 + seed), "--num-envs", "26", *extra], timeout_s)
    return summary, wall


def _train(run_dir: Path, args: list[str], timeout_s: float) -> tuple[dict, float, str]:
    if run_dir.exists():  # a run stopped before its JSON was written starts afresh
        shutil.rmtree(run_dir)
    return _run(["embodied", "train", "--task", TASK, "--run-dir", str(run_dir), *args, *COMMON], timeout_s)


def _eval(run_dir: Path, episodes: int, timeout_s: float, *overrides: str) -> dict:
    out, _, _ = _run(["embodied", "eval", "--run", str(run_dir), "--episodes", str(episodes), *overrides], timeout_s)
    per_task = {k[len("eval/success/"):]: v for k, v in out.items() if k.startswith("eval/success/")}
    groups = {}
    for g in ("spatial", "object", "goal"):
        vals = [v for k, v in per_task.items() if k.startswith(g)]
        if vals:
            groups[g] = round(sum(vals) / len(vals), 3)
    return {"success": out["eval/success"], "per_group": groups, "per_task": per_task}


def _curve(run_dir: Path) -> list[tuple[int, float, float]]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [(r["step"], round(r["eval/success"], 3), round(r.get("time/train_s", 0.0), 1)) for r in rows
            if "eval/success" in r]


RL_STEPS = 300_000  # --rl-steps' default


def _run_dir(out: Path, name: str, observation: str, seed: int) -> Path:
    """Where the run of variant ``name`` (``bc10``, ``filtered-bc10``, ...) for ``seed`` lives under ``--out``."""
    return out / "runs" / f"{name}_{observation}_seed{seed}"


def _rl_steps(result: dict) -> int:
    """The env-step budget a finished RL run was given (JSONs before ``rl_steps`` was recorded: the default's)."""
    return int(result.get("rl_steps", RL_STEPS))


def _extend(result: dict, out: Path, path: Path, args) -> None:
    """Continue the finished RL run of ``result`` to ``--rl-steps`` env steps from its last checkpoint, score it again
    (the earlier score kept under ``earlier``) and rewrite its JSON."""
    from embodied.provenance import code_commit

    run_dir = _run_dir(out, result["variant"], result["observation"], result["seed"])
    print(f"extending {result['variant']} seed {result['seed']} to {args.rl_steps} steps", file=sys.stderr, flush=True)
    _, wall, _ = _run(["embodied", "train", "--resume", str(run_dir), f"total_steps={args.rl_steps}"], args.timeout_s)
    earlier = {k: result[k] for k in ("train_wall_s", "eval", "pipeline_wall_s", "commit") if k in result}
    result["earlier"] = [*result.get("earlier", []), {"rl_steps": _rl_steps(result), **earlier}]
    result.update(rl_steps=args.rl_steps, train_wall_s=round(result["train_wall_s"] + wall, 1),
                  pipeline_wall_s=round(result["pipeline_wall_s"] + wall, 1), curve=_curve(run_dir),
                  eval=_eval(run_dir, args.eval_episodes, args.timeout_s), commit=code_commit(),
                  machine=machine_info())
    path.write_text(json.dumps(result, indent=1))


def main() -> None:
    from embodied.provenance import code_commit

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--demos", type=int, nargs="*", default=[1, 10], help="demonstrations per task")
    ap.add_argument("--variants", nargs="*", default=["bc", "grpo", "ppo"], choices=["bc", *RL])
    ap.add_argument("--bc-steps", type=int, default=2000)
    ap.add_argument("--rl-steps", type=int, default=RL_STEPS)
    ap.add_argument("--observation", default="state", choices=["state", "pixels"])
    ap.add_argument("--eval-episodes", type=int, default=130)
    ap.add_argument("--timeout-s", type=float, default=4 * 3600.0)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="settings for every train command (e.g. policy.vla.state_encoder=mlp)")
    ap.add_argument("--bc-set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="settings for the bc command only (e.g. bc.ground=1)")
    ap.add_argument("--rl-set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="settings for the RL commands only (e.g. ppo.bc_coef=0.5); DEMOS in a value stands for the "
                         "seed's demonstrations")
    ap.add_argument("--demo-args", nargs="*", default=[], metavar="ARG",
                    help="more collect-demos arguments (e.g. --demo-args=--detour=0.5)")
    ap.add_argument("--out", default="bench_results/vla_lift")
    ap.add_argument("--extend", action="store_true",
                    help="continue finished RL runs that made fewer than --rl-steps env steps, then score them again")
    ap.add_argument("--plot", action="store_true", help="only draw the curves of what ran")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    settings = [f"env.observation={args.observation}", *args.set]  # every train command's
    if not args.plot:
        for seed in args.seeds:
            for k in args.demos:
                for variant in args.variants:
                    name = f"{variant}{k}"
                    path = out / f"{name}_{args.observation}_seed{seed}.json"
                    done = json.loads(path.read_text()) if path.exists() else {}
                    if done.get("finished"):
                        if args.extend and variant != "bc" and _rl_steps(done) < args.rl_steps:
                            _extend(done, out, path, args)
                        continue
                    print(f"running {name} seed {seed}", file=sys.stderr, flush=True)
                    bc_dir = _run_dir(out, f"bc{k}", args.observation, seed)
                    result = {"variant": name, "seed": seed, "demos_per_task": k, "observation": args.observation}
                    if variant == "bc":
                        demos = out / "demos" / f"demos{k}_seed{seed}"
                        summary, demo_wall = _collect_demos(demos, k, seed, args.timeout_s, args.demo_args)
                        _, wall, log = _train(bc_dir, [*BC, *settings, *args.bc_set, f"seed={seed}", f"data={demos}",
                                                       f"total_steps={args.bc_steps}"], args.timeout_s)
                        result.update(demos=summary, demos_wall_s=round(demo_wall, 1), train_wall_s=round(wall, 1),
                                      policy=next((ln for ln in log.splitlines() if ln.startswith("vla:")), ""),
                                      eval=_eval(bc_dir, args.eval_episodes, args.timeout_s),
                                      heldout=_eval(bc_dir, args.eval_episodes, args.timeout_s,
                                                    "env.phrasing=heldout"))
                    else:
                        if not bc_dir.exists():
                            raise SystemExit(f"{name} needs {bc_dir}: run the bc variant first")
                        run_dir = _run_dir(out, name, args.observation, seed)
                        start = f"base={bc_dir}" if variant.startswith("residual") else f"init={bc_dir}"
                        rl_set = [a.replace("DEMOS", str(out / "demos" / f"demos{k}_seed{seed}"))
                                  for a in args.rl_set]
                        summary, wall, _ = _train(run_dir, [*RL[variant], *settings, *rl_set, f"seed={seed}", start,
                                                            f"total_steps={args.rl_steps}"], args.timeout_s)
                        # log.keep_best=true: the run's policy is its best in-run evaluation's (kept_step)
                        result.update(train_wall_s=round(wall, 1), curve=_curve(run_dir), rl_steps=args.rl_steps,
                                      kept_step=summary.get("best_step"),
                                      eval=_eval(run_dir, args.eval_episodes, args.timeout_s))
                    # the user's wait for this policy: demos + BC (+ this RL run), each command's wall, not the runs
                    # of other variants this invocation made in between
                    if variant == "bc":
                        pipeline = result["demos_wall_s"] + result["train_wall_s"]
                    else:
                        bc = json.loads((out / f"bc{k}_{args.observation}_seed{seed}.json").read_text())
                        pipeline = bc["demos_wall_s"] + bc["train_wall_s"] + result["train_wall_s"]
                    result.update(finished=True, pipeline_wall_s=round(pipeline, 1),
                                  commit=code_commit(), machine=machine_info())
                    path.write_text(json.dumps(result, indent=1))
    runs = [json.loads(p.read_text()) for p in sorted(out.glob("*_seed*.json"))]
    _plot(runs, out / "vla_lift.png")
    emit({"benchmark": "vla_lift", "machine": machine_info(), "runs": [
        {k: r.get(k) for k in ("variant", "seed", "observation", "train_wall_s", "pipeline_wall_s")}
        | {"success": r["eval"]["success"], "per_group": r["eval"]["per_group"],
           "heldout_success": (r.get("heldout") or {}).get("success")} for r in runs]}, None)


def _plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in runs:
        if r.get("curve"):
            steps, success = [c[0] for c in r["curve"]], [c[1] for c in r["curve"]]
            ax.plot(steps, success, marker="o", label=f"{r['variant']} seed {r['seed']}")
        elif r["variant"].startswith("bc"):
            ax.axhline(r["eval"]["success"], ls="--", lw=0.8, label=f"{r['variant']} seed {r['seed']}")
    ax.set_xlabel("RL env steps")
    ax.set_ylabel("success (mini-libero, 13 tasks)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
