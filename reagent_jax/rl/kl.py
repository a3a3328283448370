"""Per-token KL estimators against a reference policy, and token entropy from logits.

Estimators (Schulman, "Approximating KL divergence"; names as in verl's ``kl_penalty``), with
``d = logp - ref_logp`` for tokens sampled from the current policy:
  k1 ("kl")              d                        unbiased, high variance, can be negative
  abs                    |d|
  k2 ("mse")             0.5 * d**2
  k3 ("low_var_kl")      exp(-d) - (-d) - 1       unbiased, low variance, >= 0 (GRPO's choice)
k3 clamps ``-d`` to [-20, 20] before ``exp`` (as verl) and is evaluated in float32 (bfloat16 inputs
are upcast) without cancellation, so its ~d**2/2 value (and gradient ~d) survive for small ``d``
instead of rounding to 0. Every estimator's output is then clamped to [-clamp, clamp] (default 10;
verl clamps only k3, the others rarely reach it). The estimators live in the ``KL_ESTIMATORS``
registry (``reagent_jax/registry.py``); register more with ``@KL_ESTIMATORS.register("name")``.

beta == 0: no KL term, so no reference model is needed at all. ``needs_reference_model(beta)``
tells the trainer whether to run (or even load) the reference forward; ``kl_penalty`` and
``kl_term`` accept ``ref_logprobs=None`` only in that case and return zeros.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from reagent_jax.registry import Registry

# d = logp - ref_logp [B, T] float32 -> per-token estimate [B, T] (before the clamp)
KL_ESTIMATORS: Registry[Callable[[jax.Array], jax.Array]] = Registry("KL estimator")


@KL_ESTIMATORS.register("k1", "kl")
def k1(d: jax.Array) -> jax.Array:
    return d


@KL_ESTIMATORS.register("abs")
def absolute(d: jax.Array) -> jax.Array:
    return jnp.abs(d)


@KL_ESTIMATORS.register("k2", "mse")
def k2(d: jax.Array) -> jax.Array:
    return 0.5 * jnp.square(d)


@KL_ESTIMATORS.register("k3", "low_var_kl")
def k3(d: jax.Array) -> jax.Array:
    return _exp_minus_linear(jnp.clip(-d, -20.0, 20.0))


def needs_reference_model(beta: float) -> bool:
    """True when a KL coefficient is in use, so reference logprobs must be computed."""
    return float(beta) != 0.0


def kl_penalty(
    logprobs: jax.Array,  # [B, T] current (or rollout) policy logprobs of the sampled tokens
    ref_logprobs: jax.Array | None,  # [B, T] reference policy logprobs, or None when beta == 0
    kind: str = "k3",
    *,
    clamp: float | None = 10.0,
) -> jax.Array:  # [B, T] per-token KL estimate
    """Per-token KL(policy || ref) estimate; zeros when ``ref_logprobs`` is None."""
    estimator = KL_ESTIMATORS.get(kind)
    if ref_logprobs is None:
        return jnp.zeros(jnp.shape(logprobs), jnp.float32)
    if jnp.shape(ref_logprobs) != jnp.shape(logprobs):
        raise ValueError(f"ref_logprobs shape {jnp.shape(ref_logprobs)} != logprobs shape {jnp.shape(logprobs)}")
    kl = estimator(jnp.asarray(logprobs, jnp.float32) - jnp.asarray(ref_logprobs, jnp.float32))
    if clamp is not None:
        kl = jnp.clip(kl, -clamp, clamp)
    return kl


def kl_term(
    logprobs: jax.Array,  # [B, T]
    ref_logprobs: jax.Array | None,  # [B, T] or None (only when beta == 0)
    beta: float,
    kind: str = "k3",
    *,
    clamp: float | None = 10.0,
) -> jax.Array:  # [B, T] beta * KL, to add to the per-token policy loss
    """beta-weighted per-token KL loss; skips the reference entirely when beta is a Python 0."""
    if isinstance(beta, (int, float)) and not needs_reference_model(beta):
        return jnp.zeros(jnp.shape(logprobs), jnp.float32)
    if ref_logprobs is None:
        raise ValueError(f"ref_logprobs is None but beta={beta!r}; reference logprobs are needed when beta != 0")
    return beta * kl_penalty(logprobs, ref_logprobs, kind, clamp=clamp)


def _exp_minus_linear(x: jax.Array) -> jax.Array:
    """exp(x) - 1 - x without cancellation: a Taylor series (error < 1e-9 relative) for |x| < 0.1.

    The direct form loses all digits for |x| < ~3e-4 in float32 (and its gradient exp(x) - 1 ~1e-3
    of them); near-identical policies are the common case for a KL penalty.
    """
    small = jnp.abs(x) < 0.1
    xs = jnp.where(small, x, 0.0)
    series = xs * xs * (1 / 2 + xs * (1 / 6 + xs * (1 / 24 + xs * (1 / 120 + xs * (1 / 720 + xs / 5040)))))
    return jnp.where(small, series, jnp.expm1(x) - x)


def entropy_from_logits(
    logits: jax.Array,  # [..., V]
    *,
    chunk_size: int | None = None,
) -> jax.Array:  # [...] float32 entropy in nats
    """Categorical entropy ``logsumexp(z) - sum softmax(z) * z``, computed in float32.

    ``-inf`` logits (masked vocabulary entries) contribute 0. With ``chunk_size`` the leading
    positions are processed ``chunk_size`` at a time (``lax.map``), so only one chunk's float32
    softmax is live at once: use it for [B, T, 151936] logits.
    """
    if logits.ndim < 1:
        raise ValueError("logits must have a vocabulary axis")
    if chunk_size is None:
        return _entropy(logits)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    lead, vocab = logits.shape[:-1], logits.shape[-1]
    flat = logits.reshape(-1, vocab)  # [N, V]
    n = flat.shape[0]
    n_chunks = -(-n // chunk_size)
    padded = jnp.pad(flat, ((0, n_chunks * chunk_size - n), (0, 0)))  # [n_chunks * C, V]
    chunks = padded.reshape(n_chunks, chunk_size, vocab)
    ent = jax.lax.map(_entropy, chunks)  # [n_chunks, C]
    return ent.reshape(-1)[:n].reshape(lead)


def _entropy(logits: jax.Array) -> jax.Array:  # [..., V] -> [...]
    z = logits.astype(jnp.float32)
    # Entropy is shift-invariant; centring on the max avoids cancelling two numbers of the logits'
    # magnitude (lse - E_p[z] loses ~4 nats at logits ~1e4 otherwise).
    m = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
    z = z - jnp.where(jnp.isfinite(m), m, 0.0)
    lse = jax.nn.logsumexp(z, axis=-1)
    p = jnp.exp(z - lse[..., None])
    pz = jnp.where(p > 0, p * jnp.where(jnp.isfinite(z), z, 0.0), 0.0)
    return lse - jnp.sum(pz, axis=-1)
