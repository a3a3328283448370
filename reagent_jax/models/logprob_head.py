"""The output head as the trainer uses it: token logprobs (and entropies) from final hidden states,
in chunks along time, and a fused head + per-token loss whose weight gradients are computed in
the forward pass.

Why two paths. The output projection dominates a small model's training FLOPs (Qwen3's 151936-row
vocabulary: 2 x 151936 x E per token, ~6x a 0.6B model's layer stack at E=1024), and its [B, T, V]
logits never fit in memory whole. `chunked_logprobs` rematerialises each chunk's logits in the
backward pass: forward, recompute, dh, dW = 4 head matmuls per token. When the loss is a weighted
sum of *per-token* terms of (logprob, entropy) -- SFT's NLL, GRPO with a per-token policy loss, a
KL penalty and an entropy bonus, under a linear aggregation -- each chunk's loss gradient is known
as soon as its logits are: `fused_head_loss` takes dh and dW right there (Liger's fused linear
cross-entropy, generalised to any per-token loss through autodiff), 3 matmuls and one pass over the
logits, and the backward pass only scales them (BENCHMARKS.md: the CPU GRPO update 1.6-2.5x faster,
where the passes over the [T, V] logits, more than the matmuls, were the cost). Sequence-level
losses (GSPO, DPO) need every chunk's logprobs first and keep the chunked path.

On a mesh the projection and the log-softmax run vocabulary-parallel: the weight is split over
`logits_vocab` once for all chunks, each chip computes logits [B, C, V / shards], and the
normaliser, target logit and entropy are reduced over the shards as [B, C] partial sums.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from reagent_jax.kernels import logits as logits_kernels
from reagent_jax.models.config import Qwen3Config
from reagent_jax.parallel.rules import Rules, constrain

# (logprobs [B, C], entropies [B, C] or None, this chunk of the aux arrays) -> this chunk's loss []
TokenLossFn = Callable[[jax.Array, Optional[jax.Array], Any], jax.Array]


class HeadSpec(NamedTuple):
    """The static part of a head computation (hashable: a custom_vjp's non-differentiable argument)."""
    cfg: Qwen3Config
    temperature: float
    chunk_size: int
    mesh: Optional[Mesh]
    rules: Rules
    with_entropy: bool

    @property
    def vocab_parallel(self) -> bool:
        return self.mesh is not None and self.mesh.size > 1


def head_weight_key(cfg: Qwen3Config) -> str:
    """The params entry the output projection reads: the tied embedding [V, E] or the head [E, V]."""
    return "embed" if cfg.tie_word_embeddings else "lm_head"


def compute_weight(spec: HeadSpec, w: jax.Array) -> jax.Array:
    """The output weight in the compute dtype, split over the vocabulary on a mesh -- once for all
    chunks: the chunks then all-gather only their hidden rows ([B, C, E], small) instead of the
    whole head, and the head's gradient stays vocabulary-sharded until it meets the params' layout."""
    return _vocab_split(spec, w.astype(spec.cfg.jnp_dtype))


def _vocab_split(spec: HeadSpec, w: jax.Array) -> jax.Array:
    if not spec.vocab_parallel:
        return w
    axes = ("logits_vocab", None) if spec.cfg.tie_word_embeddings else (None, "logits_vocab")
    return constrain(w, axes, spec.mesh, spec.rules)


def chunk_logits(spec: HeadSpec, w: jax.Array, hc: jax.Array) -> jax.Array:
    """hc [B, C, E], w from `compute_weight` -> logits / temperature [B, C, V] fp32, vocabulary-
    sharded when the head is."""
    mesh, rules = spec.mesh, spec.rules
    if spec.vocab_parallel:
        hc = constrain(hc, ("logits_batch", None, None), mesh, rules)
    logits = logits_kernels.project(hc.astype(spec.cfg.jnp_dtype), w, spec.cfg.tie_word_embeddings, mesh)
    logits = logits / spec.temperature
    if spec.vocab_parallel:
        logits = constrain(logits, ("logits_batch", None, "logits_vocab"), mesh, rules)
    return logits


def chunk_logprobs(spec: HeadSpec, w: jax.Array, hc: jax.Array, tc: jax.Array):
    """hc [B, C, E], targets tc [B, C], w from `compute_weight` -> (logprobs [B, C], entropies [B, C]
    or None) of softmax(logits / temperature)."""
    logits = chunk_logits(spec, w, hc)  # [B, C, V] fp32
    if spec.vocab_parallel:
        # a masked sum reduces over the vocabulary shards; a gather would collect the logits first
        vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
        target = jnp.sum(jnp.where(vocab == tc[..., None], logits, 0.0), axis=-1)
    else:
        target = jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0]
    if not spec.with_entropy:
        return target - jax.nn.logsumexp(logits, axis=-1), None
    # One exp pass feeds both the normaliser and the entropy (H = lse - E_p[logits]).
    m = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    e = jnp.exp(logits - m)
    z = jnp.sum(e, axis=-1)
    ent = jnp.log(z) - jnp.sum(e * (logits - m), axis=-1) / z  # relative to m: no lse-sized cancellation
    return target - (m[..., 0] + jnp.log(z)), ent


