"""The functional surface over the Qwen3 modules: init, forward, cached forward, token logprobs.

All functions take `(cfg, params, ...)`, are pure, and are jitted with `cfg`, `mesh` and `rules`
static (`token_loss_and_logprobs` runs inside the caller's jit). Logprobs are computed from hidden
states in chunks along time (`logprob_head`), so neither the forward nor the backward pass ever
holds `[B, T, V]` logits for the whole batch.
"""
from __future__ import annotations

import functools
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from reagent_jax.kernels.xla_attention import attention_mask
from reagent_jax.models.config import Qwen3Config
from reagent_jax.models.logprob_head import (HeadSpec, TokenLossFn, chunked_logprobs, chunked_top_logprobs,
                                             fused_head_loss, head_weight_key)
from reagent_jax.models.qwen3 import Qwen3
from reagent_jax.parallel.rules import DEFAULT_RULES, Rules, tree_shardings


def _boxed_shapes(cfg: Qwen3Config):
    model = Qwen3(cfg)
    tok = jnp.zeros((1, 1), jnp.int32)
    mask = jnp.ones((1, 1, 1), bool)
    return jax.eval_shape(lambda r: model.init(r, tok, tok, mask)["params"], jax.random.PRNGKey(0))


def param_axes(cfg: Qwen3Config):
    """Pytree (same structure as params) of logical axis-name tuples."""
    return jax.tree.map(lambda b: tuple(b.names), _boxed_shapes(cfg),
                        is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))


def param_shapes(cfg: Qwen3Config):
    """Pytree of jax.ShapeDtypeStruct for the params (no allocation)."""
    return nn.unbox(_boxed_shapes(cfg))


def param_shardings(cfg: Qwen3Config, mesh: Mesh, rules: Rules = DEFAULT_RULES):
    return tree_shardings(mesh, param_axes(cfg), param_shapes(cfg), rules)


def init_params(cfg: Qwen3Config, rng: jax.Array, mesh: Optional[Mesh] = None, rules: Rules = DEFAULT_RULES):
    """Random params (normal 0.02), created directly with their shardings when a mesh is given."""
    model = Qwen3(cfg)
    tok = jnp.zeros((1, 1), jnp.int32)
    mask = jnp.ones((1, 1, 1), bool)
    init = lambda r: nn.unbox(model.init(r, tok, tok, mask)["params"])
    if mesh is None:
        return jax.jit(init)(rng)
    return jax.jit(init, out_shardings=param_shardings(cfg, mesh, rules))(rng)


def default_positions(attention_mask_2d: Optional[jax.Array], shape) -> jax.Array:
    """Positions that skip left padding: cumsum(mask) - 1 (arange without a mask)."""
    if attention_mask_2d is None:
        return jnp.broadcast_to(jnp.arange(shape[1], dtype=jnp.int32), shape)
    return jnp.maximum(jnp.cumsum(attention_mask_2d.astype(jnp.int32), axis=1) - 1, 0)


def _inputs(tokens, attn, positions):
    tokens = jnp.asarray(tokens, jnp.int32)
    if positions is None:
        positions = default_positions(attn, tokens.shape)
    key_valid = jnp.ones(tokens.shape, bool) if attn is None else jnp.asarray(attn).astype(bool)
    q_index = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    return tokens, positions, attention_mask(q_index, key_valid)


@functools.partial(jax.jit, static_argnames=("cfg", "mesh", "rules"))
def forward(cfg: Qwen3Config, params, tokens: jax.Array, attention_mask: Optional[jax.Array] = None,
            positions: Optional[jax.Array] = None, *, mesh: Optional[Mesh] = None,
            rules: Rules = DEFAULT_RULES) -> jax.Array:
    """tokens [B, T] -> logits [B, T, V] float32.

    attention_mask [B, T] (1 = real token) handles left or right padding; positions default to
    cumsum(mask) - 1 so left-padded rows get the same positions as unpadded ones.
    """
    tokens, positions, mask = _inputs(tokens, attention_mask, positions)
    logits, _ = Qwen3(cfg, mesh, rules).apply({"params": params}, tokens, positions, mask)
    return logits


