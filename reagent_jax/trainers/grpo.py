"""GRPO over any `collect` strategy: agent episodes through the engine + agent loop (rule and
optional model rewards: `PlainGRPO`, the Reagent strategies), or single-turn completions
(`trainers.completions`); group advantages, the clipped policy-gradient step.

One step (Reagent-U adds a refinement pass inside `strategy.collect`):
  questions(seed, step) -> n episodes each (engine, tools overlapped) -> rewards -> advantages
  over each question's group (variable size) -> drop zero-variance groups -> reference logprobs
  (beta > 0 only) -> micro-batched update -> new params pushed into the engine.
"""
from __future__ import annotations

import logging
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from reagent_jax.data.sources import RowsAt
from reagent_jax.models.functional import token_logprobs
from reagent_jax.rl.advantages import get_advantage_fn
from reagent_jax.rewards import score_trajectory
from reagent_jax.rl.objectives import grpo_objective
from reagent_jax.rl.stage_config import GRPOConfig
from reagent_jax.rl.train_step import OptimizerConfig
from reagent_jax.trainers.batching import default_buckets, pad_rows
from reagent_jax.trainers.sft import batch_indices
from reagent_jax.trainers.stage import StageRunner

log = logging.getLogger(__name__)


def rollout_metrics(trajs, scores) -> dict:
    n = max(1, len(trajs))
    return {
        "critic/score/mean": float(np.mean(scores)) if len(scores) else 0.0,
        "response_length/mean": sum(t.response_length for t in trajs) / n,
        "num_turns/mean": sum(t.num_turns for t in trajs) / n,
        "tool_call_counts/mean": sum(t.tool_stats.calls for t in trajs) / n,
        "tool_failures/mean": sum(t.tool_stats.failures + t.tool_stats.parse_errors for t in trajs) / n,
        "finish/length_frac": sum(t.finish_reason == "length" for t in trajs) / n,
        "finish/error_frac": sum(t.finish_reason == "error" for t in trajs) / n,
    }


class PlainGRPO:
    """Rule reward only: each question's n episodes form its group."""
    name = "grpo"

    def collect(self, loop, records, n, seed, step: int = 0):
        trajs = loop.run(records, n=n, seed=seed)
        scores = [score_trajectory(t) for t in trajs]
        groups = [j for j in range(len(records)) for _ in range(n)]
        return trajs, np.asarray(scores, np.float32), np.asarray(groups, np.int32), {}


def episode_advantages(adv_fn, trajs, scores, groups, drop_equal_reward_groups: bool = False):
    """(GroupAdvantages, keep bool[N], finite bool[N]) for one step's episodes.

    Failed episodes (finish_reason "error") and non-finite rewards (a broken custom reward) join no
    group, so they cannot shift its mean and std, and are not trained on; the step goes on."""
    scores = np.asarray(scores, np.float64)
    groups = np.asarray(groups)
    finite = np.isfinite(scores)
    valid = finite & np.array([t.finish_reason != "error" for t in trajs], bool)
    adv = adv_fn(jnp.asarray(np.where(finite, scores, 0.0), jnp.float32), jnp.asarray(groups),
                 num_groups=int(groups.max()) + 1, valid=jnp.asarray(valid))
    keep = valid & np.array([t.response_length > 0 for t in trajs], bool)
    if drop_equal_reward_groups:
        keep &= ~np.asarray(adv.zero_std)
    return adv, keep, finite


def build_rows(trajs, advantages, keep, mask_overlong: bool) -> list[dict]:
    rows = []
    for t, a, k in zip(trajs, advantages, keep):
        if not k:
            continue
        mask = list(t.loss_mask)
        if mask_overlong and t.finish_reason == "length":
            mask = [0] * len(mask)
        rows.append({"tokens": list(t.tokens), "loss_mask": mask, "old_logprobs": list(t.logprobs),
                     "advantages": float(a)})
    return rows


def row_bucket(n: int, micro_batches: int, cap: int) -> int:
    """Smallest power-of-two multiple of micro_batches >= n (<= cap): few compiled batch shapes."""
    b = micro_batches
    while b < n:
        b *= 2
    return min(b, cap)


