"""Episodes as training sequences for the RSSM, its fit, and its open-loop report (PSNR against horizon).

Episodes come as ``record_real`` returns them (``embodied/tasks/world_model/report.py``): ``state [E, T+1, S]``,
``action [E, T, A]``, ``reward``, ``terminated``, ``valid [E, T]``. ``to_sequences`` puts them in DreamerV3's
alignment: ``obs_t``, the action that led to it, the reward received with it, ``cont_t = 1 - terminal_t`` and
``first_t``."""

from __future__ import annotations

import torch

from embodied.sim_backends.world_model.rssm import RSSM


def to_sequences(data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    state, action, valid = data["state"], data["action"], data["valid"]
    e, t = valid.shape
    zero = torch.zeros(e, 1, action.shape[2])
    return {"obs": state, "prev_action": torch.cat([zero, action], 1),
            "reward": torch.cat([torch.zeros(e, 1), data["reward"]], 1),
            "cont": torch.cat([torch.ones(e, 1), 1.0 - data["terminated"].float()], 1),
            "first": torch.cat([torch.ones(e, 1, dtype=torch.bool), torch.zeros(e, t, dtype=torch.bool)], 1),
            "length": valid.sum(1) + 1}  # observations per episode, the final one included


def sample_batch(seqs: dict, batch: int, length: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """``batch`` windows of ``length`` observations inside episodes (uniform over the windows that fit); the first
    observation of a window starts the model from its initial state."""
    ok = (seqs["length"] >= length).nonzero().squeeze(1)
    if ok.numel() == 0:
        raise ValueError(f"no episode holds {length} observations")
    ep = ok[torch.randint(ok.numel(), (batch,), generator=generator)]
    start = (torch.rand(batch, generator=generator) * (seqs["length"][ep] - length + 1)).long()
    idx = start[:, None] + torch.arange(length)
    out = {k: seqs[k][ep[:, None], idx] for k in ("obs", "prev_action", "reward", "cont", "first")}
    out["first"] = out["first"].clone()
    out["first"][:, 0] = True
    return out


def fit_rssm(model: RSSM, opt: torch.optim.Optimizer, seqs: dict, updates: int, generator: torch.Generator,
             clip: float = 100.0) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for _ in range(updates):
        b = sample_batch(seqs, model.cfg.batch_size, model.cfg.length, generator)
        loss, metrics = model.loss(b["obs"], b["prev_action"], b["reward"], b["cont"], b["first"], generator)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        metrics["rssm/loss"] = float(loss.detach())
    return metrics


@torch.no_grad()
def open_loop_psnr(model: RSSM, seqs: dict, context: int = 5, horizon: int = 50) -> dict:
    """Observe ``context`` frames with the posterior, then roll the prior (its mode) with the recorded actions for
    ``horizon`` steps and decode; per step h the image PSNR ``10 log10(1 / MSE)`` (pixels in [0, 1]) and the
    reward MAE, averaged over the episodes long enough (DreamerV3's open-loop video report)."""
    ok = (seqs["length"] >= context + horizon).nonzero().squeeze(1)
    if ok.numel() == 0:
        raise ValueError(f"no episode holds {context + horizon} observations")
    obs, act = seqs["obs"][ok], seqs["prev_action"][ok]
    n = ok.numel()
    state = model.initial(n)
    first = torch.ones(n, dtype=torch.bool)
    for t in range(context):
        state, _, _ = model.obs_step(state, act[:, t], model.embed(obs[:, t]), first if t == 0 else ~first)
    psnr, rew, frames = [], [], []
    for h in range(horizon):
        t = context + h
        state, _ = model.img_step(state, act[:, t], sample=False)
        feat = model.feat(state)
        pred = model.decode(feat)
        if model.image:
            mse = ((pred[:, : model.image_dim] - obs[:, t, : model.image_dim]) ** 2).mean(1).clamp_min(1e-10)
            psnr.append(float((10 * torch.log10(1.0 / mse)).mean()))
            frames.append(pred[0, : model.image_dim].reshape(model.image))
        rew.append(float((model.reward(feat) - seqs["reward"][ok, t]).abs().mean()))
    return {"psnr": psnr, "reward_mae": rew, "episodes": n, "context": context,
            "frames": torch.stack(frames) if frames else None,
            "real_frames": obs[0, context:context + horizon, : model.image_dim].reshape(-1, *model.image)
            if model.image else None, "mean_psnr": {str(h): sum(psnr[:h]) / h for h in (1, 5, 15, 50)
                                                    if h <= len(psnr)} if psnr else {}}


def model_observation(task_obs: torch.Tensor, groups: list[tuple[str, int]], image_group: str,
                      image_shape: tuple[int, int, int], frame_channels: int) -> torch.Tensor:
    """What an RSSM sees of a task's flat observation ``[..., D]``: the newest frame (the last ``frame_channels``
    channels) of the image group, then the other groups in order."""
    parts = dict(zip([k for k, _ in groups], task_obs.split([d for _, d in groups], -1)))
    image = parts[image_group].reshape(*task_obs.shape[:-1], *image_shape)[..., -frame_channels:, :, :]
    rest = [parts[k] for k, _ in groups if k != image_group]
    return torch.cat([image.flatten(-3), *rest], -1)


@torch.no_grad()
def rssm_starts(model: RSSM, seqs: dict, task_obs: torch.Tensor, context: int = 5, stride: int = 10,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Latent states ``[M, feat]`` the posterior reaches after at least ``context`` real observations (then every
    ``stride`` steps), and the task's real observation ``[M, D]`` at each: where imagined episodes start."""
    e, t1 = seqs["obs"].shape[:2]
    state = model.initial(e)
    latents, observed = [], []
    for t in range(t1):
        state, _, _ = model.obs_step(state, seqs["prev_action"][:, t], model.embed(seqs["obs"][:, t]),
                                     seqs["first"][:, t], generator)
        if t >= context - 1 and (t - context + 1) % stride == 0:
            ok = t < seqs["length"]
            latents.append(model.feat(state)[ok])
            observed.append(task_obs[ok, t])
    return torch.cat(latents), torch.cat(observed)


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["fit_rssm", "model_observation", "open_loop_psnr", "parameter_count", "rssm_starts", "sample_batch",
           "to_sequences"]
