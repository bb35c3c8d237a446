"""The async engine: envs step in worker processes that write into shared-memory buffers (observations
are never pickled), and the next step is already simulating while the learner updates.

Protocol per worker (a pipe carries only commands and small per-step metadata): the parent writes the
actions of the worker's env slice into the shared action buffer and sends ``"step"``; the worker steps
its ``VecEnv``, writes observations, final observations, rewards and flags into its slice of the shared
buffers, and answers with the env log and the outcome of finished episodes.

Double buffering: after handing the runner the transition of step t, the collector acts on its
observation with the current policy and launches step t+1, which simulates during the learner's update.
That action came from a policy one update older than the one that observes it: the lag (updates between
acting and observing) is measured per transition and logged as ``runtime/policy_lag`` (this step),
``runtime/policy_lag_mean`` and ``runtime/policy_lag_max`` (over the run). For an on-policy runner it is 1
for the first step of each rollout and 0 for the rest; an off-policy runner's is its critic steps per env step.

A worker that dies is restarted: its envs are rebuilt with seed ``(seed, worker, restart)``, their
in-flight episodes end as truncated (with the last observation as final observation), and
``runtime/worker_restarts`` counts it.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from collections.abc import Callable, Mapping

import numpy as np
import torch

from embodied.algos.base import Obs, Transition, split_act
from embodied.core.errors import UserError
from embodied.runtime.base import Collector, EpisodeStats, MakeEnv, to_device

WORKER_TIMEOUT_S = 120.0  # a worker silent this long is taken for dead


def worker_seed(seed: int, worker: int, restart: int) -> int:
    """Seed of a worker's envs: distinct per (run seed, worker, restart)."""
    return int(np.random.SeedSequence([seed, worker, restart]).generate_state(1)[0])


def _worker(conn, make_env: MakeEnv, num_envs: int, seed: int, lo: int, buffers: dict) -> None:
    torch.set_num_threads(1)
    try:
        env = make_env(num_envs, seed)
        conn.send(("ready", None))
        while True:
            cmd, arg = conn.recv()
            if cmd == "step":
                obs, reward, terminated, truncated, info = env.step(buffers["action"][lo:lo + num_envs])
                for k, v in obs.items():
                    buffers["obs"][k][lo:lo + num_envs] = v
                for k, v in info["final_obs"].items():
                    buffers["final_obs"][k][lo:lo + num_envs] = v
                buffers["reward"][lo:lo + num_envs] = reward
                buffers["terminated"][lo:lo + num_envs] = terminated
                buffers["truncated"][lo:lo + num_envs] = truncated
                buffers["faulted"][lo:lo + num_envs] = info.get("faulted", False)
                log = {k: float(v) for k, v in info["log"].items()}
                conn.send(("ok", (log, {k: v.clone() for k, v in info.get("final_info", {}).items()})))
            elif cmd == "reset":
                obs, _ = env.reset(seed=arg)
                for k, v in obs.items():
                    buffers["obs"][k][lo:lo + num_envs] = v
                conn.send(("ok", None))
            elif cmd == "state":
                conn.send(("ok", env.state_dict()))
            elif cmd == "load":
                env.load_state_dict(arg)
                conn.send(("ok", None))
            elif cmd == "close":
                env.close()
                conn.send(("ok", None))
                return
    except (EOFError, KeyboardInterrupt):
        return
    except Exception:  # report, then die: the parent restarts the worker
        conn.send(("error", traceback.format_exc()))