def update_batches(rows: list[dict], *, mini_batches: int, micro_batches: int, row_cap: int, buckets, max_len: int,
                   seed: int, step: int) -> list[dict]:
    """The rollout rows of one step as `mini_batches` padded batches, one optimizer update each
    (verl's ppo_mini_batch_size: with k > 1 the later updates are off-policy and the clip matters).

    Rows are shuffled with (seed, step), so a resumed run splits them exactly as before; each
    mini-batch is padded to the next of a few row counts (powers of two x micro_batches, capped at
    its share of `row_cap`), so only kept rows are computed and few shapes are compiled."""
    if mini_batches < 1:
        raise ValueError(f"grpo.mini_batches must be >= 1, got {mini_batches}")
    order = np.random.default_rng([seed, step]).permutation(len(rows)) if mini_batches > 1 else np.arange(len(rows))
    cap = -(-row_cap // mini_batches)
    cap = -(-cap // micro_batches) * micro_batches
    out = []
    for part in np.array_split(order, min(mini_batches, len(rows))):
        chosen = [rows[i] for i in part]
        batch = pad_rows(chosen, buckets=buckets, batch_size=row_bucket(len(chosen), micro_batches, cap),
                         max_len=max_len)
        batch.pop("row_mask")
        out.append(batch)
    return out


def run_grpo(ctx, model_cfg, params, rollouts, records: list[dict], gcfg: GRPOConfig, *, strategy=None, stage: str = "grpo",
             seed: int = 0, temperature: float = 1.0, max_len: int = 1024, rows_per_step: Optional[int] = None):
    """GRPO for gcfg.steps steps over `records`. `rollouts` is what `strategy.collect` draws
    episodes from: an AgentLoop on a running engine (agentic strategies), or the engine itself
    (single-turn strategies: `trainers.completions`, the RRM's); its engine gets each step's weights.

    gcfg.mini_batches optimizer updates per rollout step; gcfg.old_logprobs "rollout" (the
    engine's logprobs, same definition as the trainer's) or "recompute" (the actor's logprobs at the
    start of the step, computed by the trainer before its first update). `gcfg` may also be the
    config block itself (a notebook's ConfigDict), read as a GRPOConfig."""
    gcfg = GRPOConfig.from_config(gcfg, stage)
    strategy = strategy or PlainGRPO()
    engine = getattr(rollouts, "engine", rollouts)
    mini_batches, old_source = gcfg.mini_batches, gcfg.old_logprobs
    adv_fn = get_advantage_fn(gcfg.advantage)
    objective = grpo_objective(model_cfg, gcfg, temperature)
    opt = OptimizerConfig(learning_rate=gcfg.learning_rate, warmup_steps=gcfg.warmup_steps, decay="constant",
                          total_steps=gcfg.steps * mini_batches, max_grad_norm=gcfg.max_grad_norm)
    runner = StageRunner(ctx, stage, model_cfg, params, objective, opt, total_steps=gcfg.steps,
                         micro_batches=gcfg.micro_batches, checkpoint=ctx.checkpoint,
                         progress_keys=["critic/score/mean", "actor/pg_loss", "response_length/mean"],
                         data_config={"questions_per_step": gcfg.questions_per_step, "n": gcfg.n, "seed": seed,
                                      "num_records": len(records), "mini_batches": mini_batches, "max_len": max_len,
                                      "old_logprobs": old_source,
                                      "strategy": getattr(strategy, "name", type(strategy).__name__)})
    ref_params = jax.tree.map(jnp.copy, params) if gcfg.beta else None  # frozen; beta 0 skips it entirely
    # reference logprobs (frozen params) and recomputed old logprobs (the step's starting params)
    policy_lp = jax.jit(lambda p, t, m: token_logprobs(model_cfg, p, t, m, temperature=temperature, mesh=ctx.mesh))

    def micro_logprobs(p, b):
        """Logprobs of a mini-batch one micro-batch of rows at a time: the pass then needs the
        activations of a micro-batch, as the update does, not of the whole mini-batch."""
        rows = b["tokens"].shape[0] // gcfg.micro_batches
        return np.concatenate([np.asarray(policy_lp(p, b["tokens"][i:i + rows], b["attention_mask"][i:i + rows]))
                               for i in range(0, b["tokens"].shape[0], rows)])

    buckets = default_buckets(max_len)
    n_rows = rows_per_step or gcfg.questions_per_step * gcfg.n * getattr(strategy, "rows_per_episode", 1)
    n_rows = -(-n_rows // gcfg.micro_batches) * gcfg.micro_batches

    def batch_fn(step, params_now):
        t0 = time.perf_counter()
        engine.update_params(params_now)  # the engine's own bf16 / tensor-parallel copy
        t_sync = time.perf_counter() - t0
        idx = batch_indices(len(records), gcfg.questions_per_step, step, seed)
        t0 = time.perf_counter()
        # read lazily: an agent loop on several hosts reads each question only where it runs
        trajs, scores, groups, extra = strategy.collect(rollouts, RowsAt(records, idx), gcfg.n,
                                                        seed=seed * 100_003 + step, step=step)
        t_gen = time.perf_counter() - t0
        engine.free_weights()  # their HBM goes to the update; the next step syncs a new copy
        adv, keep, finite = episode_advantages(adv_fn, trajs, scores, groups, gcfg.drop_equal_reward_groups)
        if not finite.all():
            bad = np.flatnonzero(~finite)
            log.warning("%s step %d: %d non-finite reward(s) (first: episode %d = %s); those episodes are "
                        "dropped from the update", stage, step, bad.size, bad[0], np.asarray(scores)[bad[0]])
        m = rollout_metrics(trajs, np.asarray(scores)[finite])
        m["batch/nonfinite_rewards"] = float((~finite).sum())
        m.update(extra)
        gen_tokens = sum(t.response_length for t in trajs)
        m.update({"timing_s/gen": t_gen, "timing_s/sync_weights": t_sync, "perf/gen_tokens_per_s": gen_tokens / max(t_gen, 1e-9),
                  "batch/kept_frac": float(keep.mean()), "batch/zero_std_groups": float(adv.num_zero_std_groups),
                  "batch/episodes": float(len(trajs)), "batch/groups": float(np.unique(np.asarray(groups)).size),
                  "critic/advantages/abs_mean": float(np.abs(np.asarray(adv.advantages)[keep]).mean()) if keep.any() else 0.0})
        rows = build_rows(trajs, np.asarray(adv.advantages), keep, gcfg.mask_overlong)
        if not rows:
            return None, m
        batches = update_batches(rows[:n_rows], mini_batches=mini_batches, micro_batches=gcfg.micro_batches,
                                 row_cap=n_rows, buckets=buckets, max_len=max_len, seed=seed, step=step)
        if old_source == "recompute":
            t1 = time.perf_counter()
            for b in batches:
                b["old_logprobs"] = micro_logprobs(params_now, b)
            m["timing_s/old_logprobs"] = time.perf_counter() - t1
        if gcfg.beta:
            t1 = time.perf_counter()
            for b in batches:
                b["ref_logprobs"] = micro_logprobs(ref_params, b)
            m["timing_s/ref"] = time.perf_counter() - t1
        return batches, m

    out = runner.run(batch_fn)
    engine.update_params(out)
    return out
