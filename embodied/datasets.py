"""Recorded real transitions: in Minari's format (Farama's offline-RL standard; the world-model, demonstration
and behaviour-cloning tools share it). A dataset is a directory Minari reads (``MinariDataset(path)``): episodes
of observations (``T + 1`` rows, the final one included), actions, rewards, terminations and truncations.
Observations are the task's observation groups (a ``Dict`` space); a dataset from elsewhere with a flat ``Box``
observation reads as the ``"policy"`` group. A group with camera entries (quantized image terms, ``core/pixels.py``)
is stored as two keys, ``GROUP`` (its other entries, float32) and ``GROUP_pixels`` (uint8), recorded in the
metadata ``pixels`` (JSON: the packer of each such group); readers get the group's floats back exactly."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from embodied.core.base import TASK_ID
from embodied.core.errors import UserError
from embodied.core.pixels import PixelPacker

ENV_STATE = "env_state"  # the infos key of the recorded env states (``VecEnv.env_states``' rows)


def write_minari(path: str | Path, episodes: list[dict], observation_space: gym.spaces.Dict,
                 action_space: gym.spaces.Space, dataset_id: str = "embodied/recorded-v0", layout=None,
                 **metadata) -> Path:
    """Write ``episodes`` (dicts of numpy arrays: ``observations`` {group: [T+1, d]}, ``actions [T, a]``,
    ``rewards``, ``terminations``, ``truncations`` ``[T]``) as a Minari dataset at ``path`` (a new directory).
    ``layout``: the task's; its quantized image terms are stored as uint8."""
    from minari.data_collector import EpisodeBuffer
    from minari.dataset.minari_storage import MinariStorage

    path = Path(path).resolve()  # Minari joins a relative data path onto itself when it sizes the dataset
    if path.exists() and any(path.iterdir()):
        raise UserError(f"{path} exists and is not empty; choose a new directory for the dataset")
    packers = {k: p for k, s in observation_space.spaces.items()
               if (p := PixelPacker.of(layout, k, s.shape[0])).packs}
    if packers:
        spaces = dict(observation_space.spaces)
        for k, p in packers.items():
            pixels = sum(s.stop - s.start for s in p.pixels)
            spaces[k] = gym.spaces.Box(-np.inf, np.inf, (p.dim - pixels,), np.float32)
            spaces[f"{k}_pixels"] = gym.spaces.Box(0, 255, (pixels,), np.uint8)
        observation_space = gym.spaces.Dict(spaces)
        metadata["pixels"] = json.dumps({k: p.to_json() for k, p in packers.items()})
    path.mkdir(parents=True, exist_ok=True)
    storage = MinariStorage.new(path / "data", observation_space=observation_space, action_space=action_space,
                                data_format="hdf5")
    storage.update_metadata({"dataset_id": dataset_id, "minari_version": _minari_version(), **metadata})
    buffers = [EpisodeBuffer(id=i, observations=_packed(ep["observations"], packers),
                             actions=np.asarray(ep["actions"]), rewards=list(ep["rewards"]),
                             terminations=list(ep["terminations"]), truncations=list(ep["truncations"]),
                             infos=ep.get("infos"))
               for i, ep in enumerate(episodes)]
    storage.update_episodes(buffers)
    return path


def _packed(observations: dict, packers: dict) -> dict[str, np.ndarray]:
    out = {}
    for k, v in observations.items():
        if k in packers:
            out.update({name: part.numpy() for name, part in packers[k].pack(torch.as_tensor(v), k).items()})
        else:
            out[k] = np.asarray(v)
    return out


def _unpacked(observations: dict, packers: dict) -> dict:
    pixels = {f"{g}_pixels" for g in packers}
    out = {k: v for k, v in observations.items() if k not in pixels}
    for k, p in packers.items():
        out[k] = p.unpack({n: torch.as_tensor(observations[n]) for n in (k, f"{k}_pixels")}, k).numpy()
    return out


def _minari_version() -> str:
    import minari

    return f"{minari.__version__}"


def _open(path: Path):
    """The Minari dataset at ``path`` (its folder, or the ``data`` folder inside it); a missing one is a ``UserError``,
    an unreadable one raises (callers turn that into their ``UserError``)."""
    from minari import MinariDataset

    data_dir = path / "data" if (path / "data").is_dir() else path
    if not data_dir.is_dir():
        raise UserError(f"no dataset at {path}")
    return MinariDataset(data_dir)


