"""The three ways Reagent uses Agent-RRM feedback in GRPO, as `collect` strategies for
`trainers.grpo.run_grpo` (each returns trajectories, rewards, group ids and metrics).

  reagent_r  reward = R_rule + lam * R_model (score of the judge), lam default 0.3.
  reagent_u  per question, n initial episodes + their critique-refined second attempts form ONE
             group; advantages are normalised over the pooled group. A refined episode's loss
             mask covers only its own new tokens (first attempt and critique are context).
  reagent_c  inference-time refinement only: training uses the rule reward (like grpo); the
             evaluation reports first- vs second-attempt accuracy (`evaluate_refinement`).

Beyond the paper (configurable): selective refinement (only episodes whose score < refine_below
get a second attempt), an adaptive lambda schedule (lam ramps linearly from lam_start to lam
over lam_warmup steps), multi-dimensional sub-scores (logged when the judge emits them).
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Optional

import numpy as np

from reagent_jax.registry import Registry
from reagent_jax.rewards import score_trajectory
from reagent_jax.rrm.judges import judge_trajectories
from reagent_jax.rrm.parser import JudgementStatus
from reagent_jax.rrm.prompt import build_refinement_message
from reagent_jax.trainers.grpo import PlainGRPO


@dataclasses.dataclass
class RRMConfig:
    lam: float = 0.3
    lam_start: Optional[float] = None     # adaptive lambda: ramp from lam_start to lam
    lam_warmup: int = 0
    refine_below: float = 1.0             # selective refinement: refine when score < this (1.0: all)
    judge_refined: bool = True            # Reagent-U: also judge second attempts (for lam > 0)
    restate_question: bool = False        # the critique turn ends with the question again

    def __post_init__(self):
        # A NaN or negative weight would silently poison or invert every reward of the run.
        for name in ("lam", "lam_start"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, numbers.Real) and math.isfinite(v) and v >= 0):
                raise ValueError(f"RRMConfig.{name} must be a finite number >= 0, got {v!r}")
        if isinstance(self.lam_warmup, bool) or not isinstance(self.lam_warmup, int) or self.lam_warmup < 0:
            raise ValueError(f"RRMConfig.lam_warmup must be an int >= 0, got {self.lam_warmup!r}")
        if not (isinstance(self.refine_below, numbers.Real) and not math.isnan(self.refine_below)):
            raise ValueError(f"RRMConfig.refine_below must be a number (score < it is refined), "
                             f"got {self.refine_below!r}")


def _lam(c: RRMConfig, step: int) -> float:
    if c.lam_start is None or c.lam_warmup <= 0:
        return c.lam
    f = min(1.0, step / c.lam_warmup)
    return c.lam_start + f * (c.lam - c.lam_start)


def _judge_metrics(judgements, prefix="rrm") -> dict:
    if not judgements:
        return {}
    scores = np.array([j.score for j in judgements], np.float32)
    out = {f"{prefix}/score/mean": float(scores.mean()),
           f"{prefix}/parse_ok_frac": float(np.mean([j.status == JudgementStatus.OK for j in judgements]))}
    subs = [j.sub_scores for j in judgements if getattr(j, "sub_scores", None)]
    for name in dict.fromkeys(k for s in subs for k in s):  # mean over the judgements that rated it
        out[f"{prefix}/{name}/mean"] = float(np.mean([s[name] for s in subs if name in s]))
    return out


class ReagentR:
    name = "reagent_r"

    def __init__(self, judge, config: RRMConfig = RRMConfig()):
        self.judge, self.config = judge, config

    def collect(self, loop, records, n, seed, step: int = 0):
        trajs = loop.run(records, n=n, seed=seed)
        js = judge_trajectories(self.judge, trajs)
        lam = _lam(self.config, step)  # the training step, not a counter here: a resumed run keeps its schedule
        rule = np.array([score_trajectory(t) for t in trajs], np.float32)
        model = np.array([j.score for j in js], np.float32)
        groups = np.repeat(np.arange(len(records)), n).astype(np.int32)
        m = {"critic/rule_score/mean": float(rule.mean()), "rrm/lambda": lam, **_judge_metrics(js)}
        return trajs, rule + lam * model, groups, m


class ReagentU:
    name = "reagent_u"
    rows_per_episode = 2

    def __init__(self, judge, config: RRMConfig = RRMConfig()):
        self.judge, self.config = judge, config

    def collect(self, loop, records, n, seed, step: int = 0):
        keep = loop.keeps_sessions(len(records) * n)  # cache reuse when all fit
        first = loop.run(records, n=n, seed=seed, keep_sessions=keep)
        js = judge_trajectories(self.judge, first)
        lam = _lam(self.config, step)  # the training step, not a counter here: a resumed run keeps its schedule
        todo = [i for i, j in enumerate(js) if j.score < self.config.refine_below and first[i].finish_reason != "error"]
        loop.release([t for i, t in enumerate(first) if i not in set(todo)])
        refined = loop.continue_many([(first[i], [critique_turn(first[i], js[i], self.config.restate_question)])
                                      for i in todo])
        for i, t in zip(todo, refined):
            t.critique = js[i].critique
        rule1 = np.array([score_trajectory(t) for t in first], np.float32)
        rule2 = np.array([score_trajectory(t) for t in refined], np.float32)
        r1 = rule1 + lam * np.array([j.score for j in js], np.float32)
        r2 = rule2
        if lam and self.config.judge_refined and refined:
            r2 = rule2 + lam * np.array([j.score for j in judge_trajectories(self.judge, refined)], np.float32)
        groups1 = np.repeat(np.arange(len(records)), n)
        groups2 = groups1[todo] if todo else np.zeros((0,), int)
        trajs = list(first) + list(refined)
        m = {"critic/rule_score/mean": float(rule1.mean()), "reagent/attempt1_acc": float((rule1 >= 1).mean()),
             "reagent/attempt2_acc": float((rule2 >= 1).mean()) if len(rule2) else 0.0,
             "reagent/refined_frac": len(todo) / max(1, len(first)), "rrm/lambda": lam, **_judge_metrics(js)}
        return (trajs, np.concatenate([r1, r2]).astype(np.float32),
                np.concatenate([groups1, groups2]).astype(np.int32), m)


def critique_turn(first, judgement, restate_question: bool = False) -> dict[str, str]:
    """The user turn of a second attempt: the judge's critique (and the question again)."""
    return build_refinement_message(judgement.critique, first.question["question"] if restate_question else None)


