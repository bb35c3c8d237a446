"""``embodied wm-fit``: an RSSM of an image task fitted on recorded episodes (issue 11).

The episodes are a Minari dataset of the task (``--data``: ``collect-demos``, or any recorded one with the task's
observation groups) or ``--episodes`` episodes of the real task with uniform random actions. The RSSM sees the newest
frame (``frame_channels`` channels) of the task's one image group and the other groups as a vector
(``model_observation``). It trains in chunks of ``chunk`` updates; after each, its weights, optimizer and random
state go to ``rssm_state.pt`` and ``world_model.pt`` is written (episodes start from the latent states the posterior
reaches after 5 real frames, every 10 steps of the training episodes), so a stopped fit resumes where it was and
``wm:<task> env.model=DIR`` steps the newest model. ``embodied wm-report --run DIR`` reports it (PSNR against
horizon, real beside imagined frames)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from embodied.core.errors import UserError

STATE_FILE, RESULT_FILE = "rssm_state.pt", "wm_fit.json"


def _episodes_from_transitions(tr: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``read_transitions``'s flat rows as ``record_real``'s padded episodes (``state [E, T+1, S]``, ``action``,
    ``reward``, ``terminated``, ``valid [E, T]``); an episode ends where the next one's first row begins."""
    starts = tr["initial"].nonzero().squeeze(1).tolist() + [tr["reward"].shape[0]]
    spans = [(a, b) for a, b in zip(starts[:-1], starts[1:]) if b > a]
    e, t = len(spans), max(b - a for a, b in spans)
    s, a_dim = tr["state"].shape[1], tr["action"].shape[1]
    out = {"state": torch.zeros(e, t + 1, s), "action": torch.zeros(e, t, a_dim), "reward": torch.zeros(e, t),
           "terminated": torch.zeros(e, t, dtype=torch.bool), "valid": torch.zeros(e, t, dtype=torch.bool)}
    for i, (a, b) in enumerate(spans):
        n = b - a
        out["state"][i, :n] = tr["state"][a:b]
        out["state"][i, n] = tr["next_state"][b - 1]
        out["action"][i, :n], out["reward"][i, :n] = tr["action"][a:b], tr["reward"][a:b]
        out["terminated"][i, :n], out["valid"][i, :n] = tr["terminated"][a:b], True
    return out


