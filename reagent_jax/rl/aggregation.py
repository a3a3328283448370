"""Reduce per-token losses to a scalar, exactly invariant to micro-batching.

verl's ``agg_loss`` modes, with the denominators passed in from the *global* batch. When every
micro-batch is normalised by the global token / sequence count, the sum of the micro-batch losses
(and of their gradients) equals the loss of the whole batch: gradient accumulation and data
parallelism then change nothing but memory use. When the counts are omitted they are taken from
the batch at hand, which is right only when that batch is the whole batch.

Modes (``m``: loss mask, ``l``: per-token loss, ``i`` sequences, ``t`` tokens), registered in
``AGG_MODES`` (``reagent_jax/registry.py``; register more with ``@AGG_MODES.register("name")``):
  token-mean               sum_it l*m / num_tokens
  seq-mean-token-mean      sum_i (sum_t l*m / max(sum_t m, 1)) / num_seqs
  seq-mean-token-sum       sum_it l*m / num_seqs
  seq-mean-token-sum-norm  sum_it l*m / (num_seqs * norm_length)      (Dr. GRPO's per-sequence mean)
  token-sum-norm           sum_it l*m / norm_length                   (verl's seq-mean-token-sum-norm)

Every mode here is linear in the per-token losses (trait ``linear=True``): the trainer then folds
it into per-token weights (`token_weights`) and sums weighted token losses chunk by chunk.

``norm_length`` defaults to ``T`` (the padded length, as verl's ``loss_scale_factor=None``); set it
to a constant (e.g. the max response length) when micro-batches are padded to different lengths.
Where the conventions differ from verl: verl's ``agg_loss("seq-mean-token-sum-norm")`` divides by
its ``loss_scale_factor`` only (here ``token-sum-norm``; it equals ours times num_seqs, so it also
scales the gradient with the batch size); a verl release between Dec 2025 and Jan 2026 divided by
both, as ``seq-mean-token-sum-norm`` does here.

``num_seqs`` counts sequences with at least one loss token: all-masked rows are padding and add
nothing to either numerator or denominator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from reagent_jax.registry import Registry

ArrayLike = jax.Array | float | int


class LossCounts(NamedTuple):
    """Denominators of a whole (global) batch, computed once before splitting it."""

    num_tokens: jax.Array  # [] float32, number of loss tokens
    num_seqs: jax.Array  # [] float32, number of rows with at least one loss token


def loss_counts(loss_mask: jax.Array) -> LossCounts:
    """Counts of a loss mask [B, T]; compute on the full batch and pass them to every micro-batch."""
    mask = jnp.asarray(loss_mask).astype(jnp.float32)  # [B, T]
    if mask.ndim != 2:
        raise ValueError(f"loss_mask must be [B, T], got shape {mask.shape}")
    return LossCounts(num_tokens=jnp.sum(mask), num_seqs=jnp.sum(jnp.any(mask > 0, axis=-1)).astype(jnp.float32))


def masked_sum(values: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
    """Sum of ``values`` where ``mask`` is set; NaN/inf outside the mask cannot leak in.

    Accumulates in at least float32: a bfloat16 sum over thousands of tokens is off by ~0.3%.
    """
    mask = jnp.asarray(mask).astype(bool)
    values = jnp.asarray(values)
    values = values.astype(jnp.promote_types(values.dtype, jnp.float32))
    return jnp.sum(jnp.where(mask, values, 0.0), axis=axis)


def masked_mean(values: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
    """Mean over masked entries; 0 where nothing is masked in (never NaN)."""
    total = masked_sum(values, mask, axis=axis)
    count = jnp.sum(jnp.asarray(mask).astype(jnp.float32), axis=axis)
    return total / jnp.maximum(count, 1.0)


def aggregate_loss(
    token_loss: jax.Array,  # [B, T]
    loss_mask: jax.Array,  # [B, T] (bool or 0/1)
    mode: str = "token-mean",
    *,
    global_num_tokens: ArrayLike | None = None,
    global_num_seqs: ArrayLike | None = None,
    norm_length: ArrayLike | None = None,
) -> jax.Array:  # [] scalar
    """Aggregate per-token losses with global denominators (see module docstring)."""
    aggregate = AGG_MODES.get(mode)
    if isinstance(norm_length, (int, float)) and not norm_length > 0:
        raise ValueError(f"norm_length must be > 0 (or None for the padded length T), got {norm_length}")
    if token_loss.ndim != 2 or token_loss.shape != jnp.shape(loss_mask):
        raise ValueError(
            f"token_loss and loss_mask must both be [B, T]; got {token_loss.shape} and {jnp.shape(loss_mask)}"
        )
    mask = jnp.asarray(loss_mask).astype(bool)  # [B, T]
    local = loss_counts(mask)
    num_tokens = local.num_tokens if global_num_tokens is None else jnp.asarray(global_num_tokens, jnp.float32)
    num_seqs = local.num_seqs if global_num_seqs is None else jnp.asarray(global_num_seqs, jnp.float32)
    length = token_loss.shape[-1] if norm_length is None else norm_length
    return aggregate(token_loss, mask, LossCounts(num_tokens, num_seqs), jnp.asarray(length, jnp.float32))


# (token_loss [B, T], mask [B, T] bool, global counts, norm_length []) -> [] scalar
AggregationFn = Callable[[jax.Array, jax.Array, LossCounts, jax.Array], jax.Array]
AGG_MODES: Registry[AggregationFn] = Registry("loss aggregation mode")


@AGG_MODES.register("token-mean", linear=True)
def token_mean(token_loss, mask, counts: LossCounts, norm_length):
    return masked_sum(token_loss, mask) / jnp.maximum(counts.num_tokens, 1.0)


@AGG_MODES.register("seq-mean-token-mean", linear=True)
def seq_mean_token_mean(token_loss, mask, counts: LossCounts, norm_length):
    seq_len = jnp.sum(mask.astype(jnp.float32), axis=-1)  # [B]
    return jnp.sum(masked_sum(token_loss, mask, axis=-1) / jnp.maximum(seq_len, 1.0)) / jnp.maximum(counts.num_seqs, 1.0)


@AGG_MODES.register("seq-mean-token-sum", linear=True)
def seq_mean_token_sum(token_loss, mask, counts: LossCounts, norm_length):
    return masked_sum(token_loss, mask) / jnp.maximum(counts.num_seqs, 1.0)


@AGG_MODES.register("seq-mean-token-sum-norm", linear=True)
def seq_mean_token_sum_norm(token_loss, mask, counts: LossCounts, norm_length):
    """Dr. GRPO's per-sequence mean of token sums over a constant length."""
    return masked_sum(token_loss, mask) / (jnp.maximum(counts.num_seqs, 1.0) * norm_length)


@AGG_MODES.register("token-sum-norm", linear=True)
def token_sum_norm(token_loss, mask, counts: LossCounts, norm_length):
    """verl's current ``seq-mean-token-sum-norm``: the token sum over its ``loss_scale_factor``
    (``norm_length``) only, not over the sequence count."""
    return masked_sum(token_loss, mask) / norm_length


def token_weights(loss_mask: jax.Array, mode: str = "token-mean", **counts) -> jax.Array:
    """Per-token weights [B, T] with aggregate_loss(l, mask, mode, **counts) == sum(weights * l) for
    every l: the mode's gradient, exact for the modes registered ``linear=True`` (a ValueError
    for others). Zero off the mask."""
    if not AGG_MODES.traits(mode).get("linear"):
        raise ValueError(f"loss aggregation mode {mode!r} is not registered linear=True; it has no token weights")
    zeros = jnp.zeros(jnp.shape(loss_mask), jnp.float32)
    return jax.grad(lambda l: aggregate_loss(l, loss_mask, mode, **counts))(zeros)
