"""The Ray engine: the async engine's workers as Ray actors, so a run outgrows one machine by pointing
at a cluster (``runtime.ray_address=auto`` or ``host:port``); with no address a local instance starts.

Everything but the transport is the async engine's (double buffering, lag, restarts, checkpoints):
actors return numpy arrays through Ray's object store (zero-copy on the same node) and the collector
writes them into its buffers. A dead actor (``RayActorError``) is replaced like a dead process.
"""

from __future__ import annotations

import numpy as np
import torch

from embodied.core.errors import UserError
from embodied.runtime.async_engine import WORKER_TIMEOUT_S, AsyncCollector, _WorkerDied


class EnvActor:
    """A worker's ``VecEnv`` inside a Ray actor."""

    def __init__(self, make_env, num_envs: int, seed: int):
        torch.set_num_threads(1)
        self.env = make_env(num_envs, seed)

    def pid(self) -> int:
        import os

        return os.getpid()

    def step(self, action: np.ndarray):
        obs, reward, terminated, truncated, info = self.env.step(torch.from_numpy(action))
        arrays = {"reward": reward.numpy(), "terminated": terminated.numpy(), "truncated": truncated.numpy(),
                  "faulted": info["faulted"].numpy() if "faulted" in info else np.zeros_like(terminated.numpy()),
                  **{f"obs/{k}": v.numpy() for k, v in obs.items()},
                  **{f"final_obs/{k}": v.numpy() for k, v in info["final_obs"].items()}}
        log = {k: float(v) for k, v in info["log"].items()}
        return arrays, log, {k: v.clone() for k, v in info.get("final_info", {}).items()}

    def reset(self, seed):
        obs, _ = self.env.reset(seed=seed)
        return {f"obs/{k}": v.numpy() for k, v in obs.items()}

    def state(self):
        return self.env.state_dict()

    def load(self, state):
        self.env.load_state_dict(state)

    def close(self):
        self.env.close()


class RayCollector(AsyncCollector):
    def __init__(self, make_env, num_envs: int, seed: int, learner_device, runtime=None):
        try:
            import ray
        except ImportError:
            raise UserError("runtime.engine=ray needs Ray: pip install 'ray[default]'") from None
        self._ray = ray
        if not ray.is_initialized():
            address = runtime.ray_address if runtime is not None else None
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False,
                         **({} if address else {"num_cpus": max(2, runtime.num_workers if runtime else 2)}))
            except ConnectionError as e:
                raise UserError(f"cannot reach the Ray cluster at {address!r}: {e}") from None
        self._actor_cls = ray.remote(num_cpus=1, max_restarts=0)(EnvActor)
        self._inflight: list = []
        super().__init__(make_env, num_envs, seed, learner_device, runtime)

    def _start(self, w: int) -> None:
        if len(self._inflight) < len(self._procs):
            self._inflight = [None] * len(self._procs)
        self._procs[w] = self._actor_cls.remote(self.make_env, self.per_worker, self._worker_seed(w))
        self._inflight[w] = ("ready", self._procs[w].pid.remote())
        self._expect(w, "ready")

    def _send(self, w: int, cmd: str, arg=None) -> None:
        actor, s = self._procs[w], self._slice(w)
        if cmd == "step":
            ref = actor.step.remote(self.buffers["action"][s].numpy())
        elif cmd == "reset":
            ref = actor.reset.remote(arg)
        elif cmd == "state":
            ref = actor.state.remote()
        elif cmd == "load":
            ref = actor.load.remote(arg)
        else:
            ref = actor.close.remote()
        self._inflight[w] = (cmd, ref)

    def _expect(self, w: int, what: str = "ok"):
        cmd, ref = self._inflight[w]
        try:
            payload = self._ray.get(ref, timeout=WORKER_TIMEOUT_S)
        except (self._ray.exceptions.RayActorError, self._ray.exceptions.GetTimeoutError):
            raise _WorkerDied(w) from None
        s = self._slice(w)
        if cmd == "step":
            arrays, log, finfo = payload
            self._write(s, arrays)
            return log, finfo
        if cmd == "reset":
            self._write(s, payload)
        return payload

    def _write(self, s: slice, arrays: dict) -> None:
        b = self.buffers
        for key, value in arrays.items():
            group, _, name = key.partition("/")
            target = b[group][name] if name else b[group]
            target[s] = torch.from_numpy(np.array(value))  # object-store arrays are read-only

    def _kill(self, w: int) -> None:
        self._ray.kill(self._procs[w], no_restart=True)

    def worker_pid(self, w: int) -> int:
        return self._ray.get(self._procs[w].pid.remote())

    def close(self) -> None:
        for actor in self._procs:
            if actor is not None:
                self._ray.kill(actor, no_restart=True)
        self._procs = [None] * len(self._procs)