def evaluate_refinement(loop, judge, records, *, greedy: bool = True, seed: int = 0,
                        refine_below: float = 1.0, restate_question: bool = False) -> dict:
    """Reagent-C at inference: attempt 1, judge critique, attempt 2 (cache reused) -> accuracies.
    Only attempts the judge scores below `refine_below` are retried (selective refinement)."""
    keep = loop.keeps_sessions(len(records))
    first = loop.run(records, greedy=greedy, seed=seed, keep_sessions=keep)
    js = judge_trajectories(judge, first)
    todo = [i for i, j in enumerate(js) if j.score < refine_below and first[i].finish_reason != "error"]
    loop.release([t for i, t in enumerate(first) if i not in set(todo)])
    refined = loop.continue_many([(first[i], [critique_turn(first[i], js[i], restate_question)]) for i in todo],
                                 greedy=greedy)
    s1 = np.array([score_trajectory(t) for t in first], np.float32)
    s2 = s1.copy()
    for i, t in zip(todo, refined):
        s2[i] = score_trajectory(t)
    return {"attempt1_accuracy": float(s1.mean()), "attempt2_accuracy": float(s2.mean()),
            "attempt1_scores": s1.tolist(), "attempt2_scores": s2.tolist(),  # [records]: paired comparison
            "refined_frac": len(todo) / max(1, len(first)), "first": first, "refined": refined,
            "refined_indices": todo,  # refined[k] is the second attempt at records[refined_indices[k]]
            "judgements": js, **_judge_metrics(js)}


STRATEGIES: Registry = Registry("strategy")  # config.strategy -> factory(judge, RRMConfig) -> a run_grpo strategy
STRATEGIES.register("grpo", "reagent_c")(lambda judge, config: PlainGRPO())  # Reagent-C acts at inference only
STRATEGIES.register("reagent_r")(ReagentR)
STRATEGIES.register("reagent_u", retries_in_group=True)(ReagentU)  # a group: n first attempts + retries


def build(name: str, judge, config: RRMConfig = RRMConfig()):
    """The `run_grpo` strategy registered as `name` (`STRATEGIES`), with this judge and config."""
    return STRATEGIES.get(name)(judge, config)
