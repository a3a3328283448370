"""The one jitted train step every trainer uses (SFT, GRPO, RRM, DPO): micro-batches with gradient
accumulation, global-norm clipping, AdamW, explicit shardings, donation, and a NaN guard.

An *objective* (see `objectives.py`) supplies `counts(batch)` (global denominators computed once
over the whole batch) and `loss(params, micro_batch, counts) -> (loss, metrics)` whose values are
contributions that *sum* over micro-batches to the whole-batch value. Summing gradients over
micro-batches therefore equals the gradient of one big batch, whatever the split.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from reagent_jax.parallel.rules import DEFAULT_RULES, Rules, logical_to_spec, named_sharding
from reagent_jax.rl.objectives import on_mesh


class TrainState(NamedTuple):
    step: jax.Array  # [] int32: updates attempted
    params: Any
    opt_state: Any


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    learning_rate: float = 1e-5
    warmup_steps: int = 0
    decay: str = "constant"  # constant | cosine | linear
    total_steps: int = 1000
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    max_grad_norm: float = 1.0


def make_optimizer(c: OptimizerConfig) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW on a warmup + decay schedule."""
    if c.decay == "constant":
        decay = optax.constant_schedule(c.learning_rate)
    elif c.decay == "cosine":
        decay = optax.cosine_decay_schedule(c.learning_rate, max(1, c.total_steps - c.warmup_steps))
    elif c.decay == "linear":
        decay = optax.linear_schedule(c.learning_rate, 0.0, max(1, c.total_steps - c.warmup_steps))
    else:
        raise ValueError(f"unknown decay {c.decay!r}; use constant, cosine or linear")
    schedule = decay if c.warmup_steps <= 0 else optax.join_schedules(
        [optax.linear_schedule(0.0, c.learning_rate, c.warmup_steps), decay], [c.warmup_steps])
    chain = [optax.adamw(schedule, b1=c.b1, b2=c.b2, eps=c.eps, weight_decay=c.weight_decay)]
    if c.max_grad_norm and c.max_grad_norm > 0:
        chain.insert(0, optax.clip_by_global_norm(c.max_grad_norm))
    return optax.chain(*chain)


def opt_state_shardings(opt_state_shapes, params_shardings, mesh: Mesh):
    """Optimizer-state leaves shaped like the params (Adam moments) take the params' shardings;
    everything else (counters) is replicated."""
    params_def = jax.tree.structure(params_shardings)
    replicated = NamedSharding(mesh, P())

    def is_params_like(x):
        try:
            return jax.tree.structure(x) == params_def
        except Exception:
            return False

    return jax.tree.map(lambda x: params_shardings if is_params_like(x) else replicated, opt_state_shapes,
                        is_leaf=is_params_like)


def state_shardings(params_shardings, optimizer, mesh: Mesh, params_shapes) -> TrainState:
    opt_shapes = jax.eval_shape(optimizer.init, params_shapes)
    return TrainState(NamedSharding(mesh, P()), params_shardings,
                      opt_state_shardings(opt_shapes, params_shardings, mesh))


def init_state(params, optimizer, shardings: Optional[TrainState] = None) -> TrainState:
    init = lambda p: TrainState(jnp.zeros((), jnp.int32), p, optimizer.init(p))
    if shardings is None:
        return jax.jit(init)(params)
    return jax.jit(init, out_shardings=shardings)(params)


def shard_batch(batch: dict, mesh: Optional[Mesh]) -> dict:
    """Puts every batch array on the mesh, leading (batch) axis over data x fsdp."""
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    if mesh is None:
        return batch
    return {k: jax.device_put(v, named_sharding(mesh, ("batch",) + (None,) * (v.ndim - 1), v.shape))
            for k, v in batch.items()}


def batch_shards(mesh: Optional[Mesh], rules: Rules = DEFAULT_RULES) -> int:
    """How many ways the rules split the batch axis over `mesh` (data x fsdp by default)."""
    if mesh is None:
        return 1
    spec = logical_to_spec(("batch",), mesh=mesh, rules=rules)[0]
    axes = () if spec is None else (spec,) if isinstance(spec, str) else spec
    return int(np.prod([mesh.shape[a] for a in axes]))


