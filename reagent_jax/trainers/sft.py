"""SFT on multi-turn agent trajectories: loss on assistant tokens only (the train-mode rendering's
mask), on the shared train step. Batches are drawn by a seeded per-epoch permutation, so the
batch of step s is a pure function of (seed, s) and resuming replays the same data."""
from __future__ import annotations

import logging
from typing import Optional, Sequence

import numpy as np

from reagent_jax import chat
from reagent_jax.rl.objectives import SFTObjective
from reagent_jax.rl.stage_config import SFTConfig
from reagent_jax.rl.train_step import OptimizerConfig
from reagent_jax.trainers.batching import default_buckets, pad_rows
from reagent_jax.trainers.stage import StageRunner

log = logging.getLogger(__name__)


def render_examples(tokenizer, conversations: Sequence[list[dict]], tools: Optional[list] = None,
                    max_len: Optional[int] = None) -> list[dict]:
    """Chat conversations -> {"tokens", "loss_mask"} rows (train-mode rendering); over-long
    conversations are dropped with a counted warning rather than silently truncated. When a
    conversation has a weight-0 assistant turn, every row also carries `context_mask`, which leaves
    those turns out of the context loss too (see `chat.render`); otherwise the context is every
    non-loss token and the SFT program keeps its usual inputs."""
    rows, dropped = [], 0
    for msgs in conversations:
        r = chat.render(tokenizer, msgs, tools=tools, mode="train")
        if max_len is not None and len(r.ids) > max_len:
            dropped += 1
            continue
        rows.append({"tokens": list(r.ids), "loss_mask": list(r.loss_mask), "context_mask": list(r.context_mask)})
    if all(c == 1 - m for row in rows for c, m in zip(row["context_mask"], row["loss_mask"])):
        for row in rows:
            del row["context_mask"]
    if dropped:
        log.warning("SFT: dropped %d of %d conversations longer than max_len=%s", dropped, len(conversations), max_len)
    if not rows:
        raise ValueError("SFT: no usable conversations (all empty or longer than max_len)")
    return rows


def batch_indices(n: int, batch_size: int, step: int, seed: int) -> np.ndarray:
    """Rows of step `step`: consecutive slices of a fresh seeded permutation per epoch."""
    per_epoch = max(1, n // batch_size)
    epoch, k = divmod(step, per_epoch)
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    return perm[k * batch_size:(k + 1) * batch_size]


def run_sft(ctx, model_cfg, params, rows: list[dict], sft_cfg: SFTConfig, stage: str = "sft", seed: int = 0):
    """Trains for sft_cfg.steps steps; returns the final params (saved under <stage>/final).
    `sft_cfg` may also be the config block itself (a notebook's ConfigDict), read as an SFTConfig."""
    sft_cfg = SFTConfig.from_config(sft_cfg, stage)
    if len(rows) < sft_cfg.batch_size:
        raise ValueError(f"SFT: {len(rows)} examples < batch_size={sft_cfg.batch_size}")
    buckets = default_buckets(sft_cfg.max_len)
    opt = OptimizerConfig(learning_rate=sft_cfg.learning_rate, warmup_steps=sft_cfg.warmup_steps, decay="cosine",
                          total_steps=sft_cfg.steps, max_grad_norm=1.0)
    objective = SFTObjective(model_cfg, context_weight=sft_cfg.context_loss_weight)
    runner = StageRunner(ctx, stage, model_cfg, params, objective, opt, total_steps=sft_cfg.steps,
                         micro_batches=sft_cfg.micro_batches, checkpoint=ctx.checkpoint, progress_keys=["sft/nll"],
                         data_config={"batch_size": sft_cfg.batch_size, "max_len": sft_cfg.max_len, "seed": seed,
                                      "num_examples": len(rows)})

    def batch_fn(step, _params):
        idx = batch_indices(len(rows), sft_cfg.batch_size, step, seed)
        batch = pad_rows([rows[i] for i in idx], buckets=buckets, max_len=sft_cfg.max_len)
        batch.pop("row_mask")
        n_tok = int(batch["attention_mask"].sum())
        return batch, {"sft/tokens": n_tok}

    return runner.run(batch_fn)
