"""A learner in a process of its own (an ensemble member on a CPU learner): the run's process collects, and K
members update at once on K cores, where threads in one process do not (quadrotor-hover's TD3: two members'
updates took 4.19 ms one after the other and 3.82 ms in two threads, against 2.12 ms for one: torch's per-op work
holds the GIL).

Protocol over a pipe (per-step payloads are small numpy arrays, pickled by value: a torch tensor would be moved to
a new shared-memory segment per send): ``act`` and the state calls answer; ``observe`` does not; ``update`` answers
its metrics, which are read before the next answer, so a member's update runs while the parent steps on and the
next ``act`` waits for it."""

from __future__ import annotations

import multiprocessing as mp
import traceback
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from embodied.algos.base import Algorithm, BuildContext, Obs, Transition, split_act
from embodied.core.errors import UserError

MEMBER_TIMEOUT_S = 600.0  # a member silent this long (one update, one state transfer) is taken for dead


def to_numpy(value: Any) -> Any:
    """Tensors (in dicts, in a Transition) as numpy arrays; None and scalars as they are."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, Mapping):
        return {k: to_numpy(v) for k, v in value.items()}
    if isinstance(value, Transition):
        return {f: to_numpy(getattr(value, f)) for f in value.__dataclass_fields__}
    return value


def _torch(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, Mapping):
        return {k: _torch(v) for k, v in value.items()}
    return value


def _serve(conn, algo_cls: type[Algorithm], cfg: Any, ctx: BuildContext) -> None:
    import numba

    # members share the cores: one compute thread each (torch's, and the numba kernels' budget)
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    try:
        from embodied.policies import policy_spec

        algo = algo_cls.build(cfg, ctx)
        conn.send(("ok", {"rollout_length": algo.rollout_length, "steps_per_update": algo.steps_per_update}))
        while True:
            cmd, arg = conn.recv()
            if cmd == "observe":
                algo.observe(Transition(**_torch(arg)))
                continue
            if cmd == "act":
                action, extras = split_act(algo.act(_torch(arg)))
                out = (to_numpy(action), to_numpy(extras), algo.num_updates)
            elif cmd == "update":
                out = {k: float(v) for k, v in algo.update().items()}
            elif cmd == "actor":
                actor = algo.actor()
                out = (policy_spec(actor), actor.state_dict())
            elif cmd == "load_actor":
                algo.actor().load_state_dict(arg)
                algo.actor_loaded()
                out = None
            elif cmd == "state":
                out = algo.state_dict()
            elif cmd == "load":
                algo.load_state_dict(arg)
                out = None
            elif cmd == "close":
                conn.send(("ok", None))
                return
            else:
                raise ValueError(f"unknown command {cmd!r}")
            conn.send(("ok", out))
    except (EOFError, KeyboardInterrupt):
        return
    except UserError as e:
        conn.send(("user_error", str(e)))
    except Exception:
        conn.send(("error", traceback.format_exc()))


class RemoteLearner(Algorithm):
    """The verbs of a learner that lives in a spawned process (``_serve``)."""

    def __init__(self, algo_cls: type[Algorithm], cfg: Any, ctx: BuildContext, name: str):
        """``algo_cls`` reaches the member's process by reference (a registered algorithm is a module-level class)."""
        self.paradigm, self.episodic, self.name = algo_cls.paradigm, algo_cls.episodic, name
        context = mp.get_context("spawn")
        self._conn, child = context.Pipe()
        self._proc = context.Process(target=_serve, args=(child, algo_cls, cfg, ctx), daemon=True,
                                     name=name)
        self._proc.start()
        child.close()
        self._pending = 0  # answers owed by the member (updates)
        self._metrics: dict[str, float] = {}
        self.num_updates = 0
        self._rollout_length = 1
        self._started = False
        self._copy: nn.Module | None = None  # the actor's copy ``actor()`` hands out
        self._copy_spec: dict | None = None

    def wait_ready(self) -> None:
        if not self._started:
            ready = self._answer()
            self._rollout_length, self.steps_per_update = ready["rollout_length"], ready["steps_per_update"]
            self._started = True

    def _answer(self) -> Any:
        if not self._conn.poll(MEMBER_TIMEOUT_S):
            raise RuntimeError(f"{self.name} did not answer within {MEMBER_TIMEOUT_S:.0f} s")
        try:
            status, payload = self._conn.recv()
        except (EOFError, ConnectionResetError):
            raise RuntimeError(f"{self.name} died (exit code {self._proc.exitcode})") from None
        if status == "user_error":
            raise UserError(payload)
        if status == "error":
            raise RuntimeError(f"{self.name} failed:\n{payload}")
        return payload

    def _drain(self) -> None:
        """Read the answers of the updates sent so far (their metrics)."""
        while self._pending:
            self._metrics = self._answer()
            self._pending -= 1

    def send(self, cmd: str, arg: Any = None) -> None:
        self.wait_ready()
        self._conn.send((cmd, arg))

    def call(self, cmd: str, arg: Any = None) -> Any:
        self.send(cmd, arg)
        self._drain()
        return self._answer()

    def receive(self) -> Any:
        """The answer of a command ``send`` made (after the owed update answers)."""
        self._drain()
        return self._answer()

    @property
    def rollout_length(self) -> int:
        self.wait_ready()
        return self._rollout_length

    def act(self, obs: Obs):
        return self.finish_act(self.call("act", to_numpy(obs)))

    def finish_act(self, answer) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        action, extras, self.num_updates = answer
        return torch.from_numpy(action), _torch(extras)

    def observe(self, transition: Transition) -> None:
        self.send("observe", to_numpy(transition))

    def update(self) -> dict[str, float]:
        """Starts the member's update and returns the metrics of its previous one, which it waits for first: at
        most one update is owed, so a runner that only updates (the offline one) cannot fill both pipes (the
        member blocked sending metrics nobody reads, the parent blocked sending updates it does not take)."""
        self._drain()
        self.send("update")
        self._pending += 1
        return self._metrics

    def actor(self) -> nn.Module:
        """A copy of the member's actor with its weights now (built once; the build draws its throwaway initial
        weights from a forked RNG, so the run's own random stream is the same whenever a copy is asked for)."""
        from embodied.policies import build_policy

        spec, state = self.call("actor")
        if self._copy is None or self._copy_spec != spec:
            with torch.random.fork_rng(devices=[]):
                self._copy, self._copy_spec = build_policy(spec), spec
        self._copy.load_state_dict(state)
        return self._copy

    def load_actor(self, state: Mapping) -> None:
        self.call("load_actor", dict(state))

    def state_dict(self) -> dict:
        return self.call("state")

    def load_state_dict(self, state: Mapping) -> None:
        self.call("load", state)

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self.call("close")
            except (RuntimeError, BrokenPipeError, OSError):
                pass
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.kill()