def check_micro_batch(rows: int, num_micro_batches: int, mesh: Optional[Mesh], rules: Rules = DEFAULT_RULES) -> None:
    """ValueError naming the fix when `rows` does not split into micro-batches whose rows divide
    the batch shards of the mesh (otherwise the rules silently replicate every micro-batch on
    every chip of an axis: each chip computes the whole batch)."""
    if rows % num_micro_batches:
        raise ValueError(f"batch size {rows} is not divisible by {num_micro_batches} micro-batches")
    shards = batch_shards(mesh, rules)
    per_micro = rows // num_micro_batches
    if per_micro % shards:
        fit = [m for m in range(1, rows + 1) if rows % m == 0 and (rows // m) % shards == 0]
        hint = (f"use micro_batches={fit[-1]} (or any of {fit})" if fit else
                f"use a batch that is a multiple of {shards} x micro_batches")
        raise ValueError(f"{rows} rows in {num_micro_batches} micro-batches give {per_micro} rows per micro-batch, "
                         f"which do not split over the {shards} batch shards of mesh {dict(mesh.shape)} "
                         f"(data x fsdp): {hint}")


def _split(batch: dict, n: int) -> dict:
    """[B, ...] -> [n, B / n, ...] with micro-batch i = rows i, i + n, i + 2n, ...: a batch sharded
    in contiguous row blocks then gives every micro-batch an equal share of every shard (a
    contiguous split would put whole micro-batches on single chips)."""
    rows = {k: (jnp.shape(v)[0] if jnp.ndim(v) else None) for k, v in batch.items()}
    sizes = set(rows.values())
    if None in sizes or len(sizes) > 1:
        raise ValueError(f"every batch array needs the same leading (batch) size; got {rows}")
    size = sizes.pop() if sizes else 0
    if size % n:
        raise ValueError(f"batch size {size} is not divisible by {n} micro-batches")
    return {k: v.reshape((size // n, n) + v.shape[1:]).swapaxes(0, 1) for k, v in batch.items()}


def make_train_step(objective, optimizer: optax.GradientTransformation, *, num_micro_batches: int = 1,
                    shardings: Optional[TrainState] = None) -> Callable[[TrainState, dict], tuple]:
    """Returns jitted `step(state, batch) -> (state, metrics)`; the old state is donated.

    A step whose loss or gradient norm is not finite leaves params and optimizer state unchanged
    and reports `train/skipped_nonfinite = 1` (training goes on). With `shardings`, the objective
    is bound to their mesh (`objectives.on_mesh`), every micro-batch is constrained batch-sharded,
    gradients are accumulated in the params' (FSDP) sharding, and a micro-batch whose rows do not
    split over the batch shards is a ValueError naming the fix (`check_micro_batch`).
    """
    mesh = None if shardings is None else shardings.step.mesh
    objective = on_mesh(objective, mesh)
    rules = getattr(objective, "rules", DEFAULT_RULES)

    def constrain_micro(micro):
        if mesh is None:
            return micro
        return {k: jax.lax.with_sharding_constraint(
            v, named_sharding(mesh, (None, "batch") + (None,) * (v.ndim - 2), v.shape, rules)) for k, v in micro.items()}

    def constrain_grads(grads):
        return grads if shardings is None else jax.lax.with_sharding_constraint(grads, shardings.params)

    def step(state: TrainState, batch: dict):
        counts = objective.counts(batch)
        micro = _split(batch, num_micro_batches)
        check_micro_batch(jnp.shape(next(iter(batch.values())))[0], num_micro_batches, mesh, rules)
        micro = constrain_micro(micro)
        grad_fn = jax.value_and_grad(objective.loss, has_aux=True)

        def micro_step(mb):
            (loss, metrics), grads = grad_fn(state.params, mb, counts)
            f32 = lambda t: jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), t)
            return f32(loss), f32(metrics), constrain_grads(f32(grads))

        if num_micro_batches == 1:  # no accumulator: one fp32 gradient tree less in memory
            loss, metrics, grads = micro_step(jax.tree.map(lambda x: x[0], micro))
        else:
            shapes = jax.eval_shape(micro_step, jax.tree.map(lambda x: x[0], micro))
            init = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), shapes)
            init = init[:2] + (constrain_grads(init[2]),)
            body = lambda acc, mb: (jax.tree.map(jnp.add, acc, micro_step(mb)), None)
            (loss, metrics, grads), _ = jax.lax.scan(body, init, micro)
        grad_norm = optax.tree.norm(grads)
        ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        updates, new_opt = optimizer.update(grads, state.opt_state, state.params)
        new_params = optax.apply_updates(state.params, updates)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b).astype(b.dtype), new, old)
        state = TrainState(state.step + 1, keep(new_params, state.params), keep(new_opt, state.opt_state))
        metrics = dict(metrics)
        metrics.update({"train/loss": loss, "actor/grad_norm": grad_norm,
                        "train/skipped_nonfinite": 1.0 - ok.astype(jnp.float32)})
        return state, metrics

    if shardings is None:
        return jax.jit(step, donate_argnums=(0,))
    return jax.jit(step, in_shardings=(shardings, None), out_shardings=(shardings, None), donate_argnums=(0,))
