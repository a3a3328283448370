"""Matmuls in the model's precision conventions: accumulated in fp32, written in fp32 or in the
operand's dtype, with the CPU workarounds in one place: the dense layers (`dense`, OpenBLAS for
fp32 on one CPU device) and attention's einsums (`f32_einsum`, `mm`)."""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from reagent_jax.kernels.cpu import gemm as cpu_gemm
from reagent_jax.parallel.mesh import mesh_platform


def f32_einsum(eq: str, a: jax.Array, b: jax.Array, mesh: Optional[Mesh] = None) -> jax.Array:
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


def mm(eq: str, a: jax.Array, b: jax.Array, mesh: Optional[Mesh] = None) -> jax.Array:
    """`f32_einsum`, then cast to a's dtype. Same values as a bf16 einsum with fp32
    accumulation, but XLA:CPU's bf16 GEMM writing bf16 ran ~5x slower than the one writing fp32
    (2048^3: 220 vs 1,230 GFLOP/s); on GPU/TPU the cast normally fuses into the matmul."""
    return f32_einsum(eq, a, b, mesh).astype(a.dtype)


def dense(eq: str, x: jax.Array, w: jax.Array, mesh: Optional[Mesh]) -> jax.Array:
    """x . weight: through OpenBLAS for fp32 on an unsharded CPU run (`cpu_gemm`: XLA:CPU's fp32
    GEMM is ~15% slower), `mm` elsewhere on CPU. On accelerators a plain einsum in the compute
    dtype (the MXU / tensor cores accumulate in fp32 anyway): with an fp32 result the weight
    gradient becomes an fp32 GEMM and its FSDP reduce-scatter moves fp32, twice the bytes
    (measured on the Qwen3-8B train step for v5p)."""
    if mesh_platform(mesh) != "cpu":
        return jnp.einsum(eq, x, w)
    n_contract = cpu_gemm.leading_contraction(eq)
    if n_contract is not None and cpu_gemm.usable(x, w, mesh=mesh, n_contract=n_contract):
        return cpu_gemm.contract(x, w, n_contract)
    return mm(eq, x, w)
