"""The ``embodied`` command line: train, eval, export, deploy, wm-report, wm-fit, collect-demos, tasks.

Errors a user can cause end in one line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from embodied.core.errors import UserError

EXIT_USER_ERROR = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one clear line instead of usage + message
        raise UserError(f"{self.prog}: {message} (see --help)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="embodied", description="Robotics and embodied RL: train, evaluate, export, list tasks.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    t = sub.add_parser("train", help="train a policy on a task")
    t.add_argument("--task", help="task name (see `embodied tasks`)")
    t.add_argument("--preset", default=None, help="extra preset from configs/, e.g. debug")
    t.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    t.add_argument("--run-dir", default=None, help="write the run here instead of runs/<task>/<timestamp>")
    t.add_argument("overrides", nargs="*", help="config overrides key=value (e.g. total_steps=20000 seed=3)")
    e = sub.add_parser("eval", help="evaluate a trained run")
    e.add_argument("--run", required=True, help="run directory")
    e.add_argument("--episodes", type=int, default=100)
    e.add_argument("--video", action="store_true", help="also write a rollout video into the run directory")
    e.add_argument("--seed", type=int, default=None, help="initial-state seed (default: the run's eval seed)")
    e.add_argument("overrides", nargs="*", help="task settings to evaluate under, env.KEY=VALUE (e.g. "
                   "env.phrasing=heldout: a language task's held-out paraphrases)")
    w = sub.add_parser("wm-report", help="open-loop prediction error of a world-model run's model against horizon")
    w.add_argument("--run", required=True, help="directory holding a world_model.pt (a wm:<task> run, or a model "
                   "alone: then random actions)")
    w.add_argument("--episodes", type=int, default=20, help="held-out real episodes to record (default 20)")
    w.add_argument("--horizon", type=int, default=50, help="longest open-loop horizon [steps] (default 50)")
    w.add_argument("--seed", type=int, default=None, help="seed of the held-out episodes")
    f = sub.add_parser("wm-fit", help="fit an RSSM world model of an image task (wm:<task> env.model=OUT steps it)")
    f.add_argument("--task", required=True, help="an image task (e.g. pendulum-pixels)")
    f.add_argument("--out", required=True, help="directory for world_model.pt; a fit there resumes")
    f.add_argument("--data", default=None, help="a Minari dataset of the task (default: random-action episodes)")
    f.add_argument("--episodes", type=int, default=24, help="random-action episodes to record (default 24)")
    f.add_argument("--updates", type=int, default=3000, help="gradient updates in all (default 3000)")
    f.add_argument("--preset", default="size1m", help="RSSM sizes: size1m or size12m (default size1m)")
    f.add_argument("--depth", type=int, default=8, help="channels of the first conv layer (default 8)")
    f.add_argument("--batch", type=int, default=16, help="sequences per update (default 16)")
    f.add_argument("--length", type=int, default=32, help="steps per training sequence (default 32)")
    f.add_argument("--frame-channels", type=int, default=3, help="channels of one frame of the stack (default 3)")
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    f.add_argument("overrides", nargs="*", help="task settings env.KEY=VALUE (e.g. env.image_size=32)")
    te = sub.add_parser("export-text-encoder", help="export the instruction encoder (MiniLM) to ONNX + tokenizer")
    te.add_argument("--out", required=True, help="directory for text_encoder.onnx and tokenizer.json")
    c = sub.add_parser("collect-demos", help="record a task's scripted expert as a Minari dataset")
    c.add_argument("--task", required=True, help="a task with a scripted expert (the manipulation tasks)")
    c.add_argument("--episodes", type=int, default=50, help="episodes to record (default 50)")
    c.add_argument("--out", default=None, help="dataset directory (default: demos/<task>-<episodes>)")
    c.add_argument("--num-envs", type=int, default=16, help="envs the expert plays at once (default 16)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--noise", type=float, default=None, help="expert action noise (default: the expert's)")
    c.add_argument("--target-noise", type=float, default=0.0, help="expert waypoint noise [m] (default 0)")
    c.add_argument("--miss", type=float, default=None, help="fraction of episodes whose first grasp the expert aims "
                   "off the object, then recovers (default 0)")
    c.add_argument("--detour", type=float, default=None, help="fraction of episodes whose carry goes first over a "
                   "point 3 cm from the goal, then corrects to it (default 0)")
    c.add_argument("--lift", default=None, choices=("timer", "held"), help="when a pick expert lifts a grasp: once "
                   "the fingers had 0.3 s to close (timer, the default) or as soon as they hold the object (held)")
    c.add_argument("overrides", nargs="*", help="task settings env.KEY=VALUE (e.g. env.observation=state); train "
                   "on the dataset with the same settings")
    c.add_argument("--keep-failures", action="store_true", help="record failed episodes too")
    sub.add_parser("tasks", help="list registered tasks")
    x = sub.add_parser("export", help="write a deploy bundle (ONNX, C) of a trained run")
    x.add_argument("--run", required=True, help="run directory")
    x.add_argument("--format", default="all", help="onnx | c | all (default: all)")
    x.add_argument("--out", default=None, help="bundle directory (default: RUN/bundle)")
    x.add_argument("--observations", type=int, default=1024,
                   help="recorded observations the parity check runs on (default 1024)")
    d = sub.add_parser("deploy", help="fly a deploy bundle on a robot (sim://, serial://, mavlink://, crazyflie://)")
    d.add_argument("--bundle", required=True, help="bundle directory (embodied export)")
    d.add_argument("--robot", required=True, help="robot URI, e.g. sim://quadrotor-hover?mass=1.2")
    d.add_argument("--duration", type=float, default=10.0, help="flight time [s] before landing (default 10)")
    d.add_argument("--rate", type=float, default=None, help="control rate [Hz] (default: the layout's)")
    d.add_argument("--backend", default="onnx", help="onnx | c: what runs the policy on this side")
    d.add_argument("--log-dir", default=None, help="flight logs here (default: BUNDLE/flights)")
    d.add_argument("--lockstep", action="store_true", help="no real-time pacing (a simulated plant waits)")
    d.add_argument("--geofence", type=float, default=None, help="land when the position leaves this radius [m]")
    d.add_argument("--max-rate", type=float, default=None, help="rate limit [action units / s]")
    d.add_argument("--instruction", default=None, help="a language-conditioned bundle: the instruction to follow "
                   "(one the bundle knows)")
    d.add_argument("--text-encoder", default=None, help="an exported instruction encoder (embodied "
                   "export-text-encoder): lets --instruction be any text, not only the bundle's")
    d.add_argument("--residual-limit", type=float, default=None,
                   help="a residual bundle: bound |action - base action| per entry [normalized action units] "
                        "(default: the limit it was trained with)")
    return p


def _cmd_deploy(args) -> int:
    from embodied.hardware.deploy import deploy
    from embodied.hardware.safety import SafetyConfig

    if args.duration is not None and args.duration <= 0:
        raise UserError("--duration must be > 0")
    if args.rate is not None and args.rate <= 0:
        raise UserError("--rate must be > 0")
    summary = deploy(Path(args.bundle), args.robot, args.duration, args.rate, args.backend,
                     Path(args.log_dir) if args.log_dir else None, args.lockstep, args.instruction,
                     Path(args.text_encoder) if args.text_encoder else None,
                     safety=SafetyConfig(max_rate=args.max_rate, geofence_radius=args.geofence,
                                         residual_limit=args.residual_limit))
    print(json.dumps(summary))
    return 1 if summary["outcome"] == "fault" else 0


def _cmd_train(args) -> int:
    from embodied.config import load_config
    from embodied.train import resume, train

    if args.resume:
        total = None
        for item in args.overrides:  # only the step budget may change on resume
            key, _, value = item.partition("=")
            if key != "total_steps" or not value.isdigit():
                raise UserError(f"on --resume only total_steps=N may be overridden, got {item!r}")
            total = int(value)
        run_dir, summary = resume(Path(args.resume), total_steps=total)
    else:
        if not args.task:
            raise UserError("train needs --task (see `embodied tasks`)")
        cfg = load_config(args.task, args.preset, args.overrides)
        run_dir, summary = train(cfg, Path(args.run_dir) if args.run_dir else None)
    print(json.dumps({"run_dir": str(run_dir), **summary}))
    return 0


def _cmd_eval(args) -> int:
    from embodied.evaluate_run import evaluate_run

    if args.episodes < 1:
        raise UserError("--episodes must be >= 1")
    result = evaluate_run(Path(args.run), episodes=args.episodes, video=args.video, seed=args.seed,
                          env_overrides=args.overrides)
    if "eval/success" in result:  # the headline for a person; stdout stays one JSON object
        print(f"success {100 * result['eval/success']:.0f}% ({args.episodes} episodes)", file=sys.stderr)
        for key, value in result.items():
            if key.startswith("eval/success/"):  # a suite's tasks
                print(f"  {key[len('eval/success/'):]:32s} {100 * value:5.1f}%", file=sys.stderr)
    print(json.dumps(result))
    return 0


def _cmd_export(args) -> int:
    from embodied.hardware.bundle import export_run

    if args.observations < 1:
        raise UserError("--observations must be >= 1")
    meta = export_run(Path(args.run), Path(args.out) if args.out else None, args.format, args.observations)
    print(json.dumps({"bundle": str(Path(args.out) if args.out else Path(args.run) / "bundle"),
                      "task": meta["task"], "parity": meta["parity"], "c": meta["c"]}))
    return 0


def _cmd_wm_report(args) -> int:
    from embodied.tasks.world_model.report import HORIZONS, wm_report

    if args.episodes < 1 or args.horizon < 1:
        raise UserError("--episodes and --horizon must be >= 1")
    result = wm_report(Path(args.run), args.episodes, args.seed, horizon=args.horizon)
    summary = {"mean_psnr": result["mean_psnr"]} if result["kind"] == "rssm" else \
        {"nmse": {h: r["nmse"] for h, r in result["horizons"].items() if int(h) in HORIZONS}}
    print(json.dumps({"report": str(Path(args.run) / "wm_report.json"), "task": result["task"], **summary}))
    return 0


def _cmd_wm_fit(args) -> int:
    import torch

    from embodied.evaluate_run import parse_env_settings
    from embodied.tasks.world_model.rssm_fit import RSSMFit

    if args.updates < 1 or args.threads < 1:
        raise UserError("--updates and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    fit = RSSMFit(args.task, Path(args.out), parse_env_settings(args.overrides, "wm-fit"), args.data, args.episodes,
                  args.preset, args.depth, args.batch, args.length, args.frame_channels, args.seed)

    def progress(r: dict) -> None:
        loss = r["last_metrics"].get("rssm/loss", float("nan"))
        print(f"\rupdate {r['updates']}/{args.updates}  loss {loss:.3f}  {r['train_s']:.0f} s", end="",
              file=sys.stderr, flush=True)

    result = fit.fit(args.updates, progress)
    print(file=sys.stderr)
    print(json.dumps({"model": str(Path(args.out) / "world_model.pt"), "task": args.task,
                      **{k: result[k] for k in ("updates", "train_s", "parameters")},
                      "loss": result.get("last_metrics", {}).get("rssm/loss")}))
    return 0


def _cmd_collect_demos(args) -> int:
    import embodied.tasks  # noqa: F401
    from embodied.datasets import collect_demos

    out = args.out or f"demos/{args.task}-{args.episodes}"
    from embodied.evaluate_run import parse_env_settings

    # task settings the demonstrations are recorded under (env.observation=state); the task's config checks the keys
    settings = parse_env_settings(args.overrides, "collect-demos")
    summary = collect_demos(args.task, args.episodes, out, args.num_envs, args.seed, args.noise, args.target_noise,
                            args.keep_failures, settings, args.miss, args.detour, args.lift)
    print(json.dumps(summary))
    return 0


def _cmd_export_text_encoder(args) -> int:
    from embodied.vla.text import export_text_encoder

    print(json.dumps(export_text_encoder(args.out)))
    return 0


def _cmd_tasks(_args) -> int:
    import embodied.sim_backends  # noqa: F401  (registers the backends: where each simulates)
    import embodied.tasks  # noqa: F401
    from embodied.config import load_config
    from embodied.core.registry import SIM_BACKENDS, TASKS

    for name in TASKS.names():
        spec = TASKS.get(name)
        algo = load_config(name).algo  # what a default run trains (the task's preset may choose another)
        backends = ", ".join(f"{b} ({'/'.join(SIM_BACKENDS.get(b).devices)})" for b in spec.backends)
        print(f"{name:<18} {spec.description}  [backends: {backends}; algo: {algo}]")
    for prefix, (_, description) in sorted(TASKS.families.items()):
        print(f"{prefix + ':<name>':<18} {description}  [task family]")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        parser = _parser()
        args, extra = parser.parse_known_args(argv)
        # overrides may stand anywhere among the options (argparse takes one positional run only)
        stray = [a for a in extra if a.startswith("-") or "=" not in a or args.command != "train"]
        if stray:
            parser.error(f"unrecognized arguments: {' '.join(stray)}")
        if extra:
            args.overrides = [*args.overrides, *extra]
        commands = {"train": _cmd_train, "eval": _cmd_eval, "tasks": _cmd_tasks, "export": _cmd_export,
                    "deploy": _cmd_deploy, "wm-report": _cmd_wm_report, "wm-fit": _cmd_wm_fit,
                    "collect-demos": _cmd_collect_demos, "export-text-encoder": _cmd_export_text_encoder}
        return commands[args.command](args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:  # the reader went away (``embodied tasks | head``): nothing more to say, no traceback
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's final flush goes nowhere
        return 1
    except Exception as e:  # a robot link or driver fault outside the control loop (connect, arm, disarm)
        from embodied.hardware.robot import RobotError

        if not isinstance(e, RobotError):
            raise
        print(f"fault: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
