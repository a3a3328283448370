"""Training the Agent-RRM itself: SFT data from annotated trajectories, and GRPO with a
verifiable reward.

RRM GRPO reward (documented choice):
    r = format_ok * (1 - |score - target|)
format_ok is 1 when the parser finds think, critique and one in-range score (status "ok"), else
0 (no credit for a well-placed number in a malformed reply). `target` is the record's label in
[0, 1] (e.g. 1.0 for a correct trajectory, 0.0 for a wrong one, or an annotator's score); any
other target (None, NaN, 1.5, "yes") is a data error and raises, since it would give a reward
outside [0, 1] or NaN.
"""
from __future__ import annotations

import math
import numbers
from typing import Sequence

import numpy as np

from reagent_jax.rrm.parser import Judgement, JudgementStats, JudgementStatus, parse_judgement
from reagent_jax.rrm.prompt import build_rrm_messages
from reagent_jax.trainers.completions import completion_trajectory, sample_completions


def check_target(target: float) -> float:
    """The RRM GRPO label as a float in [0, 1]; ValueError saying what it was otherwise."""
    if isinstance(target, bool) or not isinstance(target, numbers.Real) or not math.isfinite(target) \
            or not 0.0 <= target <= 1.0:
        raise ValueError(f"RRM reward target must be a number in [0, 1], got {target!r:.100}")
    return float(target)


def judgement_reward(j: Judgement, target: float) -> float:
    """rrm_reward of an already parsed judgement (see the module docstring)."""
    target = check_target(target)
    return float(1.0 - abs(j.score - target)) if j.status == JudgementStatus.OK else 0.0


def rrm_reward(text: str, target: float) -> float:
    return judgement_reward(parse_judgement(text), target)


def sft_conversation(question: str, trajectory: Sequence[dict], judgement_text: str, *, tools=None,
                     max_tool_chars: int = 3000, multi_dim: bool = False) -> list[dict]:
    """One RRM SFT example: the judge prompt + the target judgement as the assistant turn."""
    msgs = build_rrm_messages(question, [m for m in trajectory if m["role"] != "system"], tools=tools,
                              max_tool_chars=max_tool_chars, multi_dim=multi_dim)
    return msgs + [{"role": "assistant", "content": judgement_text}]


class RRMCollect:
    """A `run_grpo` strategy that trains the RRM: each record (an RRM prompt with a target) gets n
    sampled judgements; reward = rrm_reward. `loop` only lends its engine and tokenizer."""
    name = "rrm_grpo"

    def __init__(self, tokenizer, temperature: float = 1.0, max_new_tokens: int = 192, max_tool_chars: int = 3000):
        self.tok, self.temperature, self.max_new, self.max_tool_chars = tokenizer, temperature, max_new_tokens, max_tool_chars
        self.stats = JudgementStats()

    def collect(self, rollouts, records, n, seed, step: int = 0):
        """rollouts: the RRM's engine (or anything with `.engine`)."""
        for j, rec in enumerate(records):  # before any sampling: a bad label must not cost a rollout
            try:
                check_target(rec.get("target"))
            except ValueError as e:
                raise ValueError(f"RRM record {rec.get('id', j)!r}: {e}") from None
        prompts = [build_rrm_messages(rec["question"], [m for m in rec["trajectory"] if m["role"] != "system"],
                                      max_tool_chars=self.max_tool_chars) for rec in records]
        samples = sample_completions(getattr(rollouts, "engine", rollouts), self.tok, prompts, n,
                                     temperature=self.temperature, max_new_tokens=self.max_new, seed=seed)
        trajs, scores, format_ok = [], [], []
        for j, i, ids, res, text in samples:
            judgement = parse_judgement(text)
            scores.append(judgement_reward(judgement, records[j]["target"]))
            format_ok.append(judgement.ok)  # not reward > 0: an ok reply can earn 0 (score 0, target 1)
            self.stats.update(judgement)
            trajs.append(completion_trajectory(records[j], ids, res, text, i))
        groups = np.array([j for j, *_ in samples], np.int32)
        return trajs, np.asarray(scores, np.float32), groups, {"rrm/format_ok_frac": float(np.mean(format_ok))}
