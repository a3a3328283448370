"""Sampling parameters and the fused, per-row sampler the prefill/decode kernels run on device.

Logprob definition (identical to the trainer's `models.token_logprobs(..., temperature=T)`):

    logprob(token) = log softmax(logits / T)[token]   over the FULL vocabulary,

computed BEFORE top-k / top-p truncation, with T the request's temperature (T = 1 for greedy,
temperature 0). Truncation changes which tokens can be drawn, never the reported logprob, so the
policy-gradient ratio uses one distribution on both sides.

Randomness: the draw for the token at sequence index i of a request with seed s uses the key
fold_in(PRNGKey(s), i). It depends on nothing else (not the slot, the batch, or how many steps a
kernel fuses), so the same seed gives the same tokens however requests are batched.
Top-k is applied first, then top-p on the top-k-renormalised distribution (the order of
`transformers` and vLLM); the draw is a two-level Gumbel-max over the truncated logits / T (see
`sample`), exact for that distribution.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import operator
from typing import Optional, Sequence

import jax
import jax.numpy as jnp

SEED_LIMIT = 2 ** 32  # seeds are uint32 on device


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How one request (or one turn of a session) is sampled.

    temperature 0 means greedy. top_k 0 and top_p 1 disable truncation. seed None lets the engine
    draw one (recorded in the result). Stop token ids end the turn and are kept as its last token;
    stop strings are matched on the decoded tail of the turn (the engine needs a `decode_fn`) and
    the turn ends with the token that completes the match. Python or NumPy numbers are accepted
    (stored as Python ones); any temperature > 0, however small, samples (1e-30 is in effect greedy).
    """
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    seed: Optional[int] = None
    stop_token_ids: Sequence[int] = ()
    stop_strings: Sequence[str] = ()

    def __post_init__(self):
        # NumPy scalars are accepted and stored as Python numbers; bools, strings and 5.7 as a
        # token id are refused (int() would silently turn them into valid-looking values).
        for name, ok, cast in (("temperature", _is_real, float), ("top_p", _is_real, float), ("top_k", _is_int, int),
                               ("max_new_tokens", _is_int, int), ("seed", _is_int, int)):
            if ok(getattr(self, name)):
                object.__setattr__(self, name, cast(getattr(self, name)))
        ids, strings = self.stop_token_ids, self.stop_strings
        ids = () if ids is None else (ids,) if _is_int(ids) else ids  # None / one id are fine too
        strings = () if strings is None else (strings,) if isinstance(strings, str) else strings
        try:
            ids, strings = tuple(_token_id(t) for t in ids), tuple(strings)
        except TypeError as e:
            raise ValueError(f"SamplingParams: stop_token_ids={self.stop_token_ids!r} / stop_strings="
                             f"{self.stop_strings!r} must be int token ids / strs ({e})") from None
        object.__setattr__(self, "stop_token_ids", ids)
        object.__setattr__(self, "stop_strings", strings)
        self.validate()

    def validate(self, vocab_size: Optional[int] = None, where: str = "SamplingParams") -> None:
        """Raises ValueError naming the bad field (and `where`, e.g. the request index)."""
        def bad(msg):
            raise ValueError(f"{where}: {msg}")
        if not (_is_real(self.temperature) and math.isfinite(self.temperature) and self.temperature >= 0):
            bad(f"temperature={self.temperature!r} must be a finite number >= 0 (0 = greedy)")
        if not (_is_real(self.top_p) and 0.0 < self.top_p <= 1.0):
            bad(f"top_p={self.top_p!r} must be in (0, 1]")
        if not (_is_int(self.top_k) and self.top_k >= 0):
            bad(f"top_k={self.top_k!r} must be an int >= 0 (0 = no top-k)")
        if not (_is_int(self.max_new_tokens) and self.max_new_tokens >= 1):
            bad(f"max_new_tokens={self.max_new_tokens!r} must be an int >= 1")
        if self.seed is not None and not (_is_int(self.seed) and 0 <= self.seed < SEED_LIMIT):
            bad(f"seed={self.seed!r} must be None or an int in [0, 2**32)")
        for t in self.stop_token_ids:
            if t < 0 or (vocab_size is not None and t >= vocab_size):
                bad(f"stop token id {t} is outside the vocabulary [0, {vocab_size})")
        for s in self.stop_strings:
            if not isinstance(s, str) or not s:
                bad(f"stop string {s!r} must be a non-empty str")

    def replace(self, **kw) -> "SamplingParams":
        return dataclasses.replace(self, **kw)


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _token_id(t) -> int:
    if not _is_int(t):
        raise TypeError(f"{t!r} is not an int")
    return operator.index(t)


