"""Dense Qwen3 / Qwen2 / Llama decoder as Flax (linen) modules used functionally: `params` is a
plain pytree.

Features: GQA, per-head RMSNorm on q and k (Qwen3) or q/k/v biases (Qwen2; Llama with
attention_bias), RoPE (rotate-half, HF layout), SwiGLU MLP, tied or untied embeddings, separate
param/compute dtypes, `nn.scan` over layers (unrolled when `scan_layers=False`, so the param
layout is the same), remat policies, logical axis names on every parameter (via
`nn.with_logical_partitioning`) and activation (via `parallel.constrain`).

One code path serves training and sampling: with `cache=(k, v)` (each [L, B, K, S, D] on CPU,
[L, B, S, K, D] on accelerators: `kv_layout`) the new tokens' keys/values are scattered into the
cache at `cache_index[b] + t` and attention runs over the whole cache, causally by absolute
position. Rows of a batch may hold different lengths.

Einsum letters: b batch, t query time, s key time, e embed, h q heads, k kv heads, g q heads per
kv head, d head dim, f mlp, v vocab, l layers.
"""
from __future__ import annotations

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from reagent_jax.models import attention_kernels, cpu_gemm, kv_layout
from reagent_jax.models.config import Qwen3Config
from reagent_jax.parallel.mesh import mesh_platform
from reagent_jax.parallel.rules import DEFAULT_RULES, Rules, constrain

_NEG = -1e30  # finite "minus infinity": fully masked (padding) rows stay finite
LONG_ATTENTION = 2048  # longer sequences recompute attention probabilities per query block (see causal_attention)


def _f32_einsum(eq: str, a: jax.Array, b: jax.Array, mesh: Optional[Mesh] = None) -> jax.Array:
    """einsum accumulated and written in fp32. On CPU, batched products of low-precision
    operands are widened to fp32 first (exact: the same fp32 products): XLA:CPU's DotThunk has
    no bf16 x bf16 -> f32 kernel for some batched shapes ("UNIMPLEMENTED: Unsupported element
    type for DotThunk::Execute", e.g. the attention PV product of two 443-token rows), which made
    every bf16 engine call on CPU fail."""
    lhs, rest = eq.split(",")
    rhs, out = rest.split("->")
    batched = any(c in rhs and c in out for c in lhs)
    if batched and a.dtype != jnp.float32 and mesh_platform(mesh) == "cpu":
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return jnp.einsum(eq, a, b, preferred_element_type=jnp.float32)


def _mm(eq: str, a: jax.Array, b: jax.Array, mesh: Optional[Mesh] = None) -> jax.Array:
    """`_f32_einsum`, then cast to a's dtype. Same values as a bf16 einsum with fp32
    accumulation, but XLA:CPU's bf16 GEMM writing bf16 ran ~5x slower than the one writing fp32
    (2048^3: 220 vs 1,230 GFLOP/s); on GPU/TPU the cast normally fuses into the matmul."""
    return _f32_einsum(eq, a, b, mesh).astype(a.dtype)


def _dense(eq: str, x: jax.Array, w: jax.Array, mesh: Optional[Mesh]) -> jax.Array:
    """x . weight: through OpenBLAS for fp32 on an unsharded CPU run (`cpu_gemm`: XLA:CPU's fp32
    GEMM is ~15% slower), `_mm` elsewhere on CPU. On accelerators a plain einsum in the compute
    dtype (the MXU / tensor cores accumulate in fp32 anyway): with an fp32 result the weight
    gradient becomes an fp32 GEMM and its FSDP reduce-scatter moves fp32, twice the bytes
    (measured on the Qwen3-8B train step for v5p)."""
    if mesh_platform(mesh) != "cpu":
        return jnp.einsum(eq, x, w)
    n_contract = cpu_gemm.leading_contraction(eq)
    if n_contract is not None and cpu_gemm.usable(x, w, mesh=mesh, n_contract=n_contract):
        return cpu_gemm.contract(x, w, n_contract)
    return _mm(eq, x, w)


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


def rope(x: jax.Array, positions: jax.Array, theta: float, inv_freq=None, scale: float = 1.0) -> jax.Array:
    """Rotary embedding, HF `rotate_half` layout. x [b, t, n, d], positions [b, t].

    inv_freq [d/2] and scale (YaRN's factor on cos/sin) come from `Qwen3Config.rope_frequencies`
    for scaled RoPE types; None means plain RoPE with base `theta`."""
    d = x.shape[-1]
    cos, sin = rope_tables(positions, d, theta, inv_freq, scale)  # [b, t, d/2]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., : d // 2], x32[..., d // 2:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def rope_tables(positions: jax.Array, d: int, theta: float, inv_freq=None, scale: float = 1.0
                ) -> tuple[jax.Array, jax.Array]:
    """cos, sin [..., d/2] of `rope` at positions [...] (YaRN's factor applied)."""
    if inv_freq is None:
        inv_freq = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))  # [d/2]
    ang = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos, sin


