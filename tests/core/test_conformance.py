"""Conformance sweep: every registered task honours the VecEnv contract (STYLE.md rule 10).

Create with ``num_envs=4``, reset, step ``2 * max_episode_steps + 3`` random actions; spaces, shapes,
dtypes, device, bounds, no NaN, logs, truncation; seeding; checkpoint round trip; NaN recovery.
"""

from __future__ import annotations

import io

import pytest
import torch

import embodied
import embodied.tasks  # noqa: F401  (registers tasks)
from embodied.core.base import resolve_device
from embodied.core.registry import SIM_BACKENDS, TASKS
from embodied.sim_backends.base import choose_backend

NUM_ENVS = 4
SHORT = 10  # steps of the rollouts check_seeding expects to differ
TASK_NAMES = TASKS.names()
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _random_action(env, gen: torch.Generator) -> torch.Tensor:
    """Uniform in the (bounded) action space: ``[N, *act_shape]`` float32 on ``env.device``."""
    space = env.single_action_space
    low, high = torch.as_tensor(space.low), torch.as_tensor(space.high)
    assert torch.isfinite(low).all() and torch.isfinite(high).all(), "sweep samples bounded action spaces"
    u = torch.rand((env.num_envs, *space.shape), generator=gen)
    return (low + u * (high - low)).to(env.device)


def _check_obs(env, obs: dict, rows=None) -> None:
    """Keys, shape ``[N, *space.shape]``, float32, device, finite, and each row (of ``rows``) in its Box."""
    spaces = env.single_observation_space.spaces
    assert set(obs) == set(spaces)
    rows = range(env.num_envs) if rows is None else rows
    for key, space in spaces.items():
        value = obs[key]
        assert isinstance(value, torch.Tensor)
        assert tuple(value.shape) == (env.num_envs, *space.shape), key
        assert value.dtype == torch.float32, key
        assert value.device == env.device, key
        assert torch.isfinite(value).all(), key
        array = value.cpu().numpy()
        for i in rows:
            assert space.contains(array[i]), f"{key}[{i}] = {array[i]} outside {space}"


def _check_log(log: dict) -> None:
    assert "nan_resets" in log
    for key, value in log.items():
        if isinstance(value, torch.Tensor):
            assert value.dim() == 0, key
            assert torch.isfinite(value), key
        else:
            assert isinstance(value, float), key


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("task", TASK_NAMES)
def test_task_conformance(task, device):
    backend = SIM_BACKENDS.get(choose_backend(task))
    if device not in backend.devices:
        pytest.skip(f"{task}'s backend {backend.name} simulates on {', '.join(backend.devices)} only")
    check_conformance(task, device)


def check_conformance(task: str, device: str, **overrides) -> None:
    """The sweep of one task (``overrides``: task config fields, for a task that needs some, e.g. a model)."""
    env = embodied.make_env(task, num_envs=NUM_ENVS, device=device, seed=0, **overrides)
    assert env.num_envs == NUM_ENVS and env.device == resolve_device(device)
    assert "policy" in env.single_observation_space.spaces
    obs, info = env.reset(seed=0)
    assert isinstance(info, dict)
    _check_obs(env, obs)
    gen = torch.Generator().manual_seed(0)
    length = torch.zeros(NUM_ENVS, dtype=torch.long)
    finished = torch.zeros(NUM_ENVS, dtype=torch.long)
    for _ in range(2 * env.max_episode_steps + 3):
        obs, reward, terminated, truncated, info = env.step(_random_action(env, gen))
        length += 1
        _check_obs(env, obs)
        assert reward.shape == (NUM_ENVS,) and reward.dtype == torch.float32 and reward.device == env.device
        assert torch.isfinite(reward).all()
        for flag in (terminated, truncated):
            assert flag.shape == (NUM_ENVS,) and flag.dtype == torch.bool and flag.device == env.device
        # truncation exactly at max_episode_steps (no numerical faults in a normal rollout)
        assert torch.equal(truncated.cpu(), length >= env.max_episode_steps)
        _check_log(info["log"])
        done = (terminated | truncated).cpu()
        if done.any():
            _check_obs(env, info["final_obs"], rows=done.nonzero().flatten().tolist())
        finished += done
        length[done] = 0
    assert (finished >= 1).all(), f"episodes finished per env: {finished.tolist()}"
    assert env.num_nan_resets == 0
    env.close()


