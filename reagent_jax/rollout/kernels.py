"""Device kernels of the rollout engine: KV cache allocation, batched chunked prefill, and a
multi-step decode loop with the sampler fused in.

The cache is one preallocated pair (k, v), each in the backend's axis order (`kernels.kv_layout`:
[L, N, K, S, D] on CPU, [L, N, S, K, D] on GPU and TPU), sharded by its logical
axes (with the engine's rules, `layout.ENGINE_RULES`: slots over data, heads over tensor) and
DONATED to every kernel, so it is updated in place (on TPU too: no cache-sized copy in decode,
checked by launch/compile_check.py; see `kernels.kv_layout.write_new`). Only small per-row
arrays cross the host boundary: token ids, lengths and flags in; sampled ids and logprobs out.

How each piece runs on the mesh's devices is the kernel seam's (`reagent_jax.kernels`): e.g. on
an AVX-512 CPU in fp32 (unsharded) a decode step is two custom calls (every layer in one, the
output projection with the sampler's statistics in the other); elsewhere the model's own layers.

Attention windows: a kernel only reads the first `window` cache positions (a static bucket
>= every position the call touches), so attention cost and prefill score memory follow the
longest live sequence instead of max_len. On TPU decode reads each slot only up to its own
length (`kernels.tpu.ragged_decode`), so the engine decodes over the whole cache.

Shapes are bucketed by the engine (rows, chunk lengths and windows from short lists), so a run
compiles a handful of kernels. All functions are pure and jitted with cfg / mesh / rules static.
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from reagent_jax.kernels import attention, fused, kv_layout, kv_pages, logits as logits_kernels
from reagent_jax.models.config import Qwen3Config
from reagent_jax.models.functional import forward_with_cache
from reagent_jax.models.logprob_head import head_weight_key
from reagent_jax.models.qwen3 import Qwen3
from reagent_jax.parallel.rules import DEFAULT_RULES, Rules, constrain
from reagent_jax.rollout.sampling import CHUNK, inverse_temperature, sample_vocab_major


def geometric_buckets(lo: int, hi: int, factor: int = 2) -> tuple[int, ...]:
    """lo, lo*factor, lo*factor^2, ... below hi, then hi itself (hi is always the last bucket)."""
    if lo < 1 or hi < 1 or factor < 2:
        raise ValueError(f"buckets need lo >= 1, hi >= 1, factor >= 2; got lo={lo} hi={hi} factor={factor}")
    out, b = [], lo
    while b < hi:
        out.append(b)
        b *= factor
    return tuple(out) + (hi,)


def bucket(n: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= n (buckets sorted ascending)."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")


def cache_shape(cfg: Qwen3Config, num_slots: int, max_len: int, mesh: Optional[Mesh] = None) -> tuple[int, ...]:
    """The cache's shape in the mesh's backend order (`kernels.kv_layout`)."""
    return kv_layout.cache_shape(cfg, num_slots, max_len, mesh)


def init_cache(cfg: Qwen3Config, num_slots: int, max_len: int, mesh: Optional[Mesh] = None,
               rules: Rules = DEFAULT_RULES, dtype=None):
    """Zeroed (k, v) cache, each `cache_shape` in `dtype` (default: the compute dtype)."""
    shape = cache_shape(cfg, num_slots, max_len, mesh)
    dtype = jnp.dtype(dtype or cfg.compute_dtype)
    # Placed by the same sharding constraint the kernels end with, so the first kernel call sees
    # exactly the sharding every later call sees (no second compilation).
    return jax.jit(lambda: _pin_cache((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)), mesh, rules))()


def _pin_cache(cache, mesh, rules):
    """Keeps the output cache on the input layout, so the next call hits the same executable."""
    return tuple(constrain(c, kv_layout.cache_axes(mesh), mesh, rules) for c in cache)


def sampling_logits(cfg: Qwen3Config, params, h: jax.Array, mesh: Optional[Mesh] = None,
                    rules: Rules = DEFAULT_RULES, inv_temperature: Optional[jax.Array] = None
                    ) -> tuple[jax.Array, Optional[tuple[jax.Array, jax.Array]]]:
    """Final hidden states [B, E] -> (fp32 logits, vocabulary-major [V, B], for
    `sample_vocab_major`; its chunk `stats` at `inv_temperature` [B] or None). The values are
    the model's (`Qwen3.project`); how they are computed is `kernels.logits.vocab_major`'s."""
    project = lambda: Qwen3(cfg, mesh, rules).apply({"params": params}, h, method=Qwen3.project)  # [B, V]
    w = params[head_weight_key(cfg)]
    return logits_kernels.vocab_major(h, w, cfg.tie_word_embeddings, cfg.compute_dtype, project, mesh, rules,
                                      inv_temperature, CHUNK)


def vocab_shards(cfg: Qwen3Config, mesh: Optional[Mesh], rules: Rules) -> int:
    """Devices the sampler's [V, B] logits are split over (`kernels.logits.vocab_shards`)."""
    return logits_kernels.vocab_shards(cfg.vocab_size, mesh, rules)


