"""Judge chains -> token rows, and the DPO stage on the shared train step.

Rows are rendered from the chains' text with the Qwen3 chat template (`mode="train"`), the way
TRL builds SFT / DPO data: loss only on the judge's answer. Per format (see `evalplanner.judge`):

  plan_execute   SFT: two rows per chain, plan prompt -> plan and execution prompt -> output.
                 DPO: the execution prompt (it contains the shared plan) -> chosen / rejected output.
  single_pass    one row: judge prompt -> output (plan, execution and verdict in one answer).
                 DPO pairs share the plan prefix, so only the executions differ.
  verdict_only   one row: verdict-only prompt -> bare verdict.

DPO uses precomputed reference logprobs: `reference_logps` runs the frozen start params once over
every pair before training (the paper's reference is the stage's initial model), so only one model
is in memory during the update. Sequences of chosen and rejected go through one forward pass as
[P, 2, T] (`rl.objectives.DPOObjective`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from reagent_jax import chat
from reagent_jax.evalplanner import prompts as P
from reagent_jax.evalplanner.judge import FORMATS, PairItem, final_messages
from reagent_jax.rl.objectives import DPOObjective, sequence_logps
from reagent_jax.rl.stage_config import BatchStageConfig, DPOConfig, SFTConfig
from reagent_jax.rl.train_step import OptimizerConfig
from reagent_jax.trainers.batching import default_buckets, pad_rows
from reagent_jax.trainers.sft import batch_indices
from reagent_jax.trainers.stage import StageRunner
from reagent_jax.typed_config import Problem, in_range

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SeedJudgeConfig(SFTConfig):
    """config.seed_judge: SFT of the seed judge on a scripted teacher's chains (synthetic pairs)."""
    formats: str = ""               # comma-separated judge formats to train on; "" = config.judge.format
    teacher_error_rate: float = 0.0  # how often the teacher's verdict is wrong

    def problems(self) -> list[Problem]:
        unknown = [f for f in self.formats.split(",") if f.strip() and f.strip() not in FORMATS]
        return (super().problems() + in_range(self, "teacher_error_rate", 0.0, 1.0)
                + ([("formats", f"unknown {', '.join(unknown)}; use names from {', '.join(FORMATS)}")] if unknown else []))


def _row(tok, messages, answer: str, enable_thinking: bool) -> dict[str, list[int]]:
    r = chat.render(tok, list(messages) + [{"role": "assistant", "content": answer}], mode="train",
                    enable_thinking=enable_thinking)
    return {"tokens": list(r.ids), "loss_mask": list(r.loss_mask)}


def _item(rec: Mapping[str, Any]) -> PairItem:
    return PairItem(rec["instruction"], rec["response_a"], rec["response_b"])


def sft_rows(tok, records: Sequence[Mapping[str, Any]], fmt: str, *, enable_thinking: bool = False,
             max_len: int | None = None) -> list[dict]:
    """SFT rows of chain records {"instruction", "response_a", "response_b", "plan", "output"}."""
    rows, dropped = [], 0
    for rec in records:
        item = _item(rec)
        new = [_row(tok, final_messages(fmt, item, rec["plan"]), rec["output"], enable_thinking)]
        if fmt == "plan_execute":
            new.insert(0, _row(tok, P.plan_messages(item.instruction), rec["plan"], enable_thinking))
        for r in new:
            if max_len is not None and len(r["tokens"]) > max_len:
                dropped += 1
            else:
                rows.append(r)
    if dropped:
        log.warning("judge SFT: dropped %d rows longer than max_len=%s", dropped, max_len)
    return rows


def dpo_rows(tok, pairs: Sequence[Mapping[str, Any]], fmt: str, *, enable_thinking: bool = False,
             max_len: int | None = None) -> list[dict]:
    """[{"chosen": row, "rejected": row}] from pair records (see `pairs.build_preference_data`)."""
    out, dropped = [], 0
    for rec in pairs:
        msgs = final_messages(fmt, _item(rec), rec["plan"])
        c, r = _row(tok, msgs, rec["chosen"], enable_thinking), _row(tok, msgs, rec["rejected"], enable_thinking)
        if max_len is not None and max(len(c["tokens"]), len(r["tokens"])) > max_len:
            dropped += 1
            continue
        out.append({"chosen": c, "rejected": r})
    if dropped:
        log.warning("judge DPO: dropped %d of %d pairs longer than max_len=%s", dropped, len(pairs), max_len)
    return out


def _pair_batch(pairs: Sequence[dict], batch_pairs: int, buckets, max_len: int) -> dict:
    """[P, 2, T] arrays (chosen at index 0) with pair_mask; missing pairs are zero padding."""
    flat = [x for p in pairs for x in (p["chosen"], p["rejected"])]
    b = pad_rows(flat, buckets=buckets, batch_size=2 * batch_pairs, max_len=max_len)
    t = b["tokens"].shape[1]
    out = {k: b[k].reshape(batch_pairs, 2, t) for k in ("tokens", "attention_mask", "loss_mask")}
    out["pair_mask"] = b["row_mask"][0::2].astype(np.float32)
    return out


