"""The Agent-RRM judge that runs here: the local JAX model through a rollout engine. It
implements `judge_many(items) -> [Judgement]` (`rrm.base.Judge`) like `rrm.remote.RemoteJudge`
and the synthetic world's `worlds.rrm_annotator.RuleJudge`, so strategies take any of them.
"""
from __future__ import annotations

from typing import Any, Sequence

from reagent_jax import chat
from reagent_jax.rollout import SamplingParams
from reagent_jax.rrm.base import JudgeFailure, JudgeRequest, as_request, failed_judgement
from reagent_jax.rrm.parser import Judgement, JudgementStats, parse_judgement
from reagent_jax.rrm.prompt import build_rrm_messages


class LocalJudge:
    """A Qwen3 Agent-RRM behind a rollout engine (its own, or the policy's engine with the RRM's
    params): all requests of a call are batched through continuous batching."""

    def __init__(self, engine, tokenizer, *, max_new_tokens: int = 256, temperature: float = 0.0,
                 max_tool_chars: int = 3000, multi_dim: bool = False, fallback_score: float = 0.0, seed: int = 0):
        self.engine, self.tok = engine, tokenizer
        self.max_tool_chars, self.multi_dim, self.fallback = max_tool_chars, multi_dim, fallback_score
        self.sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
                                       stop_token_ids=chat.stop_token_ids(tokenizer))
        self.stats = JudgementStats()

    def prompt_ids(self, question: str, trajectory: Sequence[dict], tools=None) -> list[int]:
        msgs = build_rrm_messages(question, trajectory, tools=tools, max_tool_chars=self.max_tool_chars,
                                  multi_dim=self.multi_dim)
        return list(chat.render(self.tok, msgs, add_generation_prompt=True, mode="train").ids)

    def judge_many(self, items: Sequence[Any]) -> list[Judgement]:
        reqs = [as_request(it, i) for i, it in enumerate(items)]
        prompts = [self.prompt_ids(r.question, r.trajectory, r.tools) for r in reqs]
        limit = self.engine.max_len - 1
        # Too long for the judge's context, or (an engine bug) never answered: an explicit failure
        # status with the fallback score, never a parse of an empty reply.
        out = [failed_judgement(self.fallback, JudgeFailure.PROMPT_TOO_LONG if len(p) >= limit
                                else JudgeFailure.NO_REPLY) for p in prompts]
        ok_idx = [i for i, p in enumerate(prompts) if len(p) < limit]
        results = self.engine.generate([prompts[i] for i in ok_idx], self.sampling) if ok_idx else []
        for i, res in zip(ok_idx, results):
            text = self.tok.decode(res.tokens, skip_special_tokens=True)
            out[i] = parse_judgement(text, fallback_score=self.fallback)
        self.stats.update(out)
        return out


def judge_trajectories(judge, trajs) -> list[Judgement]:
    """Judges agent `Trajectory` objects (question + whole message history, system turn left out;
    the question's record rides along for judges that grade against a reference)."""
    return judge.judge_many([JudgeRequest(t.question["question"], [m for m in t.messages if m["role"] != "system"],
                                          record=t.question) for t in trajs])