class Sampling(NamedTuple):
    """Per-row sampling parameters, each [B]."""
    temperature: jax.Array  # fp32, 0 = greedy
    top_p: jax.Array  # fp32 in (0, 1]
    top_k: jax.Array  # int32, 0 = off
    seeds: jax.Array  # uint32


@functools.partial(jax.jit, static_argnames=("cfg", "window", "truncation", "mesh", "rules"),
                   donate_argnames=("cache",))
def prefill(cfg: Qwen3Config, params, cache, tokens: jax.Array, write_index: jax.Array,
            slot_ids: jax.Array, last_index: jax.Array, sampling: Sampling, pages: Optional[jax.Array] = None, *,
            window: int, truncation: bool = True, mesh: Optional[Mesh] = None, rules: Rules = DEFAULT_RULES):
    """Writes one chunk per row into the cache and draws the token after each row's last one.

    tokens [B, T] (right-padded), write_index [B] (cache index of tokens[:, 0]; padding rows
    use max_len so their writes are dropped), slot_ids [B] (padding rows: N, out of range),
    last_index [B] (index in T of the row's last real token). Every real token must land below
    `window`. The B rows' first `window` positions are gathered, extended and scattered back, so
    attention is [B, T, window]. Returns (cache, next_tokens [B], logprobs [B]); logits are
    projected for the last position only: [B, V], never [B, T, V]. truncation=False: no row
    uses top-k / top-p (see `sampling.sample`). pages [N, max_len / page]: the block table of a
    paged cache (`kernels.kv_pages`; `cache` is then its page pool), None for a contiguous one.
    """
    if pages is None:  # a positions-minor cache is indexed through its memory layout's view
        view, view_order = kv_layout.memory_view(cache[0], mesh, rules)
        window_of = [slice(None)] * 5
        window_of[view_order.index("n")] = slot_ids
        window_of[view_order.index("s")] = slice(0, window)
        window_of = tuple(window_of)  # one advanced index: the rows keep the cache's order, B for N
        read = lambda c: view(view(c).at[window_of].get(mode="fill", fill_value=0))
        write = lambda c, r: view(view(c).at[window_of].set(view(r), mode="drop"))
    else:  # padding rows' slot N reads the empty page id: zeros in, writes dropped
        table = pages.at[slot_ids, : window // kv_pages.page_size_of(cache[0], mesh)].get(
            mode="fill", fill_value=cache[0].shape[kv_layout.slots_axis(mesh)])  # [B, W / page]
        read = lambda c: kv_pages.gather(c, table, mesh, rules, per_shard=False)
        write = lambda c, r: kv_pages.scatter(c, r, table, mesh, rules, per_shard=False)
    rows = tuple(read(c) for c in cache)  # e.g. [L, B, K, W, D]
    h, rows = forward_with_cache(cfg, params, tokens, rows, write_index, mesh=mesh, rules=rules,
                                 return_hidden=True)  # h [B, T, E]
    cache = tuple(write(c, r) for c, r in zip(cache, rows))
    h_last = jnp.take_along_axis(h, last_index[:, None, None], axis=1)[:, 0]  # [B, E]
    logits, stats = sampling_logits(cfg, params, h_last, mesh, rules, inverse_temperature(sampling.temperature))
    positions = write_index + last_index + 1
    tok, lp = sample_vocab_major(logits, sampling.temperature, sampling.top_p, sampling.top_k, sampling.seeds,
                                 positions, truncation=truncation, stats=stats,
                                 vocab_shards=vocab_shards(cfg, mesh, rules))
    return _pin_cache(cache, mesh, rules), tok, lp


def _decode_hidden(cfg: Qwen3Config, params, tokens: jax.Array, cache, write: jax.Array, mesh, rules):
    """One token per cache row [N] -> (final hidden states [N, E], cache): every layer in one
    fused kernel where the mesh's devices have one (`kernels.fused`), else the model's layers
    (also for a paged pool read in place: cache = (k, v, block table))."""
    out = None if len(cache) == 3 else fused.decode_layers(cfg, params, tokens, write, cache, mesh)
    if out is not None:
        h, cache = out
        return Qwen3(cfg, mesh, rules).apply({"params": params}, h, method=Qwen3.final_hidden), cache
    h, cache = forward_with_cache(cfg, params, tokens[:, None], cache, write, mesh=mesh, rules=rules, return_hidden=True)
    return h[:, 0], cache


class DecodeState(NamedTuple):
    """Per-slot decode state, each [N] (stop_ids [N, M], -1 padded)."""
    tokens: jax.Array  # int32: the last drawn token, not yet in the cache
    lengths: jax.Array  # int32: tokens in the cache (= where `tokens` is written)
    active: jax.Array  # bool
    remaining: jax.Array  # int32: tokens this turn may still draw
    sampling: Sampling
    stop_ids: jax.Array  # int32 [N, M]
    exit_on_done: jax.Array  # bool []: end the call as soon as any slot finishes (slots are awaited)