def _to_chunks(x: jax.Array, c: int) -> jax.Array:
    """[B, T, ...] -> [n, B, C, ...], zero-padded to a whole number of chunks."""
    b, t = x.shape[:2]
    n = -(-t // c)
    x = jnp.pad(x, [(0, 0), (0, n * c - t)] + [(0, 0)] * (x.ndim - 2))
    return x.reshape(b, n, c, *x.shape[2:]).swapaxes(0, 1)


def _from_chunks(x: jax.Array, t: int) -> jax.Array:
    """[n, B, C, ...] -> [B, T, ...]."""
    n, b, c = x.shape[:3]
    return x.swapaxes(0, 1).reshape(b, n * c, *x.shape[3:])[:, :t]


def chunked_logprobs(spec: HeadSpec, w: jax.Array, h: jax.Array, targets: jax.Array):
    """h [B, T, E], targets [B, T], w the params' output weight -> (logprobs [B, T], entropies
    [B, T] or None). Differentiable; each chunk's logits are rematerialised in the backward pass."""
    t = h.shape[1]
    c = min(spec.chunk_size, t)
    wc = compute_weight(spec, w)
    one = jax.checkpoint(lambda hc, tc: chunk_logprobs(spec, wc, hc, tc))
    lp, ent = jax.lax.map(lambda a: one(*a), (_to_chunks(h, c), _to_chunks(targets, c)))  # [n, B, C]
    return _from_chunks(lp, t), (None if ent is None else _from_chunks(ent, t))


def chunked_top_logprobs(spec: HeadSpec, w: jax.Array, h: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """h [B, T, E] -> the k most likely next tokens at every position: (logprobs [B, T, k], ids
    [B, T, k] int32), best first, of softmax(logits / temperature) over the whole vocabulary. Only
    [B, C, V] logits of one chunk exist at a time (what OpenAI's `top_logprobs` needs)."""
    t = h.shape[1]
    c = min(spec.chunk_size, t)
    wc = compute_weight(spec, w)

    def one(hc):  # [B, C, E] -> ([B, C, k], [B, C, k])
        logits = chunk_logits(spec, wc, hc)  # [B, C, V]
        values, ids = jax.lax.top_k(logits, k)
        return values - jax.nn.logsumexp(logits, axis=-1, keepdims=True), ids.astype(jnp.int32)

    lp, ids = jax.lax.map(one, _to_chunks(h, c))  # [n, B, C, k] each
    return _from_chunks(lp, t), _from_chunks(ids, t)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def fused_head_loss(spec: HeadSpec, token_loss: TokenLossFn, h: jax.Array, w: jax.Array, targets: jax.Array,
                    aux: Any):
    """(loss [], logprobs [B, T], entropies [B, T] or None) of h [B, T, E], the params' output weight
    w and targets [B, T]; loss = sum over chunks of token_loss(logprobs, entropies, aux chunk), where
    `aux` is a pytree of [B, T, ...] arrays chunked alongside (old logprobs, advantages, weights).

    `token_loss` must be a sum of per-token terms (each token's term depending on that token's
    logprob and entropy only): its gradient is taken chunk by chunk in the forward pass. Only the
    loss is differentiable: logprobs and entropies are returned for metrics, without gradient.
    Called without differentiation (an evaluation loss) it computes the forward only."""
    t = h.shape[1]
    c = min(spec.chunk_size, t)
    wc = compute_weight(spec, w)

    def one(chunk):
        hc, tc, ac = chunk
        lp, ent = chunk_logprobs(spec, wc, hc, tc)
        return token_loss(lp, ent, ac), lp, ent

    losses, lp, ent = jax.lax.map(one, _chunked_inputs(h, targets, aux, c))
    return jnp.sum(losses), _from_chunks(lp, t), None if ent is None else _from_chunks(ent, t)


def _chunked_inputs(h, targets, aux, c):
    return _to_chunks(h, c), _to_chunks(targets, c), jax.tree.map(lambda a: _to_chunks(a, c), aux)


def _fused_forward(spec, token_loss, h, w, targets, aux):
    t = h.shape[1]
    c = min(spec.chunk_size, t)
    wc = compute_weight(spec, w)

    def chunk_loss(hc, wc, tc, ac):
        lp, ent = chunk_logprobs(spec, wc, hc, tc)
        return token_loss(lp, ent, ac), (lp, ent)

    def step(dw, chunk):
        hc, tc, ac = chunk
        (loss, (lp, ent)), (dh, dwc) = jax.value_and_grad(chunk_loss, argnums=(0, 1), has_aux=True)(hc, wc, tc, ac)
        return dw + dwc, (loss, lp, ent, dh)

    # Accumulated over the chunks in the compute dtype, as autodiff of the rematerialised path does:
    # an fp32 accumulator would be one more weight-sized buffer, live until the backward pass
    # (+0.58 GiB per chip for Qwen3-0.6B's head on one v5e chip).
    dw0 = _vocab_split(spec, jnp.zeros(wc.shape, wc.dtype))
    dw, (losses, lp, ent, dh) = jax.lax.scan(step, dw0, _chunked_inputs(h, targets, aux, c))
    out = (jnp.sum(losses), _from_chunks(lp, t), None if ent is None else _from_chunks(ent, t))
    dh = _from_chunks(dh, t).astype(h.dtype)
    if spec.mesh is not None:  # hand the layers their activations' layout, not the chunks' (else XLA
        # may carry the chunk layout into the layers' backward and gather activations there)
        dh = constrain(dh, ("batch", "act_len", "act_embed"), spec.mesh, spec.rules)
    return out, (dh, dw, jnp.zeros((0,), w.dtype))  # the empty array carries w's dtype to the backward


def _fused_backward(spec, token_loss, residuals, cotangents):
    dh, dw, w_dtype = residuals
    g = cotangents[0]  # the loss's; logprobs and entropies carry none by contract
    return g.astype(dh.dtype) * dh, g.astype(w_dtype.dtype) * dw.astype(w_dtype.dtype), None, None


fused_head_loss.defvjp(_fused_forward, _fused_backward)
