"""Every decoder layer of one decode step in one CPU kernel (`decode.cc`, fp32, AVX-512).

Why: under XLA:CPU a decode step of a small model is mostly overhead, not arithmetic. The layer
scan copies each layer's weights out of the stacked params, the attention copies its cache
window, and each of ~35 ops per layer is a fork-join over the threads: ~2.5 ms per step for the
4-layer, 256-wide `bench-256` body (~0.2 GFLOP). The kernel reads weights and cache where they
lie, writes the new K/V in place (the caches are aliased to its outputs) and splits each of seven
phases per layer (two norms, q/k/v, attention, o, gate/up, down) over the threads without a pool
task per phase: ~1.5 ms for that body inside the engine's step (BENCHMARKS.md, rollout roofline).

Same math as `models.qwen3` (RMSNorm, q/k head norms, rotate-half RoPE, GQA attention over the
row's cached positions plus its own, SwiGLU); the sums run in another order, so values agree to
fp32 rounding, not bit for bit. The rollout engine uses it for decode steps where `usable` says
so; `REAGENT_CPU_GEMM=xla` turns it off with the other CPU kernels.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from reagent_jax.kernels import kv_layout
from reagent_jax.kernels.cpu import gemm as cpu_gemm
from reagent_jax.parallel.mesh import mesh_platform


def usable(cfg, params, cache, rows: int, mesh: Optional[Mesh] = None) -> bool:
    """True when `decode_layers` can run this step: CPU with AVX-512, fp32 params, compute and
    cache, no device mesh, one cache row per token row, and widths (hidden, MLP, head dim) that are
    multiples of 16 (head dim <= 256). Decided at trace time from static facts."""
    if (cpu_gemm.mode() == "xla" or mesh_platform(mesh) != "cpu" or not kv_layout.heads_major(mesh)
            or (mesh is not None and mesh.size > 1)):
        return False
    if not cfg.qk_norm or cfg.qkv_bias or cfg.o_bias:  # the kernel implements the Qwen3 layer
        return False
    if jnp.dtype(cfg.compute_dtype) != jnp.float32 or cache[0].dtype != jnp.float32 or cache[0].shape[1] != rows:
        return False
    if any(leaf.dtype != jnp.float32 for leaf in jax.tree.leaves(params["layers"])):
        return False
    if cfg.hidden_size % 16 or cfg.intermediate_size % 16 or cfg.head_dim % 16 or cfg.head_dim > 256:
        return False
    so = cpu_gemm._library()
    return so is not None and bool(so.reagent_decode_layers_supported())


def decode_layers(cfg, params, x: jax.Array, positions: jax.Array, cache):
    """x [B, E] (embedded tokens at positions [B]); cache (k, v) each [L, B, K, S, D] (the decode
    window). Returns (hidden [B, E] before the final norm, cache with each row's new K/V written at
    its position). Rows at positions >= S write nothing and their hidden state is meaningless.
    Call only where `usable` said yes."""
    lp = params["layers"]
    att, mlp = lp["attn"], lp["mlp"]
    cos, sin = cfg.rope_tables(positions)  # [B, D/2]
    operands = (x.astype(jnp.float32), positions.astype(jnp.int32), cos, sin, lp["input_norm"]["scale"],
                att["q"], att["k"], att["v"], att["q_norm"]["scale"], att["k_norm"]["scale"], att["o"],
                lp["post_attn_norm"]["scale"], mlp["gate"], mlp["up"], mlp["down"], *cache)
    out = (jax.ShapeDtypeStruct(x.shape, jnp.float32), jax.ShapeDtypeStruct(cache[0].shape, jnp.float32),
           jax.ShapeDtypeStruct(cache[1].shape, jnp.float32))
    n = len(operands)
    call = jax.ffi.ffi_call(cpu_gemm._DECODE_TARGET, out, vmap_method="sequential",
                            input_output_aliases={n - 2: 1, n - 1: 2})
    h, k, v = call(*operands, heads=cfg.num_heads, eps=np.float32(cfg.rms_norm_eps),
                   scale=np.float32(cfg.head_dim ** -0.5))
    return h, (k, v)