@functools.partial(jax.jit, static_argnames=("cfg", "num_steps", "window", "truncation", "mesh", "rules"),
                   donate_argnames=("cache",))
def decode(cfg: Qwen3Config, params, cache, state: DecodeState, pages: Optional[jax.Array] = None, *,
           num_steps: int, window: int, truncation: bool = True, mesh: Optional[Mesh] = None,
           rules: Rules = DEFAULT_RULES):
    """Runs up to `num_steps` decode steps over all N slots in one call: a while loop that ends
    early once no slot is active, or once any slot finishes if `state.exit_on_done` (so a freed
    slot is refilled without waiting for the rest of the fused steps), or before any active
    slot would write at or past `window`. The loop works on the cache's first `window`
    positions (copied out once and written back once per call). Inactive slots write past the
    window (dropped). A slot stops on a stop token, when its budget is spent, or when the
    sequence would outgrow the cache (lengths + 1 == max_len). Returns (cache, out_tokens
    [num_steps, N], out_logprobs [num_steps, N]); out_tokens is -1 where a slot drew nothing.
    truncation=False: no slot uses top-k / top-p (see `sampling.sample`). pages: a paged cache's
    block table [N, max_len / page] (`prefill`): the ragged TPU kernel reads the pool in place
    (window = max_len); otherwise the slots' first `window` positions are gathered from the pool
    once per call and their pages written back once.
    """
    full = cache
    axis = kv_layout.positions_axis(mesh)
    in_place = pages is not None and attention.choose_decode(cfg.attention, mesh) == "ragged"
    if pages is not None:
        page = kv_pages.page_size_of(full[0], mesh)
        max_len, table = pages.shape[1] * page, pages[:, : window // page]  # table [N, W / page]
        cache = tuple(cache) + (pages,) if in_place else tuple(kv_pages.gather(c, table, mesh, rules) for c in full)
    else:
        max_len = cache[0].shape[axis]
        if window < max_len:
            cache = tuple(jax.lax.slice_in_dim(c, 0, window, axis=axis) for c in full)
    n = state.tokens.shape[0]
    s = state.sampling
    inv_t = inverse_temperature(s.temperature)
    shards = vocab_shards(cfg, mesh, rules)
    n_active = jnp.sum(state.active)

    def cond(carry):
        i, st, _, _, _ = carry
        someone_done = jnp.sum(st.active) < n_active
        room = jnp.all(~st.active | (st.lengths < window))
        return (i < num_steps) & jnp.any(st.active) & ~(state.exit_on_done & someone_done) & room

    def body(carry):
        i, st, cache, out_tok, out_lp = carry
        write = jnp.where(st.active, st.lengths, window)
        h, cache = _decode_hidden(cfg, params, st.tokens, cache, write, mesh, rules)  # h [N, E]
        logits, stats = sampling_logits(cfg, params, h, mesh, rules, inv_t)  # [V, N]
        tok, lp = sample_vocab_major(logits, s.temperature, s.top_p, s.top_k, s.seeds, st.lengths + 1,
                                     truncation=truncation, stats=stats, vocab_shards=shards)
        tok = jnp.where(st.active, tok, -1)
        out_tok = out_tok.at[i].set(tok)
        out_lp = out_lp.at[i].set(jnp.where(st.active, lp, 0.0))
        step = st.active.astype(jnp.int32)
        lengths, remaining = st.lengths + step, st.remaining - step
        hit_stop = jnp.any(tok[:, None] == st.stop_ids, axis=-1)
        active = st.active & ~hit_stop & (remaining > 0) & (lengths + 1 < max_len)
        st = st._replace(tokens=jnp.where(st.active, tok, st.tokens), lengths=lengths, active=active,
                         remaining=remaining)
        return i + 1, st, _pin_cache(cache[:2], mesh, rules) + tuple(cache[2:]), out_tok, out_lp

    out_tok = jnp.full((num_steps, n), -1, jnp.int32)
    out_lp = jnp.zeros((num_steps, n), jnp.float32)
    _, _, cache, out_tok, out_lp = jax.lax.while_loop(cond, body, (jnp.int32(0), state, cache, out_tok, out_lp))
    if in_place:
        cache = cache[:2]
    elif pages is not None:
        cache = _pin_cache(tuple(kv_pages.scatter(f, c, table, mesh, rules) for f, c in zip(full, cache)), mesh, rules)
    elif window < max_len:
        cache = _pin_cache(tuple(jax.lax.dynamic_update_slice(f, c, (0,) * 5) for f, c in zip(full, cache)), mesh, rules)
    return cache, out_tok, out_lp
