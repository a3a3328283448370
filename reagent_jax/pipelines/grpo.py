"""The plain GRPO pipeline: prompts + reward functions -> completions -> GRPO, with no agent loop:
what TRL's `GRPOTrainer(reward_funcs=...)` and verl's single-turn recipes give, over the same
engine, train step, checkpoints and metrics as the agent pipeline.

    python launch/train.py --config=configs/grpo_gsm8k.py --workdir=runs/grpo_gsm8k
    # in Python, with reward functions of your own, (completion text, record) -> float:
    pipelines.grpo.run(config, workdir, reward_fns={"correct": my_reward, "short": brevity})

Rows come from `data.train_path` / `data.eval_path` (JSONL, parquet or `tfds:` specs) with a
"question" (or a "prompt", or chat "messages") and whatever the reward functions read ("answer"
and "data_source" for the registered `answer` reward). Config `rewards` names registered
functions (`rewards.REWARD_FNS`), `reward_weights` weighs them (default 1 each). The held-out
table reports each reward's mean over greedy completions before and after GRPO.
"""
from __future__ import annotations

import json
import logging
import os
import time
from typing import Mapping, Optional

import numpy as np

from reagent_jax.kernels.attention import kernels_report
from reagent_jax.parallel import hosts
from reagent_jax.pipelines.context import RunContext, load_policy, load_records, make_context, write_summary
from reagent_jax.rewards import REWARD_FNS, RewardFn
from reagent_jax.rollout import Engine
from reagent_jax.trainers.completions import CompletionsGRPO, prompt_messages, sample_completions
from reagent_jax.trainers.grpo import run_grpo

log = logging.getLogger(__name__)

STAGES = ("grpo",)


def reward_functions(config) -> tuple[dict[str, RewardFn], dict[str, float]]:
    """(name -> function, name -> weight) of `config.rewards` (comma-separated registered names)
    and `config.reward_weights` (as many comma-separated floats, or empty for 1 each)."""
    names = [s.strip() for s in config.rewards.split(",") if s.strip()]
    if not names:
        raise ValueError("config.rewards names no reward function; registered: " + ", ".join(REWARD_FNS))
    weights = [float(w) for w in str(config.get("reward_weights", "") or "").split(",") if w.strip()]
    if weights and len(weights) != len(names):
        raise ValueError(f"config.reward_weights has {len(weights)} values for {len(names)} rewards ({names})")
    return {n: REWARD_FNS.get(n) for n in names}, dict(zip(names, weights or [1.0] * len(names)))


def evaluate(ctx: RunContext, engine: Engine, strategy: CompletionsGRPO, records, name: str) -> Optional[dict]:
    """Greedy completions of the held-out records scored by every reward function: a table row
    (each reward's mean, tokens/s) and `eval_<name>.jsonl` in the workdir."""
    if not records:
        return None
    t0 = time.perf_counter()
    prompts = [prompt_messages(r, strategy.system_prompt) for r in records]
    samples = sample_completions(engine, ctx.tokenizer, prompts, 1, temperature=0.0,
                                 max_new_tokens=strategy.max_new, seed=ctx.config.seed)
    wall = time.perf_counter() - t0
    scored = [(records[j], res, text, strategy.rewards(text, records[j])) for j, _, _, res, text in samples]
    row = {"policy": name}
    for fn in strategy.reward_fns:
        values = np.array([r[fn] for _, _, _, r in scored], np.float64)
        row[f"held-out {fn}"] = float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")
    tokens = sum(len(res.tokens) for _, res, _, _ in scored)
    row["gen tokens/s"] = tokens / max(wall, 1e-9)
    if hosts.is_leader():
        with open(os.path.join(ctx.workdir, f"eval_{name}.jsonl"), "w") as f:
            for rec, res, text, rewards in scored:
                f.write(json.dumps({"id": rec.get("id"), "prompt": prompt_messages(rec, strategy.system_prompt),
                                    "completion": text, "finish_reason": res.finish_reason,
                                    "rewards": rewards}, default=str) + "\n")
    log.info("%s: %s", name, {k: round(v, 4) for k, v in row.items() if k != "policy"})
    return row


def run(config, workdir: str, reward_fns: Optional[Mapping[str, RewardFn]] = None,
        reward_weights: Optional[Mapping[str, float]] = None) -> dict:
    """Trains `config.model` with GRPO on `data.train_path`'s prompts; `reward_fns` (callables)
    replace `config.rewards` when given. Resumes like every stage; returns the summary."""
    t_start = time.perf_counter()
    ctx = make_context(config, workdir)
    train, heldout = load_records(ctx)
    if reward_fns:
        fns, weights = dict(reward_fns), {k: float((reward_weights or {}).get(k, 1.0)) for k in reward_fns}
    else:
        fns, weights = reward_functions(config)
    cfg, params = load_policy(ctx, "grpo")
    r, g = ctx.rollout, ctx.blocks["grpo"]
    engine = Engine(cfg, params, **r.engine_kwargs(), mesh=ctx.mesh, tokenizer=ctx.tokenizer, seed=config.seed)
    p = config.prompt
    strategy = CompletionsGRPO(ctx.tokenizer, fns, weights, system_prompt=p.system, temperature=p.temperature,
                               top_p=p.top_p, max_new_tokens=p.max_new_tokens)
    rows = []
    engine.start_background()
    try:
        first = "grpo" if ctx.has_final("grpo") else ("init" if config.model.init_from else "random_init")
        rows.append(evaluate(ctx, engine, strategy, heldout, first))
        if not ctx.has_final("grpo"):
            params = run_grpo(ctx, cfg, params, engine, train, g, strategy=strategy, seed=config.seed,
                              temperature=p.temperature, max_len=r.max_len)
            rows.append(evaluate(ctx, engine, strategy, heldout, "grpo"))
    finally:
        engine.stop_background()
    return write_summary(workdir, [row for row in rows if row], STAGES, time.perf_counter() - t_start,
                         engine=engine.stats(), rewards={k: weights[k] for k in fns},
                         kernels=kernels_report(cfg, ctx.mesh))
