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
`transformers` and vLLM); the drawn token is argmax(truncated logits / T + Gumbel noise).
"""
from __future__ import annotations

import dataclasses
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
    the turn ends with the token that completes the match.
    """
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    seed: Optional[int] = None
    stop_token_ids: Sequence[int] = ()
    stop_strings: Sequence[str] = ()

    def __post_init__(self):
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if isinstance(self.stop_strings, str):
            object.__setattr__(self, "stop_strings", (self.stop_strings,))
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        self.validate()

    def validate(self, vocab_size: Optional[int] = None, where: str = "SamplingParams") -> None:
        """Raises ValueError naming the bad field (and `where`, e.g. the request index)."""
        def bad(msg):
            raise ValueError(f"{where}: {msg}")
        if not (isinstance(self.temperature, (int, float)) and self.temperature >= 0):
            bad(f"temperature={self.temperature!r} must be a number >= 0 (0 = greedy)")
        if not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            bad(f"top_p={self.top_p!r} must be in (0, 1]")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            bad(f"top_k={self.top_k!r} must be an int >= 0 (0 = no top-k)")
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            bad(f"max_new_tokens={self.max_new_tokens!r} must be an int >= 1")
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed < SEED_LIMIT):
            bad(f"seed={self.seed!r} must be None or an int in [0, 2**32)")
        for t in self.stop_token_ids:
            if t < 0 or (vocab_size is not None and t >= vocab_size):
                bad(f"stop token id {t} is outside the vocabulary [0, {vocab_size})")
        for s in self.stop_strings:
            if not isinstance(s, str) or not s:
                bad(f"stop string {s!r} must be a non-empty str")

    def replace(self, **kw) -> "SamplingParams":
        return dataclasses.replace(self, **kw)


def first_argmax(x: jax.Array) -> jax.Array:
    """jnp.argmax over the last axis (first index on ties), as max + masked min: two vectorised
    passes, several times faster than XLA:CPU's variadic argmax over a 152k vocabulary."""
    v = x.shape[-1]
    hit = x == jnp.max(x, axis=-1, keepdims=True)
    idx = jnp.min(jnp.where(hit, jnp.arange(v, dtype=jnp.int32), v), axis=-1)
    return jnp.minimum(idx, v - 1)  # all-NaN rows: a valid id rather than v


def _truncation_threshold(scaled: jax.Array, top_p: jax.Array, top_k: jax.Array) -> jax.Array:
    """Smallest kept scaled logit per row after top-k then top-p. scaled [B, V] -> [B]."""
    v = scaled.shape[-1]
    srt = -jnp.sort(-scaled, axis=-1)  # [B, V] descending
    idx = jnp.arange(v)[None, :]
    k = jnp.where(top_k > 0, jnp.minimum(top_k, v), v)[:, None]  # [B, 1]
    in_k = idx < k
    p = jax.nn.softmax(jnp.where(in_k, srt, -jnp.inf), axis=-1)  # renormalised over the top k
    mass_before = jnp.cumsum(p, axis=-1) - p
    keep = in_k & ((top_p[:, None] >= 1.0) | (mass_before < top_p[:, None]))
    n_keep = jnp.maximum(jnp.sum(keep, axis=-1), 1)  # [B]; the top token is always kept
    return jnp.take_along_axis(srt, (n_keep - 1)[:, None], axis=-1)[:, 0]


def truncate(scaled: jax.Array, top_p: jax.Array, top_k: jax.Array) -> jax.Array:
    """Sets logits outside each row's top-k / top-p set to -inf. scaled [B, V] (already / T)."""
    v = scaled.shape[-1]
    needs = ((top_k > 0) & (top_k < v)) | (top_p < 1.0)  # [B]
    thresh = _truncation_threshold(scaled, top_p, top_k)
    thresh = jnp.where(needs, thresh, -jnp.inf)
    return jnp.where(scaled >= thresh[:, None], scaled, -jnp.inf)


def sample(logits: jax.Array, temperature: jax.Array, top_p: jax.Array, top_k: jax.Array,
           seeds: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Draws one token per row. logits [B, V] fp32; per-row params [B]; positions [B] = the
    sequence index of the token being drawn. Returns (tokens [B] int32, logprobs [B] fp32).

    The sort (truncation) and the Gumbel noise are skipped at run time (lax.cond) when no row
    needs them, so greedy batches pay for one argmax and one logsumexp only.
    """
    logits = logits.astype(jnp.float32)
    v = logits.shape[-1]
    greedy = temperature <= 0
    t = jnp.where(greedy, 1.0, temperature).astype(jnp.float32)
    scaled = logits / t[:, None]
    logz = jax.nn.logsumexp(scaled, axis=-1)
    greedy_tok = first_argmax(logits)

    def draw(_):
        needs = (~greedy) & (((top_k > 0) & (top_k < v)) | (top_p < 1.0))
        masked = jax.lax.cond(jnp.any(needs), lambda s: truncate(s, jnp.where(greedy, 1.0, top_p), top_k),
                              lambda s: s, scaled)
        keys = jax.vmap(lambda s, p: jax.random.fold_in(jax.random.PRNGKey(s), p))(
            seeds.astype(jnp.uint32), positions.astype(jnp.int32))
        noise = jax.vmap(lambda k: jax.random.gumbel(k, (v,), jnp.float32))(keys)
        return first_argmax(masked + noise)

    drawn = jax.lax.cond(jnp.all(greedy), lambda _: greedy_tok, draw, None)
    tokens = jnp.where(greedy, greedy_tok, drawn)
    logprobs = jnp.take_along_axis(scaled, tokens[:, None], axis=-1)[:, 0] - logz
    return tokens, logprobs

