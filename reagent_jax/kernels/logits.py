"""Hidden states -> logits: the model's output projection (`project`, training and scoring) and
the decode sampler's vocabulary-major logits (`vocab_major`), each by the mesh's devices.

The values are the same everywhere (fp32 accumulation); only the loop differs, and on XLA:CPU,
where the decode projection is memory-bound, the loop is most of the decode step.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from reagent_jax.kernels.cpu import gemm as cpu_gemm
from reagent_jax.parallel.mesh import mesh_platform
from reagent_jax.parallel.rules import DEFAULT_RULES, Rules, constrain, logical_to_spec


def project(h: jax.Array, w: jax.Array, tied: bool, mesh: Optional[Mesh] = None) -> jax.Array:
    """Hidden [.., e] (in the compute dtype) x the output weight -> fp32 logits [.., v]; w is the
    tied embedding [v, e] or the head [e, v] (in the compute dtype).

    A tied embedding is contracted as stored, [v, e]: written as `embedding.T`, XLA:CPU
    materialised the transposed (and, in bf16, converted) matrix in every call, which made bf16
    token logprobs 2x slower than fp32. fp32 on one CPU device: OpenBLAS (`cpu.gemm`)."""
    if cpu_gemm.usable(h, w, mesh=mesh):
        return cpu_gemm.contract_rows(h, w) if tied else cpu_gemm.contract(h, w, 1)
    return jnp.einsum("...e,ve->...v" if tied else "...e,ev->...v", h, w, preferred_element_type=jnp.float32)


def vocab_shards(vocab_size: int, mesh: Optional[Mesh], rules: Rules = DEFAULT_RULES) -> int:
    """Devices the sampler's [V, B] logits are split over on an accelerator mesh (1 on CPU,
    where the CPU kernels and the gather-based chunk reads are the fast path)."""
    if mesh is None or mesh_platform(mesh) == "cpu":
        return 1
    axes = logical_to_spec(("logits_vocab", None), (vocab_size, 1), mesh, rules)[0]
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    return int(math.prod(mesh.shape[a] for a in axes))


def vocab_major(h: jax.Array, w: jax.Array, tied: bool, compute_dtype, project_rows: Callable[[], jax.Array],
                mesh: Optional[Mesh] = None, rules: Rules = DEFAULT_RULES,
                inv_temperature: Optional[jax.Array] = None, chunk: int = 0
                ) -> tuple[jax.Array, Optional[tuple[jax.Array, jax.Array]]]:
    """The decode sampler's logits of final hidden states h [B, E]: (fp32 [V, B], the per-chunk
    statistics (max, sum of exp) of `chunk`-wide vocabulary chunks at `inv_temperature` [B], or
    None). w is the output weight as stored (tied [V, E] or head [E, V]); `project_rows()` is the
    model's own projection, [B, V].

    Accelerators: the model's projection, its vocabulary left where the head's rows lie and slots
    over data (`vocab_shards`). CPU in fp32 with a tied embedding on AVX-512:
    `cpu.gemm.vocab_logits` streams the weight once (7.1-7.7 ms vs 11.4-11.8 at [16, 256] x
    [256, 151936] on 2 cores, BENCHMARKS.md) and also returns the sampler's chunk statistics, so
    the sampler never reads the logits whole. Otherwise in fp32 a fused multiply-reduce that
    writes [V, B] reads each weight row once for all B rows (11-13.5 ms vs 15-15.5 ms for the GEMM
    with a tied embedding, which packs the weight panel first; no slower than the GEMM with an
    untied [E, V] head), except for one row, where XLA:CPU's multiply-reduce takes ~0.5 s and its
    matrix-vector product 5-9 ms. bf16 is faster as a GEMM; its [B, V] output is transposed
    behind an optimization barrier, since XLA:CPU would otherwise fold the transpose into the
    GEMM and transpose the whole weight every step (2x slower decode, measured untied)."""
    if mesh_platform(mesh) != "cpu":
        return constrain(project_rows().T, ("logits_vocab", "logits_batch"), mesh, rules), None
    if jnp.dtype(compute_dtype) != jnp.float32:
        return jax.lax.optimization_barrier(project_rows()).T, None
    h32 = h.astype(jnp.float32)
    if tied and cpu_gemm.vocab_logits_usable(w, h32, mesh):
        inv_t = jnp.ones(h.shape[0], jnp.float32) if inv_temperature is None else inv_temperature
        logits, cmax, csum = cpu_gemm.vocab_logits(w, h32, inv_t, chunk)
        return logits, (cmax, csum)
    w = w.astype(jnp.float32)
    if h.shape[0] == 1:
        return jnp.einsum("ve,be->vb" if tied else "ev,be->vb", w, h32), None
    if tied:
        return (w[:, None, :] * h32[None]).sum(-1), None  # [V,1,E]*[1,B,E] -> [V, B]
    return (w[:, :, None] * h32.T[:, None, :]).sum(0), None  # [E,V,1]*[E,1,B]