CHUNK = 128  # vocabulary chunk of the two-level argmax, the draw and `chunk_stats`
_FAST_K = 256  # truncation is read off the top-_FAST_K values when they decide it


def vocab_chunk(v: int, vocab_shards: int = 1) -> int:
    """The chunk size S: CHUNK, or for logits split over `vocab_shards` devices the largest power
    of two <= CHUNK that divides each device's share, so that no chunk straddles two devices and
    [V, B] -> [C, S, B] is a local reshape (Qwen3's 151936 = 4 x 37984 = 4 x 32 x 1187: chunks of
    128 would straddle, and XLA gathers the whole [V, B] to every device each step)."""
    if vocab_shards <= 1 or v % vocab_shards:
        return min(CHUNK, v)
    s = min(CHUNK, v // vocab_shards)
    while (v // vocab_shards) % s:
        s //= 2
    return s


def _chunked(x: jax.Array, fill: float, s: int = CHUNK) -> jax.Array:
    """Vocabulary-major logits [V, B] -> [C, S, B] with S = s, the tail padded with `fill`."""
    v, b = x.shape
    s = min(s, v)
    c = -(-v // s)
    if c * s != v:
        x = jnp.pad(x, ((0, c * s - v), (0, 0)), constant_values=fill)
    return x.reshape(c, s, b)


def _chunk_rows(x3: jax.Array, c: jax.Array) -> jax.Array:
    """Row b's chunk c[b] of a chunked [C, S, B] array: [B, S]."""
    return x3[c, :, jnp.arange(x3.shape[2])]


def _argmax_chunked(x3: jax.Array) -> jax.Array:
    """First argmax of a chunked [C, S, B] array as a flat index [B]: the first chunk holding the
    maximum, then the first position in it. A small argmax over C chunk maxima plus one over S
    values is ~7x faster on XLA:CPU than one argmax over a 152k vocabulary."""
    c = jnp.argmax(jnp.max(x3, axis=1), axis=0)  # [B]
    return (c * x3.shape[1] + jnp.argmax(_chunk_rows(x3, c), axis=-1)).astype(jnp.int32)


def first_argmax(x: jax.Array) -> jax.Array:
    """jnp.argmax over the last axis of [B, V] (first index on ties), computed chunk-wise."""
    return jnp.minimum(_argmax_chunked(_chunked(x.T, -jnp.inf)), x.shape[-1] - 1)


def _order_key(x: jax.Array) -> jax.Array:
    """float32 -> uint32 with the same order (so a threshold can be bisected on integers)."""
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(1 << 31))


def _bisect(ok, lo: jax.Array, hi: jax.Array) -> jax.Array:
    """Largest uint32 t in [lo, hi] with ok(t) (ok monotone non-increasing, ok(lo) true)."""
    def step(_, bounds):
        lo, hi = bounds
        gap = hi - lo
        mid = lo + (gap >> 1) + (gap & 1)
        good = ok(mid) & (lo < hi)
        return jnp.where(good, mid, lo), jnp.where(good | (lo >= hi), hi, mid - 1)
    return jax.lax.fori_loop(0, 33, step, (lo, hi))[0]


def _threshold_by_bisection(scaled: jax.Array, top_p: jax.Array, k: jax.Array) -> jax.Array:
    """Exact keep-threshold (as an order key [B]) for any k and top_p: the k-th largest value by
    bisection on counts, then the top-p value by bisection on the mass of the top-k
    renormalised distribution. 2 x 33 passes over [B, V]: the fallback of the fast path."""
    key = _order_key(scaled)  # [B, V]
    lo, hi = jnp.min(key, axis=-1), jnp.max(key, axis=-1)
    tk = _bisect(lambda t: jnp.sum(key >= t[:, None], axis=-1) >= k, lo, hi)
    in_k = key >= tk[:, None]
    logz = jax.nn.logsumexp(jnp.where(in_k, scaled, -jnp.inf), axis=-1)
    p = jnp.where(in_k, jnp.exp(scaled - logz[:, None]), 0.0)
    tp = _bisect(lambda t: jnp.sum(jnp.where(key >= t[:, None], p, 0.0), axis=-1) >= top_p, tk, hi)
    return jnp.where(top_p >= 1.0, tk, tp)


def _threshold_from_top(top: jax.Array, logz_all: jax.Array, top_p: jax.Array, k: jax.Array):
    """Keep-threshold from the sorted top values top [B, K] when they decide it.

    Returns (threshold value [B], decided [B]). With k <= K the top-k set and its normaliser
    are in `top`; with k = V (no top-k) the normaliser is the full one and the top-p set must
    end inside `top`. Anything else (K < k < V, or a flat distribution) is left undecided."""
    kk = top.shape[-1]
    v_all = k >= jnp.iinfo(jnp.int32).max  # marker for "no top-k"
    idx = jnp.arange(kk)[None, :]
    in_k = idx < jnp.minimum(k, kk)[:, None]
    logz = jnp.where(v_all, logz_all, jax.nn.logsumexp(jnp.where(in_k, top, -jnp.inf), axis=-1))
    p = jnp.where(in_k, jnp.exp(top - logz[:, None]), 0.0)
    mass_before = jnp.cumsum(p, axis=-1) - p
    keep = in_k & ((top_p[:, None] >= 1.0) | (mass_before < top_p[:, None]))
    n_keep = jnp.maximum(jnp.sum(keep, axis=-1), 1)
    thresh = jnp.take_along_axis(top, (n_keep - 1)[:, None], axis=-1)[:, 0]
    decided = jnp.where(v_all, (top_p < 1.0) & (jnp.sum(p, axis=-1) >= top_p), k <= kk)
    return thresh, decided


def truncate(scaled: jax.Array, top_p: jax.Array, top_k: jax.Array, logz: Optional[jax.Array] = None,
             fast_k: int = _FAST_K) -> jax.Array:
    """Sets logits outside each row's top-k / top-p set to -inf. scaled [B, V] (already / T);
    logz [B] = logsumexp(scaled) if known.

    Exact (up to float ties at the threshold, which are all kept): the threshold is read off
    lax.top_k(fast_k) when that decides it (peaked distributions: almost always), otherwise
    found by bisection (see _threshold_by_bisection); a full sort of a 152k vocabulary would
    cost ~30 ms per row on CPU."""
    return _keep(scaled, *truncation_threshold(scaled, top_p, top_k, logz, fast_k))


def _keep(x: jax.Array, cut: jax.Array, key: jax.Array) -> jax.Array:
    """x [B, N] with the values below row b's threshold key[b] set to -inf where cut[b]."""
    return jnp.where(~cut[:, None] | (_order_key(x) >= key[:, None]), x, -jnp.inf)


def _top_values(x: jax.Array, k: int, vocab_shards: int = 1) -> jax.Array:
    """lax.top_k(x, k) values [B, k] of [B, V]; split over `vocab_shards` devices by V, each
    device's own top k first, so only [B, shards * k] values cross the links, not [B, V]."""
    b, v = x.shape
    if vocab_shards <= 1 or v % vocab_shards or v // vocab_shards < k:
        return jax.lax.top_k(x, k)[0]
    local = jax.lax.top_k(x.reshape(b, vocab_shards, v // vocab_shards), k)[0]  # [B, shards, k]
    return jax.lax.top_k(local.reshape(b, vocab_shards * k), k)[0]


def truncation_threshold(scaled: jax.Array, top_p: jax.Array, top_k: jax.Array, logz: Optional[jax.Array] = None,
                         fast_k: int = _FAST_K, vocab_shards: int = 1) -> tuple[jax.Array, jax.Array]:
    """`truncate`'s decision without applying it: (needs [B] bool, threshold [B] as an order key);
    row b keeps the values whose `_order_key` is >= threshold[b] when needs[b], else all."""
    v = scaled.shape[-1]
    needs = ((top_k > 0) & (top_k < v)) | (top_p < 1.0)  # [B]
    k = jnp.where((top_k > 0) & (top_k < v), top_k, jnp.iinfo(jnp.int32).max).astype(jnp.int32)
    logz = jax.nn.logsumexp(scaled, axis=-1) if logz is None else logz
    top = _top_values(scaled, min(fast_k, v), vocab_shards)  # [B, K] descending
    thresh, decided = _threshold_from_top(top, logz, top_p, k)
    key = jax.lax.cond(jnp.any(needs & ~decided),
                       lambda: jnp.where(decided, _order_key(thresh),
                                         _threshold_by_bisection(scaled, top_p, jnp.minimum(k, v))),
                       lambda: _order_key(thresh))
    return needs, key


def sample(logits: jax.Array, temperature: jax.Array, top_p: jax.Array, top_k: jax.Array,
           seeds: jax.Array, positions: jax.Array, truncation: bool = True) -> tuple[jax.Array, jax.Array]:
    """Draws one token per row. logits [B, V] fp32; per-row params [B]; positions [B] = the
    sequence index of the token being drawn. Returns (tokens [B] int32, logprobs [B] fp32).
    The engine's kernels call `sample_vocab_major` on [V, B] logits (see there) directly."""
    return sample_vocab_major(logits.T, temperature, top_p, top_k, seeds, positions, truncation)


def inverse_temperature(temperature: jax.Array) -> jax.Array:
    """1 / T per row, 1 for greedy rows (T = 0 or subnormal): what the sampler scales logits by
    and what `chunk_stats` (or the decode kernel that computes them) must be given."""
    greedy = temperature < jnp.finfo(jnp.float32).tiny  # 0, or subnormal (flushed to 0 on some backends)
    return jnp.where(greedy, 1.0, 1.0 / jnp.where(greedy, 1.0, temperature)).astype(jnp.float32)


def chunk_stats(logits: jax.Array, inv_temperature: jax.Array, s: int = CHUNK) -> tuple[jax.Array, jax.Array]:
    """Per vocabulary chunk of s rows (CHUNK, or `vocab_chunk` for split logits) and per row of
    vocabulary-major logits [V, B]: the maximum M [C, B] and sum(exp((logits - M) * inv_temperature))
    [C, B]. All the sampler needs of the whole vocabulary; `kernels.cpu.gemm.vocab_logits` computes the same while it projects."""
    l3 = _chunked(logits.astype(jnp.float32), -jnp.inf, s)  # [C, S, B]
    cmax = jnp.max(l3, axis=1)
    shift = jnp.where(jnp.isfinite(cmax), cmax, 0.0)  # a chunk of -inf logits sums to 0, not nan
    return cmax, jnp.sum(jnp.exp((l3 - shift[:, None]) * inv_temperature), axis=1)


def _chunk_of(logits: jax.Array, c: jax.Array, s: int = CHUNK, local: bool = False) -> jax.Array:
    """Row b's chunk c[b] of vocabulary-major logits [V, B]: [B, S], -inf past the vocabulary.
    local: a masked sum over the chunks instead of a gather, so logits split over devices by
    vocabulary are reduced where they lie ([S, B] crosses the links, not [V, B])."""
    v, b = logits.shape
    s = min(s, v)
    if local:
        l3 = _chunked(logits, -jnp.inf, s)  # [C, S, B]
        pick = (jnp.arange(l3.shape[0])[:, None] == c[None, :])[:, None, :]  # [C, 1, B]
        return jnp.sum(jnp.where(pick, l3, 0.0), axis=0).T
    idx = c[:, None] * s + jnp.arange(s)[None, :]  # [B, S]
    vals = logits[jnp.minimum(idx, v - 1), jnp.arange(b)[:, None]]
    return jnp.where(idx < v, vals, -jnp.inf)


def _token_logits(logits: jax.Array, tokens: jax.Array, local: bool) -> jax.Array:
    """logits[tokens[b], b] [B] (local: a masked sum, as in `_chunk_of`)."""
    if local:
        return jnp.sum(jnp.where(jnp.arange(logits.shape[0])[:, None] == tokens[None, :], logits, 0.0), axis=0)
    return logits[tokens, jnp.arange(logits.shape[1])]


def sample_vocab_major(logits: jax.Array, temperature: jax.Array, top_p: jax.Array, top_k: jax.Array,
                       seeds: jax.Array, positions: jax.Array, truncation: bool = True,
                       stats: Optional[tuple[jax.Array, jax.Array]] = None,
                       vocab_shards: int = 1) -> tuple[jax.Array, jax.Array]:
    """`sample` on vocabulary-major logits [V, B] (what the decode projection writes on XLA:CPU,
    where transposing it to [B, V] cost ~1.7 ms per step at 16 x 151936).

    Everything is read off the per-chunk statistics `stats` = `chunk_stats(logits,
    inverse_temperature(temperature))` (computed here when not given; the CPU decode kernel
    hands them over) and one chunk per row: the greedy token is the first maximum of the first
    chunk holding the row maximum m, logz = logsumexp over chunks of (M - m) / T + log(sum), and
    the logprob is (logits[token] - m) / T - logz. The draw is a two-level Gumbel-max, exact for
    softmax(truncated logits / T): a chunk c of the vocabulary with probability sum_c p
    (Gumbel-max over the C chunk log-masses), then a token inside it with probability
    p_i / sum_c p (Gumbel-max over its S logits). It needs C + S noise values per row instead of
    V (~180x fewer on a 152k vocabulary). Truncation and noise are skipped at run time
    (lax.cond) when no row needs them, so a greedy batch never reads the [V, B] logits whole
    once the statistics are known. truncation=False (static) leaves the top-k / top-p code out of
    the program: the caller guarantees no row uses them (merely present, XLA:CPU charges it ~5 ms
    per call on a 152k vocabulary).

    vocab_shards > 1 (static): the logits are split over that many devices along V (the engine's
    tensor axis); chunks then follow the split (`vocab_chunk`) and every read of one row's chunk
    or token is a masked reduction, so the draw is the same as unsplit and only [B]- and
    [S, B]-sized values cross the links.
    """
    logits = logits.astype(jnp.float32)
    v, b = logits.shape
    local = vocab_shards > 1
    s = vocab_chunk(v, vocab_shards)
    greedy = temperature < jnp.finfo(jnp.float32).tiny
    inv_t = inverse_temperature(temperature)
    cmax, csum = chunk_stats(logits, inv_t, s) if stats is None else stats  # [C, B] each
    top_chunk = jnp.argmax(cmax, axis=0)  # [B] first chunk holding the maximum
    greedy_tok = (top_chunk * min(s, v) + jnp.argmax(_chunk_of(logits, top_chunk, s, local), axis=-1)).astype(jnp.int32)
    # Scaled logits are taken relative to the row maximum m, so the top token sits at exactly 0
    # and every other one below it (dividing unshifted logits by a tiny T gave values ~1e7 whose
    # last bits differed between fusions: logprobs came out positive, or inf / nan at T = 1e-30).
    m = jnp.max(cmax, axis=0)  # [B], = cmax[top_chunk]
    chunk_logz = (cmax - m[None, :]) * inv_t[None, :] + jnp.log(csum)  # [C, B], the top chunk's >= 0
    logz = jax.nn.logsumexp(chunk_logz, axis=0)  # [B], >= 0

    def draw(_):
        needs = (~greedy) & (((top_k > 0) & (top_k < v)) | (top_p < 1.0))

        def truncated():  # the threshold works row-major on the whole vocabulary: [B, V]
            scaled = ((logits - m[None, :]) * inv_t[None, :]).T
            cut, key = truncation_threshold(scaled, jnp.where(needs, top_p, 1.0), jnp.where(needs, top_k, 0), logz,
                                            vocab_shards=vocab_shards)
            return cut, key, jax.nn.logsumexp(_chunked(_keep(scaled, cut, key).T, -jnp.inf, s), axis=1)

        untruncated = lambda: (jnp.zeros(b, bool), jnp.zeros(b, jnp.uint32), chunk_logz)
        cut, key, mlogz = (jax.lax.cond(jnp.any(needs), truncated, untruncated) if truncation
                           else untruncated())
        keys = jax.vmap(lambda s, p: jax.random.split(jax.random.fold_in(jax.random.PRNGKey(s), p)))(
            seeds.astype(jnp.uint32), positions.astype(jnp.int32))  # [B, 2, key]
        c_noise = jax.vmap(lambda k: jax.random.gumbel(k, mlogz.shape[:1], jnp.float32))(keys[:, 0])  # [B, C]
        c = jnp.argmax(mlogz.T + c_noise, axis=-1)  # [B]
        row = _keep((_chunk_of(logits, c, s, local) - m[:, None]) * inv_t[:, None], cut, key)  # [B, S]
        s_noise = jax.vmap(lambda k: jax.random.gumbel(k, row.shape[-1:], jnp.float32))(keys[:, 1])
        return (c * row.shape[-1] + jnp.argmax(row + s_noise, axis=-1)).astype(jnp.int32)

    drawn = jax.lax.cond(jnp.all(greedy), lambda _: greedy_tok, draw, None)
    tokens = jnp.minimum(jnp.where(greedy, greedy_tok, drawn), v - 1)
    logprobs = (_token_logits(logits, tokens, local) - m) * inv_t - logz
    return tokens, logprobs
