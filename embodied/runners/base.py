"""What every runner shares: counters, episode statistics, periodic logging, evaluation and
checkpoints. Each paradigm's runner (on-policy, off-policy) owns only its short loop."""

from __future__ import annotations

import copy
import time
from functools import partial
from pathlib import Path

import torch

from embodied.algos.base import Algorithm
from embodied.checkpoint import save_checkpoint
from embodied.config import RunConfig, to_dict
from embodied.evaluate import eval_seed, evaluate
from embodied.metrics import MetricsLogger, plot_learning_curve
from embodied.policies import policy_spec, reset_policy
from embodied.runtime.base import Collector

STRICT_EPISODES = 200  # an evaluation this large decides the stop rule alone


class Runner:
    def __init__(self, cfg: RunConfig, collector: Collector, algo: Algorithm, make_eval_env,
                 run_dir: Path, imagination=None, judge=None):
        self.cfg, self.collector, self.algo = cfg, collector, algo
        # a second collector that learns a simulator from the real steps and steps it (TaskSpec.imagination)
        self.imagination = imagination
        self.judge = judge  # log.keep_best_by=model: score(act, episodes, learner_device) in the task's model
        self.make_eval_env = make_eval_env  # factory: the eval env is built on first use
        self._eval_env = None
        self.run_dir = Path(run_dir)
        self.logger = MetricsLogger(self.run_dir, cfg.log.tensorboard, cfg.log.progress, cfg.total_steps)
        self.step = 0  # env steps summed over the batch
        self.train_time = 0.0  # seconds spent collecting and learning (excludes eval, checkpoints)
        self._marks = {"log": 0, "eval": 0, "ckpt": 0}
        self._recent: list[dict] = []
        self.last_eval: dict[str, float] = {}
        self.solved_at: dict[str, float] | None = None
        self.eval_passes = 0  # consecutive evaluations at or above stop_success
        self.best: dict | None = None  # log.keep_best: {"step", "score", "eval", "state"} of the best evaluated policy
        self._t_start = 0.0
        self._kept = None  # log.keep_best_by=model: an actor holding the kept policy, to score it again

    # ---- loop helpers -------------------------------------------------------------------------
    def start(self) -> None:
        if self.collector.obs is None:
            self.collector.reset(seed=self.cfg.seed)
        self._t_start = time.perf_counter()

    def collect(self):
        tr = self.collector.step(self.algo.act, version=self.algo.num_updates)
        if self.imagination is None or self.imagination.learner_sees_real:
            self.algo.observe(tr)
        self.step += tr.reward.shape[0]
        if self.imagination is not None:
            self.imagination.after_real(tr, self.step, self.algo)
        return tr

    def after_update(self, metrics: dict) -> bool:
        """Periodic chores after a learning step; returns True when training should stop."""
        now = time.perf_counter()
        self.train_time += now - self._t_start
        episodes = self.collector.pop_episodes()
        self._recent = (self._recent + episodes)[-100:]
        log = self.cfg.log
        if self._due("log", log.log_every) or self.step >= self.cfg.total_steps:
            self._log_train(metrics)
        stop = False
        if (log.eval_every and self._due("eval", log.eval_every)) or self.step >= self.cfg.total_steps:
            stop = self.run_eval()
        if log.checkpoint_every and self._due("ckpt", log.checkpoint_every):
            self.checkpoint()
        if self.logger.due():
            self.logger.show(self.step, self.steps_per_s, self._recent_mean("return"),
                             self.last_eval.get("eval/success"))
        self._t_start = time.perf_counter()
        return stop or self.step >= self.cfg.total_steps

    @property
    def steps_per_s(self) -> float:
        """Env steps per second of training time (eval and checkpoints excluded)."""
        return self.step / self.train_time if self.train_time > 0 else 0.0

    def _due(self, what: str, every: int) -> bool:
        if every <= 0 or self.step - self._marks[what] < every:
            return False
        self._marks[what] = self.step - self.step % every
        return True

    def _recent_mean(self, key: str) -> float | None:
        vals = [e[key] for e in self._recent if key in e]
        return sum(vals) / len(vals) if vals else None

    def _log_train(self, metrics: dict) -> None:
        row = dict(metrics)
        for key in ("return", "length", "success"):
            v = self._recent_mean(key)
            if v is not None:
                row[f"train/{key}"] = v
        row.update({f"env/{k}": v for k, v in self.collector.log.items()})
        if self.imagination is not None:
            row.update(self.imagination.log)
        row["time/train_s"] = self.train_time
        row["time/steps_per_s"] = self.steps_per_s
        self.logger.log(self.step, row)

    def run_eval(self) -> bool:
        """The periodic evaluation; True when the stop rule is met. With ``stop_confirm=now`` a pass that the rule
        needs repeated is confirmed at once on the same policy, by evaluations of ``STRICT_EPISODES`` fresh starts
        in all (pooled), each confirmation counting as one more pass."""
        if self._eval_env is None:
            self._eval_env = self.make_eval_env()
        actor = self.algo.actor()
        was_training = actor.training
        actor.eval()
        try:
            stop = self._judge_eval(actor, self._evaluate(actor, 0))
            repeat = 1
            while not stop and self.cfg.stop_confirm == "now" and self.eval_passes > 0:
                results = []
                while len(results) * self.cfg.log.eval_episodes < STRICT_EPISODES:
                    results.append(self._evaluate(actor, repeat))
                    repeat += 1
                # equal-sized evaluations: the pooled means are the means' mean (spreads are not pooled here)
                pooled = {k: sum(r[k] for r in results) / len(results) for k in results[0] if not k.endswith("_std")}
                stop = self._judge_eval(actor, {**pooled, "eval/confirm_episodes": float(
                    len(results) * self.cfg.log.eval_episodes)})
            return stop
        finally:
            actor.train(was_training)

    def _evaluate(self, actor, repeat: int) -> dict[str, float]:
        # a policy with per-env state (a chunk queue) restarts it here and again when the rollouts go on
        result = evaluate(actor.act, self._eval_env, seed=eval_seed(self.cfg, self.step, repeat),
                          learner_device=self.cfg.learner_device, reset=partial(reset_policy, actor))
        reset_policy(actor)
        return result

    def _judge_eval(self, actor, result: dict[str, float]) -> bool:
        """Logs ``result`` and counts it toward the stop rule; True when the rule is met."""
        self.last_eval = result
        self.logger.log(self.step, {**result, "time/train_s": self.train_time})
        if self.cfg.log.keep_best:
            self._keep_if_best(actor, result)
        target = self.cfg.stop_success
        # success is a float32 mean: 95 of 100 is 0.9499999881, which must count as 0.95
        passed = "eval/success" in result and target is not None and result["eval/success"] >= target - 1e-6
        self.eval_passes = self.eval_passes + 1 if passed else 0
        # one evaluation of fewer than 200 starts passes by luck too often (a policy whose true success
        # is 0.92 passes one of ten 100-start evaluations at 95% most of the time): ask for two in a row
        needed = self.cfg.stop_passes or (1 if self.cfg.log.eval_episodes >= STRICT_EPISODES else 2)
        if self.eval_passes >= needed:
            if self.solved_at is None:
                self.solved_at = {"step": self.step, "train_s": self.train_time}
                self.logger.log(self.step, {"solved/train_s": self.train_time})
            return True
        return False

    def _keep_if_best(self, actor, result: dict) -> None:
        if self.cfg.log.keep_best_by == "model":  # both policies scored in the newest model, on the same starts
            score = (self._imagined_return(actor),)
            row = {"best/imagined_return": score[0]}
            if self.best is not None:
                self.best["score"] = [self._imagined_return(self._kept_actor(actor))]
                row["best/kept_imagined_return"] = self.best["score"][0]
            self.logger.log(self.step, row)
        else:
            score = (result.get("eval/success", float("-inf")), result["eval/return"])
        if self.best is None or score > tuple(self.best["score"]):
            state = {k: v.detach().to("cpu", copy=True) for k, v in actor.state_dict().items()}
            self.best = {"step": self.step, "score": list(score), "eval": dict(result), "state": state}
            self.logger.log(self.step, {"best/step": self.step})

    def _imagined_return(self, actor) -> float:
        return self.judge(actor.act, self.cfg.log.eval_episodes, self.cfg.learner_device)

    def _kept_actor(self, actor):
        """A copy of ``actor`` holding the kept (best) policy's weights, in eval mode."""
        if self._kept is None:
            self._kept = copy.deepcopy(actor)
        self._kept.load_state_dict(self.best["state"])
        return self._kept.eval()

    # ---- checkpoints -----------------------------------------------------------------------------
    def checkpoint(self) -> Path:
        actor = self.algo.actor()
        policy = {"spec": policy_spec(actor), "state": actor.state_dict(), "step": self.step}
        if self.best is not None:  # log.keep_best: the best evaluated policy is the run's policy
            policy.update(state=self.best["state"], step=self.best["step"])
        payload = {
            "format": 1,
            "config": to_dict(self.cfg),
            "step": self.step,
            "train_time": self.train_time,
            "marks": dict(self._marks),
            "eval_passes": self.eval_passes,
            "recent": list(self._recent),
            "algo": self.algo.state_dict(),
            "collector": self.collector.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "policy": policy,
            "best": self.best,
        }
        if self.imagination is not None:
            payload["imagination"] = self.imagination.state_dict()
        keep = self.cfg.log.keep_checkpoints
        path = save_checkpoint(self.run_dir, self.step, payload, keep=keep)
        self.logger.note(f"checkpoint {path.name}: {path.stat().st_size / 2**20:,.1f} MiB (the newest {keep} are kept)")
        return path

    def restore(self, ckpt: dict) -> None:
        self.algo.load_state_dict(ckpt["algo"])
        self.collector.load_state_dict(ckpt["collector"])
        torch.set_rng_state(ckpt["torch_rng"])
        self.step = int(ckpt["step"])
        self.logger.rewind(self.step)
        self.train_time = float(ckpt["train_time"])
        self._marks = dict(ckpt["marks"])
        self.eval_passes = int(ckpt.get("eval_passes", 0))
        self.best = ckpt.get("best")
        self._recent = list(ckpt["recent"])
        if self.imagination is not None:
            self.imagination.load_state_dict(ckpt["imagination"])

    def finish(self) -> dict:
        self.checkpoint()
        self.collector.close()
        self.algo.close()
        self.logger.show(self.step, self.steps_per_s, self._recent_mean("return"),
                         self.last_eval.get("eval/success"), force=True)
        self.logger.close()
        plot_learning_curve(self.run_dir)
        summary = {"step": self.step, "train_s": self.train_time, **self.last_eval}
        if self.solved_at:
            summary["solved_train_s"] = self.solved_at["train_s"]
        if self.best is not None:  # the policy the run keeps, and its evaluation
            summary["best_step"] = self.best["step"]
            summary.update({f"best/{k[5:]}": v for k, v in self.best["eval"].items()})
        return summary

    def train(self) -> dict:
        raise NotImplementedError