class RSSMFit:
    """The RSSM of ``task`` (task settings ``settings``) and its training data; ``fit(updates)`` trains it to
    ``updates`` updates in all (resuming from ``out``), ``save()`` writes ``world_model.pt``."""

    def __init__(self, task: str, out: Path, settings: dict | None = None, data: str | None = None,
                 episodes: int = 24, preset: str = "size1m", depth: int = 8, batch: int = 16, length: int = 32,
                 frame_channels: int = 3, seed: int = 0, chunk: int = 50):
        import embodied.tasks  # noqa: F401
        from embodied.config import make_task_config
        from embodied.core.registry import TASKS
        from embodied.sim_backends.world_model.rssm import PRESETS, RSSM, RSSMConfig
        from embodied.sim_backends.world_model.sequences import parameter_count

        if preset not in PRESETS:
            raise UserError(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}")
        if min(episodes, depth, batch, length, frame_channels, chunk) < 1 or length < 2:
            raise UserError("--episodes, --depth, --batch, --frame-channels must be >= 1 and --length >= 2")
        self.task, self.out, self.settings, self.chunk = task, Path(out), dict(settings or {}), chunk
        spec = TASKS.get(task)
        self.task_cfg = make_task_config(task, **self.settings)
        probe = spec.make(self.task_cfg, num_envs=1, device="cpu", seed=0)
        self.groups = [(k, s.shape[0]) for k, s in probe.single_observation_space.spaces.items()]
        layout, act_space = probe.layout(), probe.single_action_space
        probe.close()
        images = [(k, img) for k, _ in self.groups for img in layout.images(k)]
        if len(images) != 1 or images[0][1][0] != slice(0, dict(self.groups)[images[0][0]]):
            raise UserError(f"wm-fit models a task whose observation holds one image group; {task} has "
                            f"{len(images)} images" + ("" if len(images) != 1 else " beside other entries"))
        self.image_group, (_, shape) = images[0][0], images[0][1]
        self.image_shape = tuple(int(v) for v in shape)
        if self.image_shape[0] % frame_channels:
            raise UserError(f"{task}'s image has {self.image_shape[0]} channels, not a stack of {frame_channels}-"
                            "channel frames (--frame-channels)")
        self.frame_channels = frame_channels
        self.low = torch.as_tensor(act_space.low, dtype=torch.float32)
        self.high = torch.as_tensor(act_space.high, dtype=torch.float32)
        vector = sum(d for k, d in self.groups if k != self.image_group)
        self.cfg = RSSMConfig(**PRESETS[preset], depth=depth, batch_size=batch, length=length)
        torch.manual_seed(seed)
        try:
            self.model = RSSM(int(self.low.numel()), self.cfg, image=(frame_channels, *self.image_shape[1:]),
                              vector=vector)
        except ValueError as e:  # the RSSM's own checks of the image size are about the user's task settings
            raise UserError(f"wm-fit {task}: {e}") from None
        self.opt = torch.optim.Adam(self.model.parameters(), lr=self.cfg.lr)
        self.generator = torch.Generator().manual_seed(seed)
        self.result = {"task": task, "settings": self.settings, "data": data or f"{episodes} random-action episodes",
                       "preset": preset, "config": asdict(self.cfg), "frame_channels": frame_channels, "seed": seed,
                       "parameters": parameter_count(self.model), "updates": 0, "train_s": 0.0}
        state = self.out / STATE_FILE
        if state.exists():
            self._resume(state)
        self.seqs, self.task_obs = self.record(data, episodes, seed)
        if int(self.seqs["length"].max()) < length:
            raise UserError(f"no recorded episode holds --length {length} observations (longest: "
                            f"{int(self.seqs['length'].max())})")

    def _resume(self, path: Path) -> None:
        saved = torch.load(path, weights_only=False)
        differ = [k for k in ("task", "settings", "preset", "config", "frame_channels")
                  if saved["result"].get(k) != self.result[k]]
        if differ:
            raise UserError(f"{self.out} holds a fit with other values of {', '.join(differ)}: give the same ones to "
                            "resume it, or another --out")
        self.model.load_state_dict(saved["model"])
        self.opt.load_state_dict(saved["opt"])
        self.generator.set_state(saved["generator"])
        self.result = saved["result"]

    def record(self, data: str | None, episodes: int, seed: int) -> tuple[dict, torch.Tensor]:
        """Sequences of what the RSSM sees, and the task's flat observations ``[E, T+1, D]``."""
        from embodied.core.registry import TASKS
        from embodied.sim_backends.world_model.sequences import model_observation, to_sequences
        from embodied.tasks.world_model.report import record_real

        if data:
            from embodied.datasets import read_transitions

            recorded = _episodes_from_transitions(read_transitions(data, [k for k, _ in self.groups]))
            if recorded["state"].shape[2] != sum(d for _, d in self.groups):
                raise UserError(f"the dataset {data} has {recorded['state'].shape[2]} observation entries a step; "
                                f"{self.task} has {sum(d for _, d in self.groups)}")
        else:
            env = TASKS.get(self.task).make(self.task_cfg, num_envs=episodes, device="cpu", seed=seed)
            g = torch.Generator().manual_seed(seed)
            low, high = self.low, self.high
            recorded = record_real(env, lambda o: low + torch.rand(o.shape[0], low.numel(), generator=g) * (high - low),
                                   seed, 0.0, g)
            env.close()
        task_obs = recorded["state"]
        recorded["state"] = model_observation(task_obs, self.groups, self.image_group, self.image_shape,
                                              self.frame_channels)
        return to_sequences(recorded), task_obs

    def fit(self, updates: int, progress=None) -> dict:
        """Train to ``updates`` updates in all, saving after every chunk; returns the result so far."""
        from embodied.sim_backends.world_model.sequences import fit_rssm

        self.out.mkdir(parents=True, exist_ok=True)
        self.model.train()
        while self.result["updates"] < updates:
            n = min(self.chunk, updates - self.result["updates"])
            t0 = time.perf_counter()
            metrics = fit_rssm(self.model, self.opt, self.seqs, n, self.generator)
            self.result["train_s"] = round(self.result["train_s"] + time.perf_counter() - t0, 2)
            self.result["updates"] += n
            self.result["last_metrics"] = {k: float(v) for k, v in metrics.items()}
            self.save()
            if progress is not None:
                progress(self.result)
        self.model.eval()
        return self.result

    def save(self) -> Path:
        """``world_model.pt`` (the model and its latent starts), ``rssm_state.pt`` and ``wm_fit.json``."""
        from embodied.sim_backends.world_model import MODEL_FILE, save_world_model
        from embodied.sim_backends.world_model.sequences import rssm_starts

        was = self.model.training
        self.model.eval()
        starts, start_obs = rssm_starts(self.model, self.seqs, self.task_obs, context=5, stride=10,
                                        generator=torch.Generator().manual_seed(self.result["seed"]))
        self.model.train(was)
        path = save_world_model(self.out / MODEL_FILE, self.model, self.cfg, self.task, _plain(self.settings), starts,
                                starts[:0], start_obs=start_obs, image_group=self.image_group,
                                frame_channels=self.frame_channels)
        tmp = self.out / (STATE_FILE + ".tmp")
        torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict(),
                    "generator": self.generator.get_state(), "result": self.result}, tmp)
        tmp.replace(self.out / STATE_FILE)
        (self.out / RESULT_FILE).write_text(json.dumps(self.result, indent=1))
        return path


def _plain(settings: dict) -> dict:
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in settings.items()}
