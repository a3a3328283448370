"""The functional surface over the Qwen3 modules: init, forward, cached forward, token logprobs.

All functions take `(cfg, params, ...)`, are pure, and are jitted with `cfg`, `mesh` and `rules`
static. Logprobs are computed from hidden states in chunks along time with rematerialisation, so
neither the forward nor the backward pass ever holds `[B, T, V]` logits for the whole batch.
"""
from __future__ import annotations

import functools
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from reagent_jax.kernels.xla_attention import attention_mask
from reagent_jax.models.config import Qwen3Config
from reagent_jax.models.qwen3 import Qwen3
from reagent_jax.parallel.rules import DEFAULT_RULES, Rules, constrain, tree_shardings


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


def _vocab_parallel_head(cfg: Qwen3Config, params, mesh: Optional[Mesh], rules: Rules):
    """params with the output projection's weight cast to the compute dtype and split over the
    vocabulary (`logits_vocab`), once for all chunks: the chunks then all-gather only their
    hidden rows ([B, C, E], small) instead of the whole head, and the head's gradient stays
    vocabulary-sharded until it is reduced into the params' layout once. None without a mesh."""
    if mesh is None or mesh.size == 1:
        return None
    key, axes = ("embed", ("logits_vocab", None)) if cfg.tie_word_embeddings else ("lm_head", (None, "logits_vocab"))
    return {**params, key: constrain(params[key].astype(cfg.jnp_dtype), axes, mesh, rules)}


def _chunked_logprobs(cfg, params, h, targets, temperature, chunk_size, mesh, rules, with_entropy):
    """h [B, T, E], targets [B, T] -> (logprob of targets [B, T], entropy [B, T] or None).

    On a mesh the projection and the log-softmax run vocabulary-parallel (`_vocab_parallel_head`):
    logits [B, C, V / shards] per chip, the normaliser, target logit and entropy reduced over the
    vocabulary shards as [B, C] partial sums."""
    b, t, e = h.shape
    c = min(chunk_size, t)
    n = -(-t // c)
    pad = n * c - t
    h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    hs = h.reshape(b, n, c, e).swapaxes(0, 1)  # [n, B, C, E]
    ts = targets.reshape(b, n, c).swapaxes(0, 1)  # [n, B, C]
    model = Qwen3(cfg, mesh, rules)
    head = _vocab_parallel_head(cfg, params, mesh, rules)
    head_params = params if head is None else head

    def target_logit(logits, tc):
        if head is None:
            return jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0]
        # a masked sum reduces over the vocabulary shards; a gather would collect the logits first
        vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
        return jnp.sum(jnp.where(vocab == tc[..., None], logits, 0.0), axis=-1)

    @jax.checkpoint
    def one(hc, tc):
        if head is not None:
            hc = constrain(hc, ("logits_batch", None, None), mesh, rules)
        logits = model.apply({"params": head_params}, hc, method=Qwen3.project) / temperature  # [B, C, V]
        if head is not None:
            logits = constrain(logits, ("logits_batch", None, "logits_vocab"), mesh, rules)
        if not with_entropy:
            lse = jax.nn.logsumexp(logits, axis=-1)
            return target_logit(logits, tc) - lse, jnp.zeros(tc.shape)
        # One exp pass feeds both the normaliser and the entropy (H = lse - E_p[logits]).
        m = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
        e = jnp.exp(logits - m)
        z = jnp.sum(e, axis=-1)
        lse = m[..., 0] + jnp.log(z)
        lp = target_logit(logits, tc) - lse
        ent = jnp.log(z) - jnp.sum(e * (logits - m), axis=-1) / z  # relative to m: no lse-sized cancellation
        return lp, ent

    lp, ent = jax.lax.map(lambda a: one(*a), (hs, ts))  # [n, B, C]
    lp = lp.swapaxes(0, 1).reshape(b, n * c)[:, :t]
    ent = ent.swapaxes(0, 1).reshape(b, n * c)[:, :t]
    return lp, (ent if with_entropy else None)


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
    tokens, pos, mask = _inputs(tokens, attention_mask, positions)
    h, _ = Qwen3(cfg, mesh, rules).apply({"params": params}, tokens, pos, mask, return_hidden=True)
    lp, ent = _chunked_logprobs(cfg, params, h[:, :-1], tokens[:, 1:], temperature, chunk_size, mesh, rules,
                                return_entropy)
    zero = jnp.zeros((tokens.shape[0], 1), jnp.float32)
    lp = jnp.concatenate([zero, lp], axis=1)
    if return_entropy:
        return lp, jnp.concatenate([zero, ent], axis=1)
    return lp
