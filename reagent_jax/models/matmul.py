"""Matmuls in the model's precision conventions: accumulated in fp32, written in fp32 or in the
operand's dtype, with the CPU workarounds in one place (used by the dense layers and attention)."""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

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
