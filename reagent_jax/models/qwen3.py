"""Dense Qwen3 / Qwen2 / Llama decoder as Flax (linen) modules used functionally: `params` is a
plain pytree.

Features: GQA, per-head RMSNorm on q and k (Qwen3) or q/k/v biases (Qwen2; Llama with
attention_bias), RoPE (rotate-half, HF layout), SwiGLU MLP, tied or untied embeddings, separate
param/compute dtypes, `nn.scan` over layers (unrolled when `scan_layers=False`, so the param
layout is the same), remat policies, logical axis names on every parameter (via
`nn.with_logical_partitioning`) and activation (via `parallel.constrain`).

One code path serves training and sampling: with `cache=(k, v)` (each [L, B, K, S, D] on CPU,
[L, B, S, K, D] on accelerators: `kernels.kv_layout`) the new tokens' keys/values are scattered
into the cache at `cache_index[b] + t` and attention runs over the cache, causally by absolute
position. Rows of a batch may hold different lengths. A paged pool with its block table,
`cache=(k, v, pages)` (`kernels.kv_pages`), takes one new token per slot (decode). How each matmul, attention and projection
runs on the mesh's devices is the kernel seam's choice (`reagent_jax.kernels`), not this module's.

Einsum letters: b batch, t time, e embed, h q heads, k kv heads, d head dim, f mlp, v vocab.
"""
from __future__ import annotations

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from reagent_jax.kernels import attention, kv_layout, kv_pages, logits, matmul
from reagent_jax.kernels.attention import LayerCache
from reagent_jax.models.config import Qwen3Config
from reagent_jax.models.rope import rope
from reagent_jax.parallel.rules import DEFAULT_RULES, Rules, constrain


def _init(axes, std=0.02):
    return nn.with_logical_partitioning(nn.initializers.normal(std), axes)


def _weight(module: nn.Module, name: str, axes: tuple[str, ...], shape: tuple[int, ...]) -> jax.Array:
    """A weight in the compute dtype, constrained to its own (FSDP / tensor) sharding where it is
    used. Why: the constraint's transpose pins the weight's gradient to the same layout in the
    compute dtype, so each layer's gradient is reduce-scattered inside the layer scan instead of
    all-reduced whole after it."""
    w = module.param(name, _init(axes), shape, module.cfg.jnp_param_dtype)
    return constrain(w.astype(module.cfg.jnp_dtype), axes, module.mesh, module.rules)


def _bias(module: nn.Module, name: str, axes: tuple[str, ...], shape: tuple[int, ...]) -> jax.Array:
    """A projection bias (zero-initialised) in the compute dtype, on its weight's layout."""
    b = module.param(name, nn.with_logical_partitioning(nn.initializers.zeros, axes), shape,
                     module.cfg.jnp_param_dtype)
    return constrain(b.astype(module.cfg.jnp_dtype), axes, module.mesh, module.rules)


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