@functools.partial(jax.jit, static_argnames=("cfg", "mesh", "rules", "return_hidden"), donate_argnames=("cache",))
def forward_with_cache(cfg: Qwen3Config, params, tokens: jax.Array, cache, write_index: jax.Array,
                       slot_ids: Optional[jax.Array] = None, *, mesh: Optional[Mesh] = None,
                       rules: Rules = DEFAULT_RULES, return_hidden: bool = False):
    """Appends tokens [B, T] to a KV cache and returns (logits [B, T, V] fp32, cache).

    cache = (k, v), each `kv_layout.cache_shape` (e.g. [L, N, K, S, D] on CPU; N cache rows >= B). Row b
    of `tokens` belongs to cache row slot_ids[b] (default b); its tokens land at write_index[b] + t and attend to every cached
    position <= their own (positions = cache indices). Writes past S are dropped: give padding
    rows write_index >= S. The cache is donated (updated in place). return_hidden gives the final
    hidden states [B, T, E] instead of logits (for the sampler's own projection).
    """
    tokens = jnp.asarray(tokens, jnp.int32)
    t = tokens.shape[1]
    positions = write_index[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
    q_index = jnp.broadcast_to(jnp.arange(t), tokens.shape)
    mask = attention_mask(q_index, jnp.ones(tokens.shape, bool))  # causal among the new tokens
    return Qwen3(cfg, mesh, rules).apply({"params": params}, tokens, positions, mask, cache, write_index,
                                         slot_ids, return_hidden=return_hidden)


@functools.partial(jax.jit, static_argnames=("cfg", "chunk_size", "mesh", "rules", "return_entropy"))
def token_logprobs(cfg: Qwen3Config, params, tokens: jax.Array, attention_mask: Optional[jax.Array] = None,
                   positions: Optional[jax.Array] = None, *, temperature: float = 1.0, chunk_size: int = 256,
                   mesh: Optional[Mesh] = None, rules: Rules = DEFAULT_RULES, return_entropy: bool = False):
    """Per-token logprobs aligned with `tokens`: out[b, t] = log p_T(tokens[b, t] | tokens[b, :t]).

    out[:, 0] = 0 (no context). p_T is softmax(logits / temperature) over the full vocabulary,
    *before* any top-k / top-p truncation: the same definition the rollout engine reports, so
    rollout and trainer logprobs agree. With return_entropy, also returns the entropy of the
    predictive distribution at t-1 (aligned the same way). Differentiable; logits are computed
    in chunks of `chunk_size` time steps and rematerialised in the backward pass.
    """
    spec = HeadSpec(cfg, temperature, chunk_size, mesh, rules, return_entropy)
    tokens, h = _hidden(cfg, params, tokens, attention_mask, positions, mesh, rules)
    lp, ent = chunked_logprobs(spec, params[head_weight_key(cfg)], h[:, :-1], tokens[:, 1:])
    lp = _from_position_1(lp)
    return (lp, _from_position_1(ent)) if return_entropy else lp


@functools.partial(jax.jit, static_argnames=("cfg", "k", "chunk_size", "mesh", "rules"))
def top_logprobs(cfg: Qwen3Config, params, tokens: jax.Array, attention_mask: Optional[jax.Array] = None,
                 positions: Optional[jax.Array] = None, *, k: int, temperature: float = 1.0, chunk_size: int = 256,
                 mesh: Optional[Mesh] = None, rules: Rules = DEFAULT_RULES) -> tuple[jax.Array, jax.Array]:
    """The k most likely tokens at every position, aligned as `token_logprobs`: (logprobs [B, T, k],
    ids [B, T, k]) where row t ranks the candidates for tokens[:, t] given tokens[:, :t], best first
    (row 0, which has no context, is zeros). Same distribution as the engine's logprobs: softmax of
    logits / temperature over the full vocabulary, before truncation."""
    spec = HeadSpec(cfg, temperature, chunk_size, mesh, rules, False)
    tokens, h = _hidden(cfg, params, tokens, attention_mask, positions, mesh, rules)
    lp, ids = chunked_top_logprobs(spec, params[head_weight_key(cfg)], h[:, :-1], k)
    pad = lambda x: jnp.concatenate([jnp.zeros((x.shape[0], 1, k), x.dtype), x], axis=1)
    return pad(lp), pad(ids)


def token_loss_and_logprobs(cfg: Qwen3Config, params, tokens: jax.Array, attention_mask: Optional[jax.Array],
                            token_loss: TokenLossFn, aux: Any = None, *, positions: Optional[jax.Array] = None,
                            temperature: float = 1.0, chunk_size: int = 256, mesh: Optional[Mesh] = None,
                            rules: Rules = DEFAULT_RULES, return_entropy: bool = False):
    """(loss, logprobs [B, T], entropies [B, T] or None) for a loss that is a sum of per-token terms:
    loss = token_loss(lp, ent, aux) summed over chunks of time, with lp and ent aligned as
    `token_logprobs` gives them and `aux` a pytree of [B, T, ...] arrays aligned with `tokens` and
    chunked alongside (old logprobs, advantages, aggregation weights).

    The head's gradient is taken in the forward pass (`logprob_head.fused_head_loss`: 3 output
    projections per token instead of the rematerialised path's 4), so only `loss` is
    differentiable: the logprobs and entropies are for metrics and carry no gradient. Call inside
    `jax.jit` (token_loss is a Python function)."""
    spec = HeadSpec(cfg, temperature, chunk_size, mesh, rules, return_entropy)
    tokens, h = _hidden(cfg, params, tokens, attention_mask, positions, mesh, rules)
    shifted = jax.tree.map(lambda a: a[:, 1:], aux)
    loss, lp, ent = fused_head_loss(spec, token_loss, h[:, :-1], params[head_weight_key(cfg)], tokens[:, 1:],
                                    shifted)
    # Position 0 predicts nothing (logprob and entropy 0); its term is a constant, added for exact values.
    zero = jnp.zeros((tokens.shape[0], 1), jnp.float32)
    loss = loss + token_loss(zero, zero if return_entropy else None, jax.tree.map(lambda a: a[:, :1], aux))
    lp, ent = jax.lax.stop_gradient((_from_position_1(lp), None if ent is None else _from_position_1(ent)))
    return loss, lp, ent


def _hidden(cfg, params, tokens, attention_mask, positions, mesh, rules):
    """(tokens as int32 [B, T], final hidden states [B, T, E])."""
    tokens, pos, mask = _inputs(tokens, attention_mask, positions)
    h, _ = Qwen3(cfg, mesh, rules).apply({"params": params}, tokens, pos, mask, return_hidden=True)
    return tokens, h


def _from_position_1(x: jax.Array) -> jax.Array:
    """Values for positions 1..T-1 [B, T-1] -> [B, T] with position 0 (no context) = 0."""
    return jnp.concatenate([jnp.zeros((x.shape[0], 1), x.dtype), x], axis=1)
