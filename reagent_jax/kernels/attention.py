"""Which attention kernel runs, by `Qwen3Config.attention` and the mesh's devices (never the
host's backend, so a CPU host compiling for TPU traces the TPU kernels).

Cache-free causal attention (training, scoring, reference logprobs), by `choose`:

  xla     `xla_attention.causal_attention`: causal query blocks through XLA (every backend)
  splash  TPU splash attention (`tpu.splash`); off TPU in Pallas interpret mode (tests only)
  cudnn   cuDNN flash attention on NVIDIA GPUs (`gpu.cudnn`), bf16/fp16 compute
  auto    splash on a TPU mesh when the length is a multiple of 128, cudnn on a GPU mesh when
          cuDNN takes the compute dtype and head dim, else xla

One-token decode over the KV cache, by `choose_decode`:

  xla     every slot attends over the whole cache window (a static bucket set by the longest
          live slot), masked past its length: bytes per step = slots x window
  ragged  TPU (`auto` on a TPU mesh): `tpu.ragged_decode` reads each slot's cache only up to
          its own length: bytes per step = the live KV; from a paged pool (`kv_pages`) too

Prefill (several new tokens over the cache) keeps XLA attention.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from reagent_jax.kernels import xla_attention
from reagent_jax.kernels.gpu import cudnn
from reagent_jax.kernels.tpu import ragged_decode, splash
from reagent_jax.parallel.mesh import mesh_platform
from reagent_jax.parallel.rules import DEFAULT_RULES, Rules

ATTENTION_IMPLS = ("auto", "xla", "splash", "cudnn")


def choose(impl: str, mesh: Optional[Mesh], length: int, dtype, head_dim: int) -> str:
    """The kernel ("xla", "splash" or "cudnn") that runs causal attention over `length` tokens
    computing in `dtype` with heads of `head_dim` on `mesh`."""
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention={impl!r}; choose one of {ATTENTION_IMPLS}")
    platform = mesh_platform(mesh)
    if impl == "auto":
        if platform == "tpu" and length % 128 == 0:
            return "splash"
        if platform == "gpu" and cudnn.supports(dtype, head_dim) is None:
            return "cudnn"
        return "xla"
    if impl == "splash" and length % 128:
        raise ValueError(f"attention='splash' needs a length that is a multiple of 128, got {length} "
                         "(bucket the sequence lengths, or use attention='auto')")
    if impl == "cudnn":
        why = (f"it runs on NVIDIA GPUs, and this program runs on {platform}" if platform != "gpu"
               else cudnn.supports(dtype, head_dim))
        if why:
            raise ValueError(f"attention='cudnn': {why} (use attention='auto' to fall back to xla)")
    return impl


def choose_decode(impl: str, mesh: Optional[Mesh]) -> str:
    """The one-token decode attention ("xla" or "ragged") on `mesh`: ragged on TPU unless the
    config asks for xla."""
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention={impl!r}; choose one of {ATTENTION_IMPLS}")
    return "ragged" if impl != "xla" and mesh_platform(mesh) == "tpu" else "xla"


def kernels_report(cfg, mesh: Optional[Mesh]) -> dict[str, str]:
    """What a run's attention runs on, for its metadata (summary.json): the platform, the causal
    kernel at bucketed lengths (multiples of 128) and the one-token decode kernel, for the model
    config's `attention`, compute dtype and head dim on `mesh`."""
    return {"platform": mesh_platform(mesh), "attention": cfg.attention,
            "causal": choose(cfg.attention, mesh, 128, jnp.dtype(cfg.compute_dtype), cfg.head_dim),
            "decode": choose_decode(cfg.attention, mesh)}


class LayerCache(NamedTuple):
    """One layer's view of the KV cache: the whole (k, v) caches ([L, ...] in `kv_layout.order`)
    and the layer's index. The whole arrays, not a slice: a kernel (a custom call) given a
    layer's slice would get it as a copy of that layer, read whole in every step."""
    k: jax.Array
    v: jax.Array
    layer: jax.Array  # int32 []
    pages: Optional[jax.Array] = None  # a paged pool's block table [N, S / page] (`kv_pages`)


def causal_attention(impl: str, qg: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float,
                     mesh: Optional[Mesh] = None, rules: Rules = DEFAULT_RULES) -> jax.Array:
    """Softmax attention without a cache: qg [b,t,k,g,d] over k, v [b,t,k,d] by the causal mask
    [b,t,t] -> [b,t,k,g,d], by the kernel `choose(impl, mesh, t, qg.dtype, d)` picks."""
    kernel = choose(impl, mesh, qg.shape[1], qg.dtype, qg.shape[-1])
    if kernel == "xla":
        return xla_attention.causal_attention(qg, k, v, mask, scale, mesh)
    key_valid = jnp.diagonal(mask, axis1=1, axis2=2)  # [b, t]: a causal mask's diagonal is its valid keys
    fn = splash.splash_attention if kernel == "splash" else cudnn.cudnn_attention
    return fn(qg, k, v, key_valid, scale, mesh, rules)


def cached_attention(impl: str, qg: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, cache: LayerCache,
                     write_index: jax.Array, slot_ids: Optional[jax.Array], scale: float, dtype,
                     mesh: Optional[Mesh] = None, rules: Rules = DEFAULT_RULES) -> jax.Array:
    """This call's tokens qg [b,t,k,g,d] (their own k, v [b,t,k,d], causal `mask` [b,t,t]) over one
    layer of the cache plus themselves (`xla_attention.cached_attention`); one-token decode of
    every slot on TPU by the ragged kernel (`choose_decode`)."""
    if qg.shape[1] == 1 and slot_ids is None and choose_decode(impl, mesh) == "ragged":
        return ragged_decode.ragged_decode(qg, cache.k, cache.v, cache.layer, k, v, write_index, scale, mesh, rules,
                                           pages=cache.pages)
    if cache.pages is not None:
        raise ValueError("a paged KV pool is read in place only by the ragged decode kernel; XLA attention reads "
                         "a window gathered from it (`kernels.kv_pages.gather`)")
    return xla_attention.cached_attention(qg, k, v, mask, cache.k, cache.v, cache.layer, write_index, slot_ids, scale,
                                          dtype, mesh)
