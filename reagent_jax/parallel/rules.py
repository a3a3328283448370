"""Logical axis names -> mesh axes: one rules table for parameters, activations and KV caches.

Every array in the project is described by logical axis names (`("embed", "mlp")`); the table
below maps each name to mesh axes (`data`, `fsdp`, `tensor`). Changing the parallelism layout
means editing this table (or passing another one), never the model code.

A mesh axis is dropped for a dimension it does not divide (e.g. one KV head on tensor=2), so
every checkpoint shape loads on every mesh; that dimension is then replicated over the axis.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")

MeshAxes = Union[None, str, tuple[str, ...]]
Rules = tuple[tuple[str, MeshAxes], ...]

DEFAULT_RULES: Rules = (
    # activations
    ("batch", ("data", "fsdp")),
    ("act_len", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
    # vocabulary-parallel logprobs (models.token_logprobs on a mesh): the output projection's
    # weight and each chunk's logits split the vocabulary over every model axis, the chunk's
    # rows over data only, so no chip holds the whole head or a full-vocabulary logits row block
    ("logits_batch", "data"),
    ("logits_vocab", ("fsdp", "tensor")),
    # parameters
    ("layers", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("norm", None),
    # KV cache [layers, slots, max_len, kv_heads, head_dim]
    ("cache_batch", ("data", "fsdp")),
    ("cache_len", None),
)


def _lookup(rules: Rules, name: Optional[str]) -> tuple[str, ...]:
    if name is None:
        return ()
    for key, axes in rules:
        if key == name:
            if axes is None:
                return ()
            return (axes,) if isinstance(axes, str) else tuple(axes)
    raise KeyError(f"logical axis {name!r} has no rule; add it to the rules table")


def check_mesh_axes(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> None:
    """Raises ValueError when the rules and the mesh disagree on axis names in a way that would
    silently replicate arrays: a rule naming a mesh axis that is neither in the mesh nor one of
    MESH_AXES (a typo such as "fdsp"), or a mesh axis of size > 1 outside MESH_AXES that no rule
    uses (a mesh built with other names, e.g. ("dp", "model")). A standard axis the mesh lacks is
    treated as size 1."""
    ruled = {a for _, axes in rules if axes is not None for a in ((axes,) if isinstance(axes, str) else axes)}
    typos = sorted(a for a in ruled if a not in mesh.shape and a not in MESH_AXES)
    if typos:
        raise ValueError(f"the rules table maps onto mesh axes {typos}, which mesh {dict(mesh.shape)} does not have "
                         f"(mesh axes are {MESH_AXES}; build meshes with parallel.make_mesh)")
    unused = sorted(a for a, n in mesh.shape.items() if n > 1 and a not in MESH_AXES and a not in ruled)
    if unused:
        raise ValueError(f"mesh {dict(mesh.shape)} has axes {unused} that no rule maps onto, so every array would be "
                         f"replicated over them; name mesh axes {MESH_AXES} (parallel.make_mesh) or add rules for them")


def logical_to_spec(logical_axes: Sequence[Optional[str]], shape: Optional[Sequence[int]] = None,
                    mesh: Optional[Mesh] = None, rules: Rules = DEFAULT_RULES) -> P:
    """PartitionSpec for an array with these logical axes.

    With `shape` and `mesh`, mesh axes that do not divide a dimension (or are already used by an
    earlier dimension) are dropped, so the spec is always valid for that array.
    """
    if shape is not None and len(shape) != len(logical_axes):
        raise ValueError(f"logical axes {tuple(logical_axes)} name {len(logical_axes)} dimensions but the array has "
                         f"shape {tuple(shape)}")
    if mesh is not None:
        check_mesh_axes(mesh, rules)
    used: set[str] = set()
    out = []
    for i, name in enumerate(logical_axes):
        axes = [a for a in _lookup(rules, name) if a not in used]
        if mesh is not None:
            axes = [a for a in axes if a in mesh.shape and mesh.shape[a] > 1]
            if shape is not None:
                while axes and shape[i] % int(np.prod([mesh.shape[a] for a in axes])):
                    axes.pop()
        used.update(axes)
        out.append(None if not axes else (axes[0] if len(axes) == 1 else tuple(axes)))
    return P(*out)


def named_sharding(mesh: Mesh, logical_axes: Sequence[Optional[str]],
                   shape: Optional[Sequence[int]] = None, rules: Rules = DEFAULT_RULES) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(logical_axes, shape, mesh, rules))


def tree_shardings(mesh: Mesh, axes_tree, shapes_tree, rules: Rules = DEFAULT_RULES):
    """Pytree of NamedShardings from a pytree of logical-axes tuples and a matching shapes pytree."""
    is_axes = lambda x: isinstance(x, tuple) and all(isinstance(a, (str, type(None))) for a in x)
    return jax.tree.map(lambda ax, s: named_sharding(mesh, ax, getattr(s, "shape", s), rules),
                        axes_tree, shapes_tree, is_leaf=is_axes)


def constrain(x: jax.Array, logical_axes: Sequence[Optional[str]], mesh: Optional[Mesh],
              rules: Rules = DEFAULT_RULES) -> jax.Array:
    """Sharding constraint on an activation; a no-op without a mesh (single device)."""
    if mesh is None or mesh.size == 1:
        return x
    return jax.lax.with_sharding_constraint(x, named_sharding(mesh, logical_axes, x.shape, rules))