def _reading(path: Path, read):
    """``read(dataset)`` on the Minari dataset at ``path``; a missing one is a ``UserError`` (``_open``), and so is an
    unreadable one (the user's input), in one line."""
    try:
        return read(_open(path))
    except UserError:  # no dataset there
        raise
    except Exception as e:  # noqa: BLE001 - a corrupt dataset is the user's input
        raise _unreadable(path, e) from None


def _unreadable(path: Path, e: Exception) -> UserError:
    why = str(e).splitlines()[0] if str(e) else repr(e)
    return UserError(f"cannot read the Minari dataset {path}: {why}")


def dataset_groups(path: str | Path) -> list[str]:
    """The observation groups of the Minari dataset at ``path`` (``["policy"]`` for one stored as a flat array)."""
    path = Path(path)
    space = _reading(path, lambda dataset: dataset.observation_space)
    if not isinstance(space, gym.spaces.Dict):
        return ["policy"]
    return [k.removesuffix("_pixels") for k in space.spaces if not k.endswith("_pixels") or k[:-7] not in space.spaces]


def read_transitions(path: str | Path, groups: list[str] | None = None) -> dict[str, torch.Tensor]:
    """Every transition of the Minari dataset at ``path`` as flat tensors: ``state [T, S]`` (the observation
    groups concatenated, in ``groups`` order), ``action``, ``reward``, ``next_state``, ``terminated``, and
    ``initial`` (the first step of an episode). A missing or unreadable dataset is a ``UserError``."""
    path = Path(path)
    episodes, packers = _reading(path, lambda dataset: (
        list(dataset.iterate_episodes()),
        {k: PixelPacker.from_json(v) for k, v in json.loads(dataset.storage.metadata.get("pixels", "{}")).items()}))
    if not episodes:
        raise UserError(f"the dataset {path} has no episodes")
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("state", "action", "reward", "next_state", "terminated",
                                                          "initial")}
    for ep in episodes:
        obs = ep.observations if isinstance(ep.observations, dict) else {"policy": ep.observations}
        obs = _unpacked(obs, packers) if packers else obs
        keys = groups or list(obs)
        missing = [k for k in keys if k not in obs]
        if missing:
            raise UserError(f"the dataset {path} has observation groups {sorted(obs)}, not {missing}")
        flat = np.concatenate([np.asarray(obs[k], np.float32).reshape(len(obs[k]), -1) for k in keys], 1)
        t = len(ep.rewards)
        cols["state"].append(flat[:t])
        cols["next_state"].append(flat[1:t + 1])
        cols["action"].append(np.asarray(ep.actions, np.float32).reshape(t, -1))
        cols["reward"].append(np.asarray(ep.rewards, np.float32))
        cols["terminated"].append(np.asarray(ep.terminations, bool))
        cols["initial"].append(np.arange(t) == 0)
    return {k: torch.as_tensor(np.concatenate(v)) for k, v in cols.items()}


def read_env_states(path: str | Path) -> dict[str, torch.Tensor]:
    """The recorded env states of the Minari dataset at ``path`` (``infos["env_state"]``, written by ``collect-demos``
    for tasks that can restore states), every step but each episode's last: ``state [M, S]`` float64, each row's
    ``step`` and its episode's ``length`` (steps). A dataset without them is a ``UserError``."""
    path = Path(path)
    episodes = _reading(path, lambda dataset: list(dataset.iterate_episodes()))
    if not episodes or any(ENV_STATE not in (ep.infos or {}) for ep in episodes):
        raise UserError(f"the dataset {path} records no env states (collect-demos records them for tasks that can "
                        "restore states; collect it again)")
    rows, step, length = [], [], []
    for ep in episodes:
        t = len(ep.rewards)
        rows.append(np.asarray(ep.infos[ENV_STATE], np.float64)[:t])
        step.append(np.arange(t))
        length.append(np.full(t, t))
    return {"state": torch.as_tensor(np.concatenate(rows)), "step": torch.as_tensor(np.concatenate(step)),
            "length": torch.as_tensor(np.concatenate(length))}


