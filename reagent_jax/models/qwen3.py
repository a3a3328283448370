"""Dense Qwen3 decoder as Flax (linen) modules used functionally: `params` is a plain pytree.

Features: GQA, per-head RMSNorm on q and k, RoPE (rotate-half, HF layout), SwiGLU MLP, tied or
untied embeddings, separate param/compute dtypes, `nn.scan` over layers (unrolled when
`scan_layers=False`, so the param layout is the same), remat policies, logical axis names on every
parameter (via `nn.with_logical_partitioning`) and activation (via `parallel.constrain`).

One code path serves training and sampling: with `cache=(k, v)` (each [L, B, S, K, D]) the new
tokens' keys/values are scattered into the cache at `cache_index[b] + t` and attention runs over
the whole cache, causally by absolute position. Rows of a batch may hold different lengths.

Einsum letters: b batch, t query time, s key time, e embed, h q heads, k kv heads, g q heads per
kv head, d head dim, f mlp, v vocab, l layers.
"""
from __future__ import annotations

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from reagent_jax.models.config import Qwen3Config
from reagent_jax.parallel.rules import DEFAULT_RULES, Rules, constrain

_NEG = -1e30  # finite "minus infinity": fully masked (padding) rows stay finite


def _init(axes, std=0.02):
    return nn.with_logical_partitioning(nn.initializers.normal(std), axes)


class RMSNorm(nn.Module):
    dim: int
    eps: float
    param_dtype: Any
    axis: str = "norm"

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, (self.axis,)),
                           (self.dim,), self.param_dtype)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * scale.astype(jnp.float32)).astype(x.dtype)


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding, HF `rotate_half` layout. x [b, t, n, d], positions [b, t]."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))  # [d/2]
    ang = positions.astype(jnp.float32)[..., None] * inv_freq  # [b, t, d/2]
    cos, sin = jnp.cos(ang)[:, :, None, :], jnp.sin(ang)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., : d // 2], x32[..., d // 2:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def attention_mask(q_index: jax.Array, key_valid: jax.Array) -> jax.Array:
    """[b, t, s] boolean: key s visible to query t (causal by absolute index, valid keys only).

    q_index [b, t] is the absolute index of each query; key_valid [b, s].
    """
    s_idx = jnp.arange(key_valid.shape[1])
    return (s_idx[None, None, :] <= q_index[:, :, None]) & key_valid[:, None, :].astype(bool)


class Attention(nn.Module):
    cfg: Qwen3Config
    mesh: Optional[Mesh] = None
    rules: Rules = DEFAULT_RULES

    @nn.compact
    def __call__(self, x, positions, mask, layer_cache=None, write_index=None, slot_ids=None):
        """x [b,t,e]; positions [b,t]; mask [b,t,s]; layer_cache (k, v) [n,S,k,d] or None.

        With a cache, row b of x belongs to cache row slot_ids[b] (default b): its keys/values are
        written at write_index[b] + t (writes past S are dropped, which is how padding rows of a
        bucketed batch stay harmless) and it attends over that cache row.
        """
        c = self.cfg
        dt, pdt = c.jnp_dtype, c.jnp_param_dtype
        wq = self.param("q", _init(("embed", "q_heads", "head_dim")), (c.hidden_size, c.num_heads, c.head_dim), pdt)
        wk = self.param("k", _init(("embed", "kv_heads", "head_dim")), (c.hidden_size, c.num_kv_heads, c.head_dim), pdt)
        wv = self.param("v", _init(("embed", "kv_heads", "head_dim")), (c.hidden_size, c.num_kv_heads, c.head_dim), pdt)
        wo = self.param("o", _init(("q_heads", "head_dim", "embed")), (c.num_heads, c.head_dim, c.hidden_size), pdt)
        xd = x.astype(dt)
        q = jnp.einsum("bte,ehd->bthd", xd, wq.astype(dt))
        k = jnp.einsum("bte,ekd->btkd", xd, wk.astype(dt))
        v = jnp.einsum("bte,ekd->btkd", xd, wv.astype(dt))
        q = RMSNorm(c.head_dim, c.rms_norm_eps, pdt, axis="head_dim", name="q_norm")(q)
        k = RMSNorm(c.head_dim, c.rms_norm_eps, pdt, axis="head_dim", name="k_norm")(k)
        q, k = rope(q, positions, c.rope_theta), rope(k, positions, c.rope_theta)
        q = constrain(q, ("batch", "act_len", "act_heads", None), self.mesh, self.rules)
        k = constrain(k, ("batch", "act_len", "act_kv_heads", None), self.mesh, self.rules)

        new_cache = None
        if layer_cache is not None:
            ck, cv = layer_cache  # [n, S, k, d]
            rows = jnp.arange(x.shape[0]) if slot_ids is None else slot_ids  # [b]
            t_idx = write_index[:, None] + jnp.arange(x.shape[1])[None, :]  # [b, t]; OOB writes drop
            ck = ck.at[rows[:, None], t_idx].set(k.astype(ck.dtype), mode="drop")
            cv = cv.at[rows[:, None], t_idx].set(v.astype(cv.dtype), mode="drop")
            new_cache = (ck, cv)
            if slot_ids is None:
                k, v = ck.astype(dt), cv.astype(dt)
            else:
                k, v = ck[rows].astype(dt), cv[rows].astype(dt)  # [b, S, k, d]

        b, t = q.shape[:2]
        qg = q.reshape(b, t, c.num_kv_heads, c.num_groups, c.head_dim)
        scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32)
        scores = scores * (c.head_dim ** -0.5)
        scores = jnp.where(mask[:, None, None, :, :], scores, _NEG)
        probs = jax.nn.softmax(scores, axis=-1).astype(dt)
        out = jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(b, t, c.num_heads, c.head_dim)
        out = constrain(out, ("batch", "act_len", "act_heads", None), self.mesh, self.rules)
        y = jnp.einsum("bthd,hde->bte", out, wo.astype(dt))
        return y, new_cache