class Attention(nn.Module):
    cfg: Qwen3Config
    mesh: Optional[Mesh] = None
    rules: Rules = DEFAULT_RULES

    @nn.compact
    def __call__(self, x, positions, mask, layer_cache: Optional[LayerCache] = None, write_index=None,
                 slot_ids=None):
        """x [b,t,e]; positions [b,t]; layer_cache: this layer of the KV cache, or None.

        Without a cache, mask [b,t,s] says which of this call's tokens each query sees. With a
        cache, row b of x belongs to cache row slot_ids[b] (default b) and sees its cached
        positions < write_index[b] plus this call's tokens by `mask` [b,t,t] (causal); the new
        (k, v) [b,t,k,d] are returned for the caller to write at write_index[b] + t.
        """
        c = self.cfg
        dt, pdt = c.jnp_dtype, c.jnp_param_dtype
        wq = _weight(self, "q", ("embed", "q_heads", "head_dim"), (c.hidden_size, c.num_heads, c.head_dim))
        wk = _weight(self, "k", ("embed", "kv_heads", "head_dim"), (c.hidden_size, c.num_kv_heads, c.head_dim))
        wv = _weight(self, "v", ("embed", "kv_heads", "head_dim"), (c.hidden_size, c.num_kv_heads, c.head_dim))
        wo = _weight(self, "o", ("q_heads", "head_dim", "embed"), (c.num_heads, c.head_dim, c.hidden_size))
        xd = x.astype(dt)
        q = matmul.dense("bte,ehd->bthd", xd, wq, self.mesh)
        k = matmul.dense("bte,ekd->btkd", xd, wk, self.mesh)
        v = matmul.dense("bte,ekd->btkd", xd, wv, self.mesh)
        if c.qkv_bias:  # Qwen2 / Llama with attention_bias
            q = q + _bias(self, "q_bias", ("q_heads", "head_dim"), (c.num_heads, c.head_dim))
            k = k + _bias(self, "k_bias", ("kv_heads", "head_dim"), (c.num_kv_heads, c.head_dim))
            v = v + _bias(self, "v_bias", ("kv_heads", "head_dim"), (c.num_kv_heads, c.head_dim))
        if c.qk_norm:  # Qwen3
            q = RMSNorm(c.head_dim, c.rms_norm_eps, pdt, axis="head_dim", name="q_norm")(q)
            k = RMSNorm(c.head_dim, c.rms_norm_eps, pdt, axis="head_dim", name="k_norm")(k)
        inv_freq, rope_scale = c.rope_frequencies()
        q = rope(q, positions, c.rope_theta, inv_freq, rope_scale)
        k = rope(k, positions, c.rope_theta, inv_freq, rope_scale)
        q = constrain(q, ("batch", "act_len", "act_heads", None), self.mesh, self.rules)
        k = constrain(k, ("batch", "act_len", "act_kv_heads", None), self.mesh, self.rules)

        b, t = q.shape[:2]
        qg = q.reshape(b, t, c.num_kv_heads, c.num_groups, c.head_dim)
        scale = c.head_dim ** -0.5
        if layer_cache is None:
            out = attention.causal_attention(c.attention, qg, k, v, mask, scale, self.mesh, self.rules)
        else:
            out = attention.cached_attention(c.attention, qg, k, v, mask, layer_cache, write_index, slot_ids, scale,
                                             dt, self.mesh, self.rules)
        out = out.reshape(b, t, c.num_heads, c.head_dim)
        out = constrain(out, ("batch", "act_len", "act_heads", None), self.mesh, self.rules)
        y = matmul.dense("bthd,hde->bte", out, wo, self.mesh)
        if c.o_bias:
            y = y + _bias(self, "o_bias", ("embed",), (c.hidden_size,))
        new_kv = None if layer_cache is None else (k, v)
        return y, new_kv


class MLP(nn.Module):
    cfg: Qwen3Config
    mesh: Optional[Mesh] = None
    rules: Rules = DEFAULT_RULES

    @nn.compact
    def __call__(self, x):
        c = self.cfg
        dt = c.jnp_dtype
        wg = _weight(self, "gate", ("embed", "mlp"), (c.hidden_size, c.intermediate_size))
        wu = _weight(self, "up", ("embed", "mlp"), (c.hidden_size, c.intermediate_size))
        wd = _weight(self, "down", ("mlp", "embed"), (c.intermediate_size, c.hidden_size))
        xd = x.astype(dt)
        gate = matmul.dense("bte,ef->btf", xd, wg, self.mesh)
        h = jax.nn.silu(gate) * matmul.dense("bte,ef->btf", xd, wu, self.mesh)  # [b, t, f]
        h = constrain(h, ("batch", "act_len", "act_mlp"), self.mesh, self.rules)
        return matmul.dense("btf,fe->bte", h, wd, self.mesh)