def read_replay(run_dir: str | Path, dims: dict[str, int], act_dim: int) -> dict[str, torch.Tensor]:
    """The replay buffer of an off-policy run (its latest checkpoint) as the flat transitions ``read_transitions``
    returns, for a task with observation groups ``dims`` (``{"policy": d[, "critic": d]}``, in order) and ``act_dim``
    actions. Replay rows are ``obs | critic obs | action | reward | discount | next obs | next critic obs`` (the
    critic's columns repeat the policy's where a task has no critic group); ``discount == 0`` marks a termination.
    Episode starts are not recorded (``initial`` is all False); rows must be one-step (``n_step=1``)."""
    from embodied.checkpoint import load_checkpoint
    from embodied.config import config_from_dict

    ckpt = load_checkpoint(Path(run_dir))
    buffer = ckpt.get("algo", {}).get("buffer")
    cfg = config_from_dict(ckpt["config"])
    if buffer is None:
        raise UserError(f"the run {run_dir} ({cfg.algo}) keeps no replay buffer; record a Minari dataset instead")
    if getattr(cfg.algo_config, "n_step", 1) != 1:
        raise UserError(f"the run {run_dir} stored {cfg.algo_config.n_step}-step rows; a model needs one-step rows")
    if not set(dims) <= {"policy", "critic"}:
        raise UserError(f"a replay holds the policy and critic groups, not {sorted(dims)}")
    obs_dim, cdim = dims["policy"], dims.get("critic", dims["policy"])
    rows = buffer["storage"][: int(buffer["size"])]
    if rows.shape[1] != 2 * obs_dim + 2 * cdim + act_dim + 2:
        raise UserError(f"the replay of {run_dir} ({cfg.task}) has rows of {rows.shape[1]} entries, not this task's")
    cols = rows.split([obs_dim, cdim, act_dim, 1, 1, obs_dim, cdim], 1)
    parts = {"policy": (cols[0], cols[5]), "critic": (cols[1], cols[6])}
    reward, discount = cols[3].squeeze(1), cols[4].squeeze(1)
    return {"state": torch.cat([parts[g][0] for g in dims], 1), "next_state": torch.cat([parts[g][1] for g in dims], 1),
            "action": cols[2], "reward": reward, "terminated": discount == 0,
            "initial": torch.zeros_like(reward, dtype=torch.bool)}


@torch.no_grad()
def record_episodes(env, act, num_episodes: int, seed: int) -> list[dict]:
    """Roll ``env`` (a ``VecEnv``) with ``act(obs) -> action`` until ``num_episodes`` episodes ended; returns
    them in Minari's episode layout (numpy), the observations of each group ``[T+1, d]``, with the episode's
    ``final_info`` entries (``success``...) as floats under ``outcome``."""
    obs, _ = env.reset(seed=seed)
    n = env.num_envs
    restorable = env.env_states() is not None

    def fresh(i: int) -> dict:  # env i's episode as it starts, from its first observation
        return {"obs": {k: [v[i].cpu().numpy()] for k, v in obs.items()}, "actions": [], "rewards": [],
                "terminations": [], "truncations": [], "states": []}

    current = [fresh(i) for i in range(n)]
    done_eps: list[dict] = []
    while len(done_eps) < num_episodes:
        states = env.env_states().numpy() if restorable else None
        executed = act(obs)
        obs, reward, terminated, truncated, info = env.step(executed)
        label = getattr(act, "label", None)  # an expert's action without its perturbations (DART), where it has one
        action = executed if label is None else label
        final = info["final_obs"]
        for i in range(n):
            ep = current[i]
            ep["actions"].append(action[i].cpu().numpy())
            ep["rewards"].append(float(reward[i]))
            ep["terminations"].append(bool(terminated[i]))
            ep["truncations"].append(bool(truncated[i]))
            if restorable:
                ep["states"].append(states[i])
            ended = bool(terminated[i] or truncated[i])
            for k, v in (final if ended else obs).items():
                ep["obs"][k].append(v[i].cpu().numpy())
            if ended:
                done_eps.append({"observations": {k: np.stack(v) for k, v in ep["obs"].items()},
                                 "actions": np.stack(ep["actions"]), "rewards": np.array(ep["rewards"]),
                                 "terminations": np.array(ep["terminations"]),
                                 "truncations": np.array(ep["truncations"]),
                                 "outcome": {k: float(v[i]) for k, v in info.get("final_info", {}).items()}})
                if restorable:  # the state after the last step is gone (the env reset in the same step): NaN
                    rows = np.stack(ep["states"])
                    done_eps[-1]["infos"] = {ENV_STATE: np.concatenate([rows, np.full_like(rows[:1], np.nan)])}
                current[i] = fresh(i)
    return done_eps[:num_episodes]