class MLP(nn.Module):
    cfg: Qwen3Config
    mesh: Optional[Mesh] = None
    rules: Rules = DEFAULT_RULES

    @nn.compact
    def __call__(self, x):
        c = self.cfg
        dt, pdt = c.jnp_dtype, c.jnp_param_dtype
        wg = self.param("gate", _init(("embed", "mlp")), (c.hidden_size, c.intermediate_size), pdt)
        wu = self.param("up", _init(("embed", "mlp")), (c.hidden_size, c.intermediate_size), pdt)
        wd = self.param("down", _init(("mlp", "embed")), (c.intermediate_size, c.hidden_size), pdt)
        xd = x.astype(dt)
        h = jax.nn.silu(xd @ wg.astype(dt)) * (xd @ wu.astype(dt))  # [b, t, f]
        h = constrain(h, ("batch", "act_len", "act_mlp"), self.mesh, self.rules)
        return h @ wd.astype(dt)


class DecoderLayer(nn.Module):
    """One pre-norm block. Scan-compatible: (carry, broadcast inputs) -> (carry, None)."""
    cfg: Qwen3Config
    mesh: Optional[Mesh] = None
    rules: Rules = DEFAULT_RULES

    @nn.compact
    def __call__(self, carry, positions, mask, write_index, slot_ids):
        x, cache, layer = carry  # cache: None or (k_all, v_all) [l, b, S, k, d]
        c = self.cfg
        layer_cache = None
        if cache is not None:
            layer_cache = (cache[0][layer], cache[1][layer])
        h = RMSNorm(c.hidden_size, c.rms_norm_eps, c.jnp_param_dtype, name="input_norm")(x)
        a, new_layer_cache = Attention(c, self.mesh, self.rules, name="attn")(h, positions, mask, layer_cache, write_index, slot_ids)
        x = x + a.astype(x.dtype)
        h = RMSNorm(c.hidden_size, c.rms_norm_eps, c.jnp_param_dtype, name="post_attn_norm")(x)
        x = x + MLP(c, self.mesh, self.rules, name="mlp")(h).astype(x.dtype)
        x = constrain(x, ("batch", "act_len", "act_embed"), self.mesh, self.rules)
        if cache is not None:
            cache = (jax.lax.dynamic_update_index_in_dim(cache[0], new_layer_cache[0], layer, 0),
                     jax.lax.dynamic_update_index_in_dim(cache[1], new_layer_cache[1], layer, 0))
        return (x, cache, layer + 1), None


_REMAT = {
    "full": None,
    "dots_saveable": jax.checkpoint_policies.checkpoint_dots,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


class Qwen3(nn.Module):
    """Token ids -> hidden states or fp32 logits (and the updated KV cache when one is given)."""
    cfg: Qwen3Config
    mesh: Optional[Mesh] = None
    rules: Rules = DEFAULT_RULES

    def setup(self):
        c = self.cfg
        self.embedding = self.param("embed", _init(("vocab", "embed")), (c.vocab_size, c.hidden_size),
                                    c.jnp_param_dtype)
        layer_cls = DecoderLayer
        if c.remat_policy != "none":
            layer_cls = nn.remat(DecoderLayer, policy=_REMAT[c.remat_policy], prevent_cse=False)
        self.layers = nn.scan(
            layer_cls, variable_axes={"params": 0}, split_rngs={"params": True},
            in_axes=(nn.broadcast,) * 4, length=c.num_layers,
            unroll=1 if c.scan_layers else c.num_layers,
            metadata_params={nn.PARTITION_NAME: "layers"})(c, self.mesh, self.rules, name="layers")
        self.final_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.jnp_param_dtype)
        if not c.tie_word_embeddings:
            self.lm_head = self.param("lm_head", _init(("embed", "vocab")), (c.hidden_size, c.vocab_size),
                                      c.jnp_param_dtype)

    def output_matrix(self) -> jax.Array:
        """[e, v] projection (the transposed embedding when tied)."""
        return self.embedding.T if self.cfg.tie_word_embeddings else self.lm_head

    def __call__(self, tokens, positions, mask, cache=None, write_index=None, slot_ids=None,
                 return_hidden=False):
        c = self.cfg
        x = jnp.take(self.embedding, tokens, axis=0).astype(c.jnp_dtype)  # [b, t, e]
        x = constrain(x, ("batch", "act_len", "act_embed"), self.mesh, self.rules)
        (x, cache, _), _ = self.layers((x, cache, jnp.int32(0)), positions, mask, write_index, slot_ids)
        h = self.final_norm(x)
        if return_hidden:
            return h, cache
        logits = jnp.einsum("bte,ev->btv", h.astype(c.jnp_dtype), self.output_matrix().astype(c.jnp_dtype),
                            preferred_element_type=jnp.float32)
        logits = constrain(logits, ("batch", "act_len", "act_vocab"), self.mesh, self.rules)
        return logits, cache

    def project(self, h):
        """Hidden [.., e] -> fp32 logits [.., v]; used by chunked logprobs."""
        c = self.cfg
        return jnp.einsum("...e,ev->...v", h.astype(c.jnp_dtype), self.output_matrix().astype(c.jnp_dtype),
                          preferred_element_type=jnp.float32)