def attention_mask(q_index: jax.Array, key_valid: jax.Array) -> jax.Array:
    """[b, t, s] boolean: key s visible to query t (causal by absolute index, valid keys only).

    q_index [b, t] is the absolute index of each query; key_valid [b, s].
    """
    s_idx = jnp.arange(key_valid.shape[1])
    return (s_idx[None, None, :] <= q_index[:, :, None]) & key_valid[:, None, :].astype(bool)


def causal_blocks(t: int, min_block: int = 128, max_blocks: int = 8, max_block: int = 512) -> list[tuple[int, int]]:
    """Static query blocks [start, end) for causal attention: block i only needs keys < end_i,
    so splitting T queries into n blocks computes (n + 1) / 2n of the full score matrix. Up to
    `max_blocks` blocks, more when a block would exceed `max_block` queries: a block's scores
    are [heads, block, T] fp32, 4.3 GB per layer for one 16k-token Qwen3-8B row in 2048-query
    blocks, the largest buffer of the long-context train step."""
    n = max(1, min(max(max_blocks, -(-t // max_block)), t // min_block))
    ends = [-(-t * (i + 1) // n) for i in range(n)]
    return list(zip([0] + ends[:-1], ends))


def causal_attention(qg: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float,
                     mesh: Optional[Mesh] = None) -> jax.Array:
    """Softmax attention without a cache. qg [b,t,k,g,d]; k, v [b,s=t,k,d]; mask [b,t,s] must be
    causal (key s > query t never visible; `attention_mask` builds such masks). Returns
    [b,t,k,g,d]. mesh: where it runs (for `_f32_einsum`).

    Why not one einsum: on XLA:CPU the straightforward form ran at ~30 GFLOP/s. Here queries go
    in causal blocks that skip keys past the block's end, the g query heads of a kv head are
    folded into one matmul dimension (bigger GEMMs, no transposes inside the einsums), and the
    softmax is normalised after the PV product ([.., d] divides instead of [.., s]): ~2.3x
    faster forward and ~2x faster backward at T=512. Fully masked rows (padding queries) average
    the values of their block's keys, finite like before.
    """
    b, t, nk, g, d = qg.shape
    dt = v.dtype
    kt, vt = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [b, k, s, d]

    def block(q_blk, kt, vt, m):  # q_blk [b,k,(g tq),d]; kt, vt [b,k,s,d]; m [b,tq,s]
        tq, s = m.shape[1], m.shape[2]
        scores = _f32_einsum("bkmd,bksd->bkms", q_blk, kt, mesh) * scale
        scores = jnp.where(m[:, None, None], scores.reshape(b, nk, g, tq, s), _NEG)
        e = jnp.exp(scores - jax.lax.stop_gradient(scores.max(axis=-1, keepdims=True)))  # [b,k,g,tq,s]
        z = e.sum(axis=-1)  # [b,k,g,tq]
        o = _mm("bkms,bksd->bkmd", e.reshape(b, nk, g * tq, s).astype(dt), vt, mesh)
        return o.reshape(b, nk, g, tq, d) / z[..., None].astype(dt)

    # Long sequences: recompute each block's probabilities in its own backward pass instead of
    # keeping every block's [heads, block, keys] fp32 probabilities of the layer alive until then
    # (~17 GB for one 16k-token Qwen3-8B row), the memory use of flash attention without a kernel.
    if t > LONG_ATTENTION:
        block = jax.checkpoint(block)
    outs = []
    for start, end in causal_blocks(t):
        q_blk = qg[:, start:end].transpose(0, 2, 3, 1, 4).reshape(b, nk, g * (end - start), d)  # [b,k,(g t),d]
        o = block(q_blk, kt[:, :, :end], vt[:, :, :end], mask[:, start:end, :end])
        outs.append(o.transpose(0, 3, 1, 2, 4))  # [b,tq,k,g,d]
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)


def decode_step_values(p_old: jax.Array, cv: jax.Array, p_new: jax.Array, v: jax.Array) -> jax.Array:
    """Attention output of one new token per row: weights p_old [b,k,g,1,s] over the cached
    values cv [b,k,s,d] plus p_new [b,k,g,1,1] over the token's own value v [b,1,k,d] ->
    [b,1,k,g,d] in v's dtype (fp32 accumulation).

    Why not the einsums of the multi-token path: with one query these are [g, s] x [s, d]
    mat-vecs; as a multiply-reduce over s the cache is read once where it lies (decode step at
    bench-256 with a 4k vocabulary: 4.4 -> 3.9 ms, measured when the cache was [b,s,k,d] and the
    GEMM needed a transposed copy of it)."""
    f32 = jnp.float32
    out = (p_old[:, :, :, 0, :, None].astype(f32) * cv[:, :, None].astype(f32)).sum(3)  # [b,k,g,s,1]*[b,k,1,s,d]
    out = out + p_new[:, :, :, 0, 0, None].astype(f32) * v[:, 0, :, None].astype(f32)
    return out[:, None].astype(v.dtype)


class Attention(nn.Module):
    cfg: Qwen3Config
    mesh: Optional[Mesh] = None
    rules: Rules = DEFAULT_RULES

    @nn.compact
    def __call__(self, x, positions, mask, layer_cache=None, write_index=None, slot_ids=None):
        """x [b,t,e]; positions [b,t]; layer_cache (k, v) [n,k,S,d] or None.

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
        q = _dense("bte,ehd->bthd", xd, wq, self.mesh)
        k = _dense("bte,ekd->btkd", xd, wk, self.mesh)
        v = _dense("bte,ekd->btkd", xd, wv, self.mesh)
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
        if layer_cache is None and attention_kernels.choose(c.attention, self.mesh, t) == "splash":
            key_valid = jnp.diagonal(mask, axis1=1, axis2=2)  # [b, t]: a causal mask's diagonal is its valid keys
            out = attention_kernels.splash_attention(qg, k, v, key_valid, scale, self.mesh, self.rules)
        elif layer_cache is None:
            out = causal_attention(qg, k, v, mask, scale, self.mesh)
        else:
            # Two-part softmax over (cached positions < write_index) and (new tokens, causal): the
            # cache is only read here; the new K/V are returned and scattered once after the layer
            # loop, so a decode step never copies the cache.
            ck, cv = layer_cache  # [n, k, S, d] on CPU, [n, S, k, d] on accelerators (models.kv_layout)
            kv = "bksd" if kv_layout.heads_major(self.mesh) else "bskd"
            if slot_ids is not None:
                ck, cv = ck[slot_ids], cv[slot_ids]  # [b, ...]
            ck, cv = ck.astype(dt), cv.astype(dt)
            old_valid = jnp.arange(ck.shape[kv.index("s")])[None, :] < write_index[:, None]  # [b, S]
            s_old = _f32_einsum(f"btkgd,{kv}->bkgts", qg, ck, self.mesh) * scale
            s_old = jnp.where(old_valid[:, None, None, None, :], s_old, _NEG)
            s_new = _f32_einsum("btkgd,bukd->bkgtu", qg, k, self.mesh) * scale
            s_new = jnp.where(mask[:, None, None], s_new, _NEG)
            m = jnp.maximum(s_old.max(-1), s_new.max(-1))[..., None]
            e_old, e_new = jnp.exp(s_old - m), jnp.exp(s_new - m)
            z = e_old.sum(-1, keepdims=True) + e_new.sum(-1, keepdims=True)
            if t == 1 and kv_layout.heads_major(self.mesh):  # CPU; accelerators keep the einsums (measured on CPU only)
                out = decode_step_values(e_old / z, cv, e_new / z, v)
            else:
                out = (_mm(f"bkgts,{kv}->btkgd", (e_old / z).astype(dt), cv, self.mesh)
                       + _mm("bkgtu,bukd->btkgd", (e_new / z).astype(dt), v, self.mesh))
        out = out.reshape(b, t, c.num_heads, c.head_dim)
        out = constrain(out, ("batch", "act_len", "act_heads", None), self.mesh, self.rules)
        y = _dense("bthd,hde->bte", out, wo, self.mesh)
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
        gate = _dense("bte,ef->btf", xd, wg, self.mesh)
        h = jax.nn.silu(gate) * _dense("bte,ef->btf", xd, wu, self.mesh)  # [b, t, f]
        h = constrain(h, ("batch", "act_len", "act_mlp"), self.mesh, self.rules)
        return _dense("btf,fe->bte", h, wd, self.mesh)


class DecoderLayer(nn.Module):
    """One pre-norm block, scanned over layers: carry x, scanned layer cache, broadcast rest."""
    cfg: Qwen3Config
    mesh: Optional[Mesh] = None
    rules: Rules = DEFAULT_RULES

    @nn.compact
    def __call__(self, x, layer_cache, positions, mask, write_index, slot_ids):
        """x [b,t,e] (the scan carry); layer_cache: this layer's (k, v) [n,k,S,d] (scanned) or None.
        Returns (x, new (k, v) of this call's tokens or None)."""
        c = self.cfg
        h = RMSNorm(c.hidden_size, c.rms_norm_eps, c.jnp_param_dtype, name="input_norm")(x)
        a, new_kv = Attention(c, self.mesh, self.rules, name="attn")(h, positions, mask, layer_cache, write_index,
                                                                      slot_ids)
        x = x + a.astype(x.dtype)
        h = RMSNorm(c.hidden_size, c.rms_norm_eps, c.jnp_param_dtype, name="post_attn_norm")(x)
        x = x + MLP(c, self.mesh, self.rules, name="mlp")(h).astype(x.dtype)
        x = constrain(x, ("batch", "act_len", "act_embed"), self.mesh, self.rules)
        return x, new_kv


def _write_layers(cache: jax.Array, new: jax.Array, rows: jax.Array, t_idx: jax.Array,
                  mesh: Optional[Mesh]) -> jax.Array:
    """cache [l, n, k, S, d] (CPU) or [l, n, S, k, d] with new [l, b, t, k, d] written at rows [b] x
    t_idx [b, t].

    On accelerators one scatter per layer: a single scatter of all layers ([b, t, l, k, d]
    windows) made XLA:TPU keep the cache in a layers-minor layout for it and copy the whole
    cache to the layer scan's layers-major layout and back in every decode step (two
    cache-sized copies per step, measured with launch/compile_check.py). On CPU the single
    scatter is ~15% faster for a bench-256 prefill, so it stays there."""
    if kv_layout.heads_major(mesh):  # CPU
        # cache[:, rows[b], :, t_idx[b, t]] is [b, t, l, k, d] (NumPy rules for split indices)
        return cache.at[:, rows[:, None], :, t_idx].set(new.transpose(1, 2, 0, 3, 4).astype(cache.dtype), mode="drop")
    for layer in range(cache.shape[0]):  # cache[layer, rows[b], t_idx[b, t]] is [b, t, k, d]
        cache = cache.at[layer, rows[:, None], t_idx].set(new[layer].astype(cache.dtype), mode="drop")
    return cache


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
            in_axes=(0,) + (nn.broadcast,) * 4, length=c.num_layers,
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
        x, new_kv = self.layers(x, cache, positions, mask, write_index, slot_ids)  # new_kv: [l, b, t, k, d]
        if cache is not None:  # in-place scatters of the new K/V (the cache is donated)
            rows = jnp.arange(tokens.shape[0]) if slot_ids is None else slot_ids
            t_idx = write_index[:, None] + jnp.arange(tokens.shape[1])[None, :]  # [b, t]; OOB writes drop
            cache = tuple(_write_layers(cc, nk, rows, t_idx, self.mesh) for cc, nk in zip(cache, new_kv))
        h = self.final_norm(x)
        if return_hidden:
            return h, cache
        logits = constrain(self.project(h), ("batch", "act_len", "act_vocab"), self.mesh, self.rules)
        return logits, cache

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
        layers themselves, e.g. `cpu_decode`)."""
        return self.final_norm(h)

    def project(self, h):
        """Hidden [.., e] -> fp32 logits [.., v] (also used by chunked logprobs and the sampler).

        A tied embedding is contracted as stored, [v, e]: written as `embedding.T`, XLA:CPU
        materialised the transposed (and, in bf16, converted) matrix in every call, which made
        bf16 token logprobs 2x slower than fp32. fp32 on one CPU device: OpenBLAS (`cpu_gemm`)."""
        c = self.cfg
        dt = c.jnp_dtype
        hd = h.astype(dt)
        if c.tie_word_embeddings:
            if cpu_gemm.usable(hd, self.embedding, mesh=self.mesh):
                return cpu_gemm.contract_rows(hd, self.embedding)
            return jnp.einsum("...e,ve->...v", hd, self.embedding.astype(dt), preferred_element_type=jnp.float32)
        if cpu_gemm.usable(hd, self.lm_head, mesh=self.mesh):
            return cpu_gemm.contract(hd, self.lm_head, 1)
        return jnp.einsum("...e,ev->...v", hd, self.lm_head.astype(dt), preferred_element_type=jnp.float32)