def collect_demos(task: str, episodes: int, out: str | Path, num_envs: int = 16, seed: int = 0,
                  action_noise: float | None = None, target_noise: float = 0.0, keep_failures: bool = False,
                  env_settings: dict | None = None, miss: float | None = None, detour: float | None = None,
                  lift: str | None = None) -> dict:
    """Roll ``task``'s scripted expert until ``episodes`` episodes (successful ones unless ``keep_failures``) are
    recorded, and write them as a Minari dataset at ``out``. Returns a summary with the expert's success rate over
    every episode it played."""
    import embodied
    from embodied.core.registry import TASKS

    if episodes < 1 or num_envs < 1:
        raise UserError(f"episodes and num_envs must be >= 1, got {episodes}, {num_envs}")
    out = Path(out)
    _check_new_dataset_dir(out)
    spec = TASKS.get(task)
    if spec.expert is None:
        raise UserError(f"task {task!r} has no scripted expert (tasks with one: "
                        f"{', '.join(n for n in TASKS.names() if TASKS.get(n).expert is not None)})")
    try:
        env = embodied.make_env(task, num_envs=num_envs, seed=seed, **(env_settings or {}))
    except TypeError as e:  # a setting the task's config does not have
        raise UserError(f"{task}: {e}") from None
    knobs = {k: v for k, v in (("miss", miss), ("detour", detour)) if v is not None}
    for name, value in knobs.items():
        if not 0.0 <= value <= 1.0:
            raise UserError(f"{name} is a fraction of the episodes, in [0, 1]; got {value}")
    if lift is not None:
        knobs["lift"] = lift
    try:
        act = spec.expert(env, action_noise=action_noise, target_noise=target_noise, seed=seed, **knobs)
    except TypeError:
        if not knobs:
            raise
        raise UserError(f"the {task} expert takes no {' or '.join(knobs)} setting (the pick experts do)") from None
    names = list(getattr(env, "task_names", []))
    kept, played, succeeded, per_task = _gather(env, act, task, spec.success_metric, names, episodes, num_envs, seed,
                                                keep_failures)
    layout = env.layout()
    env.close()
    write_minari(out, kept, env.single_observation_space, env.single_action_space, layout=layout,
                 dataset_id=f"embodied/{task}-expert-v0", task=task, expert_success_rate=succeeded / played,
                 expert_episodes=played)
    return {"dataset": str(out), "task": task, "episodes": len(kept), "expert_episodes": played,
            "expert_success_rate": round(succeeded / played, 4),
            **({"per_task": {n: {"episodes": t[2], "expert_success_rate": round(t[1] / max(t[0], 1), 4)}
                             for n, t in per_task.items()}} if names else {}),
            "steps": int(sum(len(ep["actions"]) for ep in kept))}


def _check_new_dataset_dir(out: Path) -> None:
    """A new or empty directory, under one this process may write in; checked before the rollouts, not after them.
    The folders made to probe are removed again (they are made when the dataset is written), so a failed collection
    leaves none."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} exists and is not an empty directory; choose a new directory for the dataset")
    made = [p for p in (out.absolute(), *out.absolute().parents) if not p.exists()]  # deepest first
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the dataset directory {out}: {e.strerror or e}") from None
    for folder in made:
        folder.rmdir()


def _gather(env, act, task: str, success_metric: str | None, names: list[str], episodes: int, num_envs: int,
            seed: int, keep_failures: bool):
    """The expert's episodes, in rounds of fresh starts, until ``episodes`` are kept: ``(kept, played, succeeded,
    per_task)``. A suite of tasks (``names``; its envs report each episode's ``task_id``) spreads them round-robin
    over its tasks, task k keeping ``episodes // T`` (+ 1 for the first ``episodes % T`` tasks); ``per_task`` counts
    each one's played, succeeded and kept episodes."""
    kept, played, succeeded = [], 0, 0
    quota = [episodes // len(names) + (k < episodes % len(names)) for k in range(len(names))] if names else []
    per_task = {n: [0, 0, 0] for n in names}  # played, succeeded, kept
    for round_ in range(20):  # an expert that succeeds in 1 of 20 attempts or less gives up: say so
        want = episodes - len(kept)
        batch = record_episodes(env, act, max(2 * want if names else want, num_envs), seed=seed + 1000 * round_)
        for ep in batch:
            ok = ep["outcome"].get(success_metric or "", 1.0) > 0.5
            played, succeeded = played + 1, succeeded + ok
            room = len(kept) < episodes
            if names:
                k = int(ep["outcome"][TASK_ID])
                tally = per_task[names[k]]
                tally[0], tally[1] = tally[0] + 1, tally[1] + ok
                room = tally[2] < quota[k]
                tally[2] += bool((ok or keep_failures) and room)
            if (ok or keep_failures) and room:
                kept.append(ep)
        if len(kept) >= episodes:
            return kept, played, succeeded, per_task
    raise UserError(f"the {task} expert succeeded in {succeeded} of {played} episodes; {episodes} were asked for")
