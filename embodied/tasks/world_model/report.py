"""``embodied wm-report --run R``: how far a fitted model's open-loop predictions drift (reference
subsystems.md 2.5). Held-out real episodes are recorded fresh (a seed no training run used) with the run's policy
plus exploration noise; from a start every ``stride`` steps the model is rolled with the recorded actions and
compared with what really happened, for every horizon up to ``horizon``.

Per horizon h: ``mse`` (raw units, mean over state dims), ``nmse`` (each dim divided by its variance in the
data: 1.0 is as bad as predicting the mean state), ``symlog_mse`` (DreamerV3's vector loss) and ``reward_mae`` at
step h, and each ``*_mean`` over steps 1..h; and the one-step termination accuracy."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from embodied.core.errors import UserError

HORIZONS = (1, 5, 15, 50)


@torch.no_grad()
def record_real(env, act, seed: int, noise: float, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """The first episode of every env of ``env``: ``state [E, T+1, S]`` (groups concatenated), ``action [E, T, A]``,
    ``reward``, ``terminated`` and ``valid [E, T]`` (the step belongs to the episode)."""
    obs, _ = env.reset(seed=seed)
    keys = list(env.single_observation_space.spaces)
    flat = lambda o: torch.cat([o[k] for k in keys], 1)  # noqa: E731
    low = torch.as_tensor(env.single_action_space.low, device=env.device)
    high = torch.as_tensor(env.single_action_space.high, device=env.device)
    live = torch.ones(env.num_envs, dtype=torch.bool, device=env.device)
    states, actions, rewards, terms, valid = [flat(obs)], [], [], [], []
    for _ in range(env.max_episode_steps):
        a = act(obs["policy"])
        a = a + noise * torch.randn(a.shape, generator=generator, device=a.device) * (high - low) / 2
        a = torch.minimum(torch.maximum(a, low), high)
        obs, reward, terminated, truncated, info = env.step(a)
        states.append(flat(info["final_obs"]))
        actions.append(a)
        rewards.append(reward)
        terms.append(terminated & live)
        valid.append(live.clone())
        live &= ~(terminated | truncated)
        if not live.any():
            break
    return {"state": torch.stack(states, 1), "action": torch.stack(actions, 1), "reward": torch.stack(rewards, 1),
            "terminated": torch.stack(terms, 1), "valid": torch.stack(valid, 1)}


@torch.no_grad()
def open_loop_error(network, data: dict[str, torch.Tensor], horizon: int = 50, stride: int = 10) -> dict:
    """Roll ``network`` (its elites' mean) open loop from every ``stride``-th real state with the recorded actions
    and compare with the recorded states and rewards; per horizon 1..``horizon``."""
    from embodied.sim_backends.world_model.tricks import symlog

    states, actions, valid = data["state"], data["action"], data["valid"]
    e, t = valid.shape
    starts = [(i, t0) for i in range(e) for t0 in range(0, t, stride) if bool(valid[i, t0])]
    if not starts:
        raise UserError("no held-out steps to report on")
    ei = torch.tensor([s[0] for s in starts])
    ti = torch.tensor([s[1] for s in starts])
    var = states[:, :-1][valid].var(0, unbiased=False).clamp_min(1e-8)
    x = states[ei, ti]
    curves = {k: [] for k in ("mse", "nmse", "symlog_mse", "reward_mae", "pairs")}
    alive = torch.ones(len(starts), dtype=torch.bool)
    for h in range(1, horizon + 1):
        step = ti + h - 1
        inside = step < t
        alive &= inside
        step = step.clamp(max=t - 1)
        alive &= valid[ei, step]
        if not alive.any():
            break
        out = network.expected(x, actions[ei, step])
        x = out["next_state"]
        real = states[ei, step + 1]
        err = (x - real)[alive]
        curves["mse"].append(float((err ** 2).mean()))
        curves["nmse"].append(float((err ** 2 / var).mean()))
        curves["symlog_mse"].append(float(((symlog(x) - symlog(real))[alive] ** 2).mean()))
        curves["reward_mae"].append(float((out["reward"] - data["reward"][ei, step])[alive].abs().mean()))
        curves["pairs"].append(int(alive.sum()))
    one = network.expected(states[:, :-1][valid], actions[valid])
    term_acc = float(((one["p_terminal"] > 0.5) == data["terminated"][valid]).float().mean())
    # per horizon H: the error at step H, and (``*_mean``) its mean over steps 1..H (the reference's summary, and
    # what open_loop_psnr's mean_psnr reports)
    at = {str(h): {**{k: curves[k][h - 1] for k in curves},
                   **{f"{k}_mean": sum(curves[k][:h]) / h for k in ("mse", "nmse", "symlog_mse", "reward_mae")}}
          for h in HORIZONS if h <= len(curves["mse"])}
    return {"horizons": at, "curve": curves, "termination_accuracy_1step": term_acc,
            "held_out_steps": int(valid.sum()), "starts": len(starts)}


def wm_report(run_dir: Path, episodes: int = 20, seed: int | None = None, noise: float = 0.2,
              horizon: int = 50) -> dict:
    """Write ``wm_report.json`` and ``wm_report.png`` (an RSSM also ``wm_report.mp4``, real beside imagined frames)
    into the directory of a ``wm:<task>`` run, or of a fitted model alone (then uniform random actions)."""
    import embodied.tasks  # noqa: F401
    from embodied.checkpoint import checkpoint_paths, load_checkpoint, policy_from_checkpoint
    from embodied.config import config_from_dict, make_task_config
    from embodied.core.registry import TASKS
    from embodied.evaluate import make_eval_env
    from embodied.sim_backends.world_model import load_world_model

    run_dir = Path(run_dir)
    network, meta = load_world_model(run_dir)
    g = torch.Generator()
    if checkpoint_paths(run_dir):
        ckpt = load_checkpoint(run_dir)
        cfg = config_from_dict(ckpt["config"])
        act, step = policy_from_checkpoint(ckpt, run_dir).act, ckpt["step"]
        env = make_eval_env(cfg, num_envs=episodes, device="cpu")
        seed = 1_000_003 + cfg.seed if seed is None else seed  # no run draws its starts from this seed
    else:  # a model without a policy (a benchmark's): random actions on the real task
        seed = 1_000_003 if seed is None else seed
        env = TASKS.get(meta["task"]).make(make_task_config(meta["task"], **meta["task_config"]), num_envs=episodes,
                                           device="cpu", seed=seed)
        low, high = (torch.as_tensor(b) for b in (env.single_action_space.low, env.single_action_space.high))
        act, step, noise = (lambda o: low + torch.rand(o.shape[0], low.numel(), generator=g) * (high - low)), None, 0.0
    g.manual_seed(seed)
    data = record_real(env, act, seed, noise, g)
    result = {"task": meta["task"], "kind": meta["kind"], "run": str(run_dir), "step": step, "episodes": episodes,
              "seed": seed, "action_noise": noise}
    if meta["kind"] == "rssm":
        result.update(_rssm_report(network, meta, env, data, horizon, run_dir / "wm_report.mp4"))
    else:
        result.update(open_loop_error(network, data, horizon))
    (run_dir / "wm_report.json").write_text(json.dumps(result, indent=1))
    plot_report(result, run_dir / "wm_report.png")
    return result


def open_loop_video(report: dict, path: Path) -> Path:
    """Real (left) beside imagined (right) frames of the first held-out episode of an ``open_loop_psnr`` report,
    4x enlarged."""
    from embodied.render import write_video

    pair = torch.cat([report["real_frames"], report["frames"]], 3).permute(0, 2, 3, 1).clamp(0, 1)
    frames = (pair * 255).to(torch.uint8).repeat_interleave(4, 1).repeat_interleave(4, 2).numpy()
    return write_video(list(frames), path, fps=10)


def _rssm_report(network, meta: dict, env, data: dict, horizon: int, video: Path) -> dict:
    from embodied.sim_backends.world_model.sequences import model_observation, open_loop_psnr, to_sequences

    groups = [(k, s.shape[0]) for k, s in env.single_observation_space.spaces.items()]
    (_, shape), = env.layout().images(meta["image_group"])
    data["state"] = model_observation(data["state"], groups, meta["image_group"], tuple(shape),
                                      int(meta["frame_channels"]))
    seqs = to_sequences(data)
    context = 5
    horizon = min(horizon, int(seqs["length"].max()) - context)
    rep = open_loop_psnr(network, seqs, context=context, horizon=horizon)
    open_loop_video(rep, video)
    return {"context": context, "psnr": rep["psnr"], "mean_psnr": rep["mean_psnr"], "reward_mae": rep["reward_mae"],
            "video": str(video), "held_out_episodes": rep["episodes"]}


def plot_report(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rssm = result.get("kind") == "rssm"
    c = result if rssm else result["curve"]
    h = range(1, len(c["reward_mae"]) + 1)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    if rssm:
        axes[0].plot(h, c["psnr"])
        axes[0].set(xlabel="open-loop horizon [steps]", ylabel="PSNR [dB]", title=result["task"])
    else:
        axes[0].semilogy(h, c["nmse"])
        axes[0].set(xlabel="open-loop horizon [steps]", ylabel="state error / state variance", title=result["task"])
    axes[1].plot(h, c["reward_mae"])
    axes[1].set(xlabel="open-loop horizon [steps]", ylabel="reward MAE")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