class AsyncCollector(Collector):
    def __init__(self, make_env: MakeEnv, num_envs: int, seed: int, learner_device, runtime=None):
        workers = runtime.num_workers if runtime is not None else 2
        if workers < 1 or num_envs % workers:
            raise UserError(f"runtime.num_workers={workers} must be >= 1 and divide num_envs={num_envs}")
        probe = make_env(1, seed)  # spaces, symmetry and buffer layout, without stepping
        self.single_observation_space, self.single_action_space = probe.single_observation_space, \
            probe.single_action_space
        self._symmetry, self._layout, self._relabeller = probe.symmetry_group(), probe.layout(), probe.relabeller()
        obs0, _ = probe.reset(seed=seed)
        probe.close()
        self.num_envs, self.seed, self.make_env = num_envs, seed, make_env
        self.learner_device = torch.device(learner_device)
        self._dropped = False  # a step was dropped since the last transition returned (Transition.fresh)
        self.per_worker = num_envs // workers
        z = lambda *shape, dtype=torch.float32: torch.zeros(num_envs, *shape, dtype=dtype).share_memory_()  # noqa
        self.buffers = {
            "obs": {k: z(*v.shape[1:], dtype=v.dtype) for k, v in obs0.items()},
            "final_obs": {k: z(*v.shape[1:], dtype=v.dtype) for k, v in obs0.items()},
            "action": z(*self.single_action_space.shape), "reward": z(),
            "terminated": z(dtype=torch.bool), "truncated": z(dtype=torch.bool), "faulted": z(dtype=torch.bool),
        }
        self._procs: list = [None] * workers
        self._conns: list = [None] * workers
        self.restarts = [0] * workers
        for w in range(workers):
            self._start(w)
        self._obs: Obs | None = None
        self.stats = EpisodeStats(num_envs, "cpu")
        self.finished: list[dict[str, float]] = []
        self.log: dict[str, float] = {}
        self._lag_sum, self._lag_count, self._lag_max = 0, 0, 0
        self._pending: tuple | None = None  # (obs, action, extras, version acted with) of the launched step

    # ---- workers --------------------------------------------------------------------------------
    def _worker_seed(self, w: int, base: int | None = None) -> int | None:
        """Seed of worker ``w``'s envs from ``base`` (default: the run seed): one worker with no restart seeds
        like the sync engine (same rollouts), else ``(base, worker, restart)``; None stays None."""
        base = self.seed if base is None else base
        if len(self._procs) == 1 and self.restarts[w] == 0:
            return base
        return worker_seed(base, w, self.restarts[w])

    def _start(self, w: int) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        seed = self._worker_seed(w)
        proc = ctx.Process(target=_worker, args=(child, self.make_env, self.per_worker, seed,
                                                       w * self.per_worker, self.buffers), daemon=True)
        proc.start()
        child.close()
        self._procs[w], self._conns[w] = proc, parent
        self._expect(w, "ready")

    def _expect(self, w: int, what: str = "ok"):
        conn = self._conns[w]
        if not conn.poll(WORKER_TIMEOUT_S):
            raise _WorkerDied(w)
        try:
            status, payload = conn.recv()
        except (EOFError, ConnectionResetError):
            raise _WorkerDied(w) from None
        if status == "error":
            raise RuntimeError(f"env worker {w} failed:\n{payload}")
        if status != what:
            raise RuntimeError(f"env worker {w} answered {status!r}, expected {what!r}")
        return payload

    def _send(self, w: int, cmd: str, arg=None) -> None:
        try:
            self._conns[w].send((cmd, arg))
        except (BrokenPipeError, ConnectionResetError):
            pass  # noticed by _expect, which restarts the worker

    def _kill(self, w: int) -> None:
        proc = self._procs[w]
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=5)

    def _restart(self, w: int) -> None:
        self._kill(w)
        self.restarts[w] += 1
        self._start(w)
        self._send(w, "reset", self._worker_seed(w))
        self._expect(w)

    def _slice(self, w: int) -> slice:
        return slice(w * self.per_worker, (w + 1) * self.per_worker)

    # ---- contract -------------------------------------------------------------------------------
    @property
    def obs(self) -> Obs | None:
        return self._obs

    def reset(self, seed: int | None) -> None:
        self._pending = None
        for w in range(len(self._procs)):
            self._send(w, "reset", None if seed is None else self._worker_seed(w, seed))
        for w in range(len(self._procs)):
            self._expect(w)
        self._obs = {k: v.clone() for k, v in self.buffers["obs"].items()}
        self.stats.reset()

    def _launch(self, act: Callable[[Obs], torch.Tensor], version: int) -> None:
        obs = to_device(self._obs, self.learner_device)
        action, extras = split_act(act(obs))
        self.buffers["action"].copy_(action.detach().to("cpu"))
        for w in range(len(self._procs)):
            self._send(w, "step")
        self._pending = (obs, action, extras, version)

    def step(self, act: Callable[[Obs], torch.Tensor], version: int = 0) -> Transition:
        if self._pending is None:
            self._launch(act, version)
        obs, action, extras, acted_version = self._pending
        logs, final_info, died = [], {}, []
        for w in range(len(self._procs)):
            try:
                log, finfo = self._expect(w)
                logs.append(log)
                for k, v in finfo.items():
                    final_info.setdefault(k, torch.zeros(self.num_envs))[self._slice(w)] = v.float()
            except _WorkerDied:
                died.append(w)
        b = self.buffers
        reward, terminated, truncated = b["reward"].clone(), b["terminated"].clone(), b["truncated"].clone()
        faulted = b["faulted"].clone()
        final_obs = {k: v.clone() for k, v in b["final_obs"].items()}
        for w in died:  # in-flight episodes end as truncated; the restarted worker's envs start afresh
            s = self._slice(w)
            self._restart(w)
            reward[s], terminated[s], truncated[s], faulted[s] = 0.0, False, True, True
            for k in final_obs:
                final_obs[k][s] = self._obs[k][s]
        self._obs = {k: v.clone() for k, v in b["obs"].items()}
        self.log = {k: sum(lg[k] for lg in logs) / len(logs) for k in (logs[0] if logs else {})}
        self.log["runtime/worker_restarts"] = float(sum(self.restarts))
        lag = version - acted_version
        self._lag_sum, self._lag_count = self._lag_sum + lag, self._lag_count + 1
        self._lag_max = max(self._lag_max, lag)
        self.log["runtime/policy_lag"] = float(lag)  # of this step
        self.log["runtime/policy_lag_mean"] = self._lag_sum / self._lag_count  # over the run
        self.log["runtime/policy_lag_max"] = float(self._lag_max)
        episodes = self.stats.track(reward, terminated | truncated, final_info)
        if episodes is not None:
            self.finished.extend(episodes.as_dicts())
        fresh = None
        if self._dropped:
            fresh = torch.ones(self.num_envs, dtype=torch.bool, device=self.learner_device)
            self._dropped = False
        tr = Transition(obs, action, to_device(reward, self.learner_device),
                        to_device(terminated, self.learner_device), to_device(truncated, self.learner_device),
                        next_obs=to_device(final_obs, self.learner_device), extras=extras, fresh=fresh,
                        faulted=to_device(faulted, self.learner_device))
        self._launch(act, version)  # step t+1 simulates while the learner updates on step t
        return tr

    def pop_episodes(self) -> list[dict[str, float]]:
        out, self.finished = self.finished, []
        return out

    def symmetry_group(self):
        return self._symmetry

    def layout(self):
        return self._layout

    def relabeller(self):
        return self._relabeller

    def _drain(self) -> None:
        """Finish the launched step and forget it (its action came from a policy a checkpoint does not hold)."""
        if self._pending is not None:
            for w in range(len(self._procs)):
                self._expect(w)
            self._obs = {k: v.clone() for k, v in self.buffers["obs"].items()}
            self._pending = None
            self._dropped = True  # the next transition does not follow the last one returned

    def state_dict(self) -> dict:
        # the launched step is part of the stream: a checkpoint continues correctly (counters, weights,
        # replay, env states), not bit-exactly, after the step that was in flight
        self._drain()
        envs = []
        for w in range(len(self._procs)):
            self._send(w, "state")
            envs.append(self._expect(w))
        return {"obs": {k: v.clone() for k, v in self._obs.items()}, **self.stats.state_dict(),
                "finished": list(self.finished), "envs": envs, "restarts": list(self.restarts)}

    def load_state_dict(self, state: Mapping) -> None:
        self._drain()
        if len(state["envs"]) != len(self._procs):
            raise UserError(f"checkpoint has {len(state['envs'])} env workers, this run {len(self._procs)}")
        for w, env_state in enumerate(state["envs"]):
            self._send(w, "load", env_state)
            self._expect(w)
        self._obs = {k: v.clone() for k, v in state["obs"].items()}
        self._dropped = True  # the checkpoint's obs follows the step its state_dict drained
        self.stats.load_state_dict(state)
        self.finished = list(state["finished"])
        self.restarts = list(state["restarts"])

    def close(self) -> None:
        for w, proc in enumerate(self._procs):
            if proc is not None and proc.is_alive():
                self._send(w, "close")
                proc.join(timeout=5)
                if proc.is_alive():
                    proc.kill()


class _WorkerDied(Exception):
    def __init__(self, worker: int):
        super().__init__(f"env worker {worker} died")
        self.worker = worker
