"""Single-turn GRPO rollouts: a prompt per record, n sampled completions each, rewards from
plain functions of (completion, record). What TRL's `GRPOTrainer(reward_funcs=...)` and verl's
single-turn recipes train; here a `collect` strategy for `trainers.grpo.run_grpo`, so the same
engine, train step, checkpoints and metrics serve it (`pipelines/grpo.py` wires it to a config).
"""
from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

import numpy as np

from reagent_jax import chat
from reagent_jax.agent.trajectory import Trajectory
from reagent_jax.rewards import RewardFn
from reagent_jax.rollout import SamplingParams



def prompt_messages(record: Mapping, system_prompt: str = "") -> list[dict]:
    """The chat messages of a record: its "messages", else its "prompt" (or "question") as one user
    turn after an optional system prompt."""
    if record.get("messages"):
        return [dict(m) for m in record["messages"]]
    text = record.get("prompt") or record.get("question")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"record {record.get('id')!r}: no prompt (give 'prompt', 'question' or 'messages')")
    return ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [{"role": "user",
                                                                                         "content": text}]


def sample_completions(engine, tokenizer, prompts: Sequence[Sequence[dict]], n: int, *, temperature: float,
                       max_new_tokens: int, seed: int, top_p: float = 1.0) -> list[tuple[int, int, list[int], object, str]]:
    """n completions of each prompt (chat messages) through the engine: (prompt index, sample
    index, prompt ids, engine result, completion text) in prompt-major order."""
    stop = chat.stop_token_ids(tokenizer)
    ids = [list(chat.render(tokenizer, p, add_generation_prompt=True, mode="train").ids) for p in prompts]
    meta = [(j, i) for j in range(len(prompts)) for i in range(n)]
    sps = [SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, stop_token_ids=stop,
                          seed=(seed * 1_000_003 + k) % (2 ** 31)) for k in range(len(meta))]
    results = engine.generate([ids[j] for j, _ in meta], sps)
    return [(j, i, ids[j], res, tokenizer.decode(res.tokens, skip_special_tokens=True))
            for (j, i), res in zip(meta, results)]


def completion_trajectory(record: Mapping, prompt_ids: Sequence[int], result, text: str, sample_index: int
                          ) -> Trajectory:
    """A one-turn `Trajectory` (loss mask and logprobs on the sampled tokens only)."""
    p = len(prompt_ids)
    finish = {"stop": "answer", "length": "length"}.get(result.finish_reason, result.finish_reason)
    return Trajectory(question=dict(record), messages=[], tokens=list(prompt_ids) + list(result.tokens),
                      loss_mask=[0] * p + [1] * len(result.tokens),
                      logprobs=[0.0] * p + [float(x) for x in result.logprobs], prompt_len=p,
                      turn_spans=[(p, p + len(result.tokens))], final_text=text, sample_index=sample_index,
                      finish_reason=finish if finish in ("answer", "length", "error") else "error")


class CompletionsGRPO:
    """`run_grpo` strategy: each record's n completions form its group; reward = the weighted sum of
    `reward_fns` (each logged as `reward/<name>/mean`). A reward function that raises or returns a
    non-finite value for one completion makes that reward NaN: the episode joins no group and is
    counted in `batch/nonfinite_rewards` (never a silent zero)."""
    name = "completions"

    def __init__(self, tokenizer, reward_fns: Mapping[str, RewardFn], weights: Optional[Mapping[str, float]] = None,
                 *, system_prompt: str = "", temperature: float = 1.0, top_p: float = 1.0,
                 max_new_tokens: int = 256):
        if not reward_fns:
            raise ValueError("CompletionsGRPO needs at least one reward function")
        self.tok, self.reward_fns = tokenizer, dict(reward_fns)
        self.weights = {k: float((weights or {}).get(k, 1.0)) for k in self.reward_fns}
        self.system_prompt, self.temperature, self.top_p, self.max_new = system_prompt, temperature, top_p, max_new_tokens

    def rewards(self, text: str, record: Mapping) -> dict[str, float]:
        out = {}
        for name, fn in self.reward_fns.items():
            try:
                value = float(fn(text, record))
            except Exception:  # noqa: BLE001 - a broken reward is a NaN reward, counted by run_grpo
                value = math.nan
            out[name] = value
        return out

    def collect(self, rollouts, records, n, seed, step: int = 0):
        """rollouts: the engine (or anything with `.engine`, e.g. an AgentLoop)."""
        prompts = [prompt_messages(r, self.system_prompt) for r in records]
        samples = sample_completions(getattr(rollouts, "engine", rollouts), self.tok, prompts, n, temperature=self.temperature,
                                     top_p=self.top_p, max_new_tokens=self.max_new, seed=seed)
        trajs, per_fn = [], {k: [] for k in self.reward_fns}
        for j, i, ids, res, text in samples:
            trajs.append(completion_trajectory(records[j], ids, res, text, i))
            for k, v in self.rewards(text, records[j]).items():
                per_fn[k].append(v)
        scores = sum(self.weights[k] * np.asarray(v, np.float64) for k, v in per_fn.items())
        groups = np.array([j for j, _, _, _, _ in samples], np.int32)
        extra = {f"reward/{k}/mean": float(np.nanmean(v)) if np.isfinite(v).any() else math.nan
                 for k, v in per_fn.items()}
        return trajs, np.asarray(scores, np.float32), groups, extra