def _flatten(x) -> list[torch.Tensor]:
    if isinstance(x, dict):
        return [t for k in sorted(x) for t in _flatten(x[k])]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _flatten(v)]
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, str):  # info["instruction"] of a language task: compared by its bytes
        return [torch.tensor(list(x.encode()), dtype=torch.uint8)]
    return [torch.tensor(x)]


def _steps(env, actions: list[torch.Tensor]) -> list[torch.Tensor]:
    """Everything the env returns for these actions, as a flat list of tensors (copies)."""
    out = []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        out += [t.clone() for t in _flatten([obs, reward, terminated, truncated, info])]
    return out


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


def _actions(env, num_steps: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [_random_action(env, gen) for _ in range(num_steps)]


def _rollout(task: str, make_seed: int, reset_seed: int | None, num_steps: int, overrides: dict) -> list[torch.Tensor]:
    env = embodied.make_env(task, num_envs=NUM_ENVS, seed=make_seed, **TASKS.get(task).sweep_overrides, **overrides)
    obs, _ = env.reset(seed=reset_seed)
    return _flatten(obs) + _steps(env, _actions(env, num_steps))


@pytest.mark.parametrize("task", TASK_NAMES)
def test_seeding_is_bitwise_deterministic(task):
    check_seeding(task)


def check_seeding(task: str, **overrides) -> None:
    env = embodied.make_env(task, num_envs=1, **TASKS.get(task).sweep_overrides, **overrides)
    steps, o = env.max_episode_steps + 3, overrides  # past an autoreset
    # a seed that changes the rollout changes it within SHORT steps; compared on those only (a rollout that differs
    # there differs in full), since a locomotion task's full rollout takes seconds
    short = min(steps, SHORT)
    # (constructor seed, reset seed) of a rollout, of one that must equal it, of one that must differ from it:
    # the constructor's seed; then the reset's seed re-seeds, whatever the constructor's was
    for seeds, same, differs in (((3, None), (3, None), (4, None)), ((0, 7), (1, 7), (0, 8))):
        first = _rollout(task, *seeds, steps, o)
        assert _same(first, _rollout(task, *same, steps, o))
        other = _rollout(task, *differs, short, o)
        assert not _same(first[:len(other)], other)


@pytest.mark.parametrize("task", TASK_NAMES)
def test_state_dict_round_trip_continues_exactly(task):
    check_round_trip(task)


def check_round_trip(task: str, **overrides) -> None:
    env = embodied.make_env(task, num_envs=NUM_ENVS, seed=1, **overrides)
    env.reset()
    before = env.max_episode_steps - 2
    _steps(env, _actions(env, before, seed=0))
    state = env.state_dict()
    buffer = io.BytesIO()  # through serialization, as a checkpoint holds it
    torch.save(state, buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    actions = _actions(env, 5, seed=1)  # the 5 steps cross the truncation at max_episode_steps
    expected = _steps(env, actions)
    fresh = embodied.make_env(task, num_envs=NUM_ENVS, seed=12345, **overrides)
    fresh.load_state_dict(state)
    assert _same(_steps(fresh, actions), expected)


@pytest.mark.parametrize("task", ["quadrotor-hover", "pendulum"])
def test_nan_state_is_truncated_and_recovered(task):
    env = embodied.make_env(task, num_envs=NUM_ENVS, seed=0)
    env.reset(seed=0)
    action = torch.zeros(NUM_ENVS, *env.single_action_space.shape)
    env.step(action)
    env.sim.x[1] = float("nan")
    obs, reward, terminated, truncated, info = env.step(action)
    assert bool(truncated[1]) and not bool(terminated[1])
    assert float(reward[1]) == 0.0
    assert torch.isfinite(reward).all()
    assert float(info["log"]["nan_resets"]) == 1.0
    assert info["faulted"].tolist() == [i == 1 for i in range(NUM_ENVS)]  # model fitting drops this row
    assert env.num_nan_resets == 1
    _check_obs(env, obs)  # env 1 was reset: finite, in bounds
    _check_obs(env, info["final_obs"], rows=[1])
    assert int(env.episode_length[1]) == 0
    obs, reward, _, _, info = env.step(action)
    _check_obs(env, obs)
    assert torch.isfinite(reward).all()
    assert float(info["log"]["nan_resets"]) == 0.0 and not info["faulted"].any()
    assert env.num_nan_resets == 1