def reference_logps(model_cfg, params, pairs: Sequence[dict], *, batch_pairs: int, max_len: int,
                    mesh=None) -> np.ndarray:
    """[N, 2] summed logprobs of chosen / rejected answers under `params` (the frozen reference)."""
    buckets = default_buckets(max_len)
    fn = jax.jit(lambda p, tokens, am, lm: sequence_logps(model_cfg, p, tokens, am, lm, mesh=mesh))
    out = np.zeros((len(pairs), 2), np.float32)
    for s in range(0, len(pairs), batch_pairs):
        chunk = pairs[s:s + batch_pairs]
        b = _pair_batch(chunk, batch_pairs, buckets, max_len)
        t = b["tokens"].shape[-1]
        lp = fn(params, b["tokens"].reshape(-1, t), b["attention_mask"].reshape(-1, t), b["loss_mask"].reshape(-1, t))
        out[s:s + len(chunk)] = np.asarray(lp).reshape(-1, 2)[:len(chunk)]
    return out


def _pairs_key(pairs: Sequence[dict], max_len: int) -> str:
    """Fingerprint of the pairs (and the truncation length) the cached reference logprobs belong to."""
    digest = hashlib.sha256(str(max_len).encode())
    for pair in pairs:
        for row in (pair["chosen"], pair["rejected"]):
            for name in ("tokens", "loss_mask"):
                values = np.asarray(row[name], np.int64)
                digest.update(f"{name}{values.size};".encode() + values.tobytes())
    return digest.hexdigest()


def _cached_reference(path: str, key: str, n_pairs: int):
    """The cached [P, 2] reference logprobs if they belong to these pairs, else None. A file cut by
    a kill, or written for other pairs (same count, new data), is recomputed, not trusted."""
    if not os.path.exists(path):
        return None
    try:
        with open(path + ".key") as f:
            stored = f.read().strip()
        ref = np.load(path)
    except (OSError, ValueError, EOFError) as exc:
        log.warning("%s is unreadable (%s); recomputing the reference logprobs", path, exc)
        return None
    if stored != key or ref.shape != (n_pairs, 2):
        log.info("%s belongs to other pairs; recomputing the reference logprobs", path)
        return None
    return ref


def _save_reference(path: str, key: str, ref: np.ndarray) -> None:
    """Atomic (temp file + rename), the key last: a kill leaves either no cache or a whole one."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(path + ".key")
    with open(path + ".tmp", "wb") as f:
        np.save(f, ref)
    os.replace(path + ".tmp", path)
    with open(path + ".key.tmp", "w") as f:
        f.write(key)
    os.replace(path + ".key.tmp", path + ".key")


def run_dpo(ctx, model_cfg, params, pairs: Sequence[dict], dpo_cfg: DPOConfig, stage: str, seed: int = 0):
    """Trains `dpo_cfg.steps` steps of DPO from `params` (also the reference); returns the final
    params (saved under <stage>/final). Reference logprobs are cached in <stage>/ref_logps.npy."""
    dpo_cfg = DPOConfig.from_config(dpo_cfg, stage)
    if not pairs:
        raise ValueError(f"{stage}: no DPO pairs (every group was all-correct or all-wrong, or all were dropped)")
    bsz = dpo_cfg.batch_size
    key = _pairs_key(pairs, dpo_cfg.max_len)
    path = os.path.join(ctx.stage_dir(stage), "ref_logps.npy")
    ref = _cached_reference(path, key, len(pairs))
    if ref is None:
        ref = reference_logps(model_cfg, params, pairs, batch_pairs=bsz, max_len=dpo_cfg.max_len, mesh=ctx.mesh)
        _save_reference(path, key, ref)
    opt = OptimizerConfig(learning_rate=dpo_cfg.learning_rate, warmup_steps=dpo_cfg.warmup_steps, decay="cosine",
                          total_steps=dpo_cfg.steps, max_grad_norm=1.0)
    objective = DPOObjective(model_cfg, loss_type=dpo_cfg.loss_type, beta=dpo_cfg.beta,
                             label_smoothing=dpo_cfg.label_smoothing, nll_coef=dpo_cfg.nll_coef)
    runner = StageRunner(ctx, stage, model_cfg, params, objective, opt, total_steps=dpo_cfg.steps,
                         micro_batches=dpo_cfg.micro_batches, checkpoint=ctx.checkpoint, progress_keys=["dpo/loss", "rewards/accuracies"],
                         data_config={"num_pairs": len(pairs), "pairs_sha256": key[:16], "batch_size": bsz,
                                      "seed": seed})
    buckets = default_buckets(dpo_cfg.max_len)

    def batch_fn(step, _params):
        idx = batch_indices(len(pairs), bsz, step, seed)
        batch = _pair_batch([pairs[i] for i in idx], bsz, buckets, dpo_cfg.max_len)
        batch["ref_logps"] = np.zeros((bsz, 2), np.float32)
        batch["ref_logps"][:len(idx)] = ref[idx]
        return batch, {"dpo/pairs_in_batch": len(idx)}

    return runner.run(batch_fn)


def fit_batch(cfg: BatchStageConfig, n_rows: int) -> BatchStageConfig:
    """A copy of an SFT / DPO config whose batch size does not exceed the data (tiny runs).

    A shrunk batch stays a multiple of `micro_batches` (rounded down) so each micro-batch keeps at
    most its configured size: micro-batches exist to bound memory, so they are never merged into
    one; only a batch smaller than `micro_batches` gets one row per micro-batch."""
    size, mb = max(1, min(cfg.batch_size, n_rows)), cfg.micro_batches
    if size % mb:
        fitted = (size - size % mb, mb) if size >= mb else (size, size)
        log.warning("batch_size %d with micro_batches=%d does not fit %d rows; using batch_size %d in %d "
                    "micro-batch(es)", cfg.batch_size, mb, n_rows, *fitted)
        size, mb = fitted
    return dataclasses.replace(cfg, batch_size=size, micro_batches=mb)