class DecoderLayer(nn.Module):
    """One pre-norm block, scanned over layers: carry x, scanned layer cache, broadcast rest."""
    cfg: Qwen3Config
    mesh: Optional[Mesh] = None
    rules: Rules = DEFAULT_RULES

    @nn.compact
    def __call__(self, x, layer, cache, positions, mask, write_index, slot_ids):
        """x [b,t,e] (the scan carry); layer: this layer's index (scanned); cache: the whole
        (k, v) KV cache, or a paged one's (k, v, block table) (broadcast), or None. Returns (x, new (k, v) of this call's tokens or None)."""
        c = self.cfg
        layer_cache = None if cache is None else LayerCache(cache[0], cache[1], layer, *cache[2:])
        h = RMSNorm(c.hidden_size, c.rms_norm_eps, c.jnp_param_dtype, name="input_norm")(x)
        a, new_kv = Attention(c, self.mesh, self.rules, name="attn")(h, positions, mask, layer_cache, write_index,
                                                                      slot_ids)
        x = x + a.astype(x.dtype)
        h = RMSNorm(c.hidden_size, c.rms_norm_eps, c.jnp_param_dtype, name="post_attn_norm")(x)
        x = x + MLP(c, self.mesh, self.rules, name="mlp")(h).astype(x.dtype)
        x = constrain(x, ("batch", "act_len", "act_embed"), self.mesh, self.rules)
        return x, new_kv


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
            in_axes=(0,) + (nn.broadcast,) * 5, length=c.num_layers,
            unroll=1 if c.scan_layers else c.num_layers,
            metadata_params={nn.PARTITION_NAME: "layers"})(c, self.mesh, self.rules, name="layers")
        self.final_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.jnp_param_dtype)
        if not c.tie_word_embeddings:
            self.lm_head = self.param("lm_head", _init(("embed", "vocab")), (c.hidden_size, c.vocab_size),
                                      c.jnp_param_dtype)

    def __call__(self, tokens, positions, mask, cache=None, write_index=None, slot_ids=None,
                 return_hidden=False):
        c = self.cfg
        x = constrain(self.embed(tokens), ("batch", "act_len", "act_embed"), self.mesh, self.rules)  # [b, t, e]
        layer_ids = None if cache is None else jnp.arange(c.num_layers, dtype=jnp.int32)
        x, new_kv = self.layers(x, layer_ids, cache, positions, mask, write_index, slot_ids)  # new_kv: [l, b, t, k, d]
        if cache is not None:  # in-place scatters of the new K/V (the cache is donated)
            if len(cache) == 3:  # a paged pool (one token per slot), written shard by shard
                cache = tuple(kv_pages.write_tokens(cc, nk, cache[2], write_index, self.mesh, self.rules)
                              for cc, nk in zip(cache[:2], new_kv)) + (cache[2],)
            else:
                rows = jnp.arange(tokens.shape[0]) if slot_ids is None else slot_ids
                t_idx = write_index[:, None] + jnp.arange(tokens.shape[1])[None, :]  # [b, t]; OOB writes drop
                heads = kv_layout.heads_per_device(cache[0].shape, self.mesh, self.rules)
                cache = tuple(kv_layout.write_new(cc, nk, rows, t_idx, self.mesh, heads)
                              for cc, nk in zip(cache, new_kv))
        h = self.final_norm(x)
        if return_hidden:
            return h, cache
        return constrain(self.project(h), ("batch", "act_len", "act_vocab"), self.mesh, self.rules), cache

    def embed(self, tokens):
        """Token ids [...] -> embeddings [..., e] in the compute dtype. On a mesh the lookup is
        vocabulary-parallel (the table split over `logits_vocab`, as the tied output projection
        reads it, every chip looking up its own rows for all of the call's tokens): the table's
        gradient then stays on its shard instead of being gathered whole per micro-batch."""
        c = self.cfg
        if self.mesh is None or self.mesh.size == 1:
            return jnp.take(self.embedding, tokens, axis=0).astype(c.jnp_dtype)
        table = constrain(self.embedding.astype(c.jnp_dtype), ("logits_vocab", None), self.mesh, self.rules)
        tokens = constrain(tokens, ("logits_batch",) + (None,) * (tokens.ndim - 1), self.mesh, self.rules)
        return jnp.take(table, tokens, axis=0)

    def final_hidden(self, h):
        """The final norm alone: the hidden state the projection reads (for callers that run the
        layers themselves, e.g. `kernels.fused.decode_layers`)."""
        return self.final_norm(h)

    def project(self, h):
        """Hidden [.., e] -> fp32 logits [.., v] (also used by chunked logprobs and the sampler)."""
        c = self.cfg
        w = self.embedding if c.tie_word_embeddings else self.lm_head
        return logits.project(h.astype(c.jnp_dtype), w.astype(c.jnp_dtype), c.tie_word_embeddings, self.mesh)
