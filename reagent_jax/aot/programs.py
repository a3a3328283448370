"""Every device program a training config's run executes, as abstract inputs (shapes, dtypes,
shardings) that XLA can compile ahead of time for any mesh: the train step of each stage at its
longest sequence bucket, the reference / old-logprob passes, and the rollout engine's prefill
chunk and decode call (the policy's and, with a local Agent-RRM judge, the judge's).

Each program also states what a perfect implementation of its parallelism layout needs
(`min_link_bytes`, `min_hbm_bytes`), its model FLOPs counted from the shapes, and the bytes that
other programs keep allocated on each chip while it runs (`resident`): the engine's KV cache and
the reference params stay on the chips through the update, the optimizer state through rollout.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from reagent_jax import checkpoint, models
from reagent_jax.kernels import attention, kv_layout
from reagent_jax.kernels.tpu import ragged_decode
from reagent_jax.models.flops import (attention_flops_per_token, dense_flops_per_token, projection_flops,
                                      sequence_flops)
from reagent_jax.models.functional import param_shapes, param_shardings, token_logprobs
from reagent_jax.parallel.rules import named_sharding
from reagent_jax.pipelines.context import model_config as from_fields, typed_blocks
from reagent_jax.rl import objectives as obj
from reagent_jax.rl import train_step as ts
from reagent_jax.rollout import kernels
from reagent_jax.rollout.layout import ENGINE_RULES, engine_dtype, engine_mesh, engine_shardings, slots_per_process


QWEN3_TOKENIZER_SIZE = 151_669  # chat.load_tokenizer(None): 151,643 BPE ranks + Qwen3's added tokens
ENGINE_PREFILL_ROWS = 8  # rollout.Engine's max_prefill_rows default
ENGINE_STOP_IDS = 8  # rollout.Engine's max_stop_ids default


@dataclasses.dataclass
class Program:
    name: str
    fn: Callable  # jitted
    args: tuple
    kwargs: dict
    model_flops: float  # per call, all chips together
    min_hbm_bytes: float  # per chip per call
    min_link_bytes: float  # per chip per call, in `hlo_stats.link_bytes` units
    resident: dict[str, float]  # per chip: bytes other programs keep allocated meanwhile
    notes: str = ""
    weight_bytes: float = 0.0  # per chip: the weights the program takes as arguments (engine programs)
    large_copy_bytes: float = 64 * 1024 ** 2  # a copy at least this big is reported (engine: one cache tensor)
    mixed_lengths: dict = dataclasses.field(default_factory=dict)  # decode: bytes per step, mixed lengths


def _abstract(shapes, shardings):
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


def per_chip_bytes(tree) -> float:
    """Bytes one device holds of a pytree of sharded ShapeDtypeStructs (the largest shard)."""
    total = 0.0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
        total += float(np.prod(shape)) * jnp.dtype(leaf.dtype).itemsize
    return total


def _engine_mesh(mesh: Mesh, cfg) -> Mesh:
    """This host's engine mesh, compiled over device ids 0..n-1 of the topology when its own ids
    are not those: XLA's TPU compiler refuses a program over a scattered subset of a topology's
    ids (a v5e:4x4 host holds chips 0, 1, 4, 5: "Unexpected device_id 5 ... target has 4
    device_id"); a host compiling for its own chips at run time has no such limit. Same chip
    count, shapes and bytes; the links between those chips may differ from the host's."""
    emesh = engine_mesh(mesh, cfg)
    n = emesh.devices.size
    if sorted(d.id for d in emesh.devices.flat) == list(range(n)):
        return emesh
    by_id = {d.id: d for d in mesh.devices.flat}
    if any(i not in by_id for i in range(n)):
        return emesh
    return Mesh(np.array([by_id[i] for i in range(n)]).reshape(emesh.devices.shape), emesh.axis_names)


def _params(cfg, mesh: Mesh):
    """The params as the trainer shards them."""
    return _abstract(param_shapes(cfg), param_shardings(cfg, mesh))


def _engine_params(cfg, mesh: Mesh):
    """The engine's own copy: compute dtype, on the engine's (tensor-parallel) mesh."""
    shapes = param_shapes(cfg)
    emesh = _engine_mesh(mesh, cfg)
    cast = lambda s: jax.ShapeDtypeStruct(s.shape, engine_dtype(cfg) if jnp.issubdtype(s.dtype, jnp.floating)
                                          else s.dtype)
    return _abstract(jax.tree.map(cast, shapes), engine_shardings(cfg, emesh, shapes))


def _train_state(cfg, mesh: Mesh, optimizer) -> ts.TrainState:
    shardings = ts.state_shardings(param_shardings(cfg, mesh), optimizer, mesh, param_shapes(cfg))
    shapes = jax.eval_shape(lambda p: ts.TrainState(jnp.zeros((), jnp.int32), p, optimizer.init(p)), param_shapes(cfg))
    return _abstract(shapes, shardings)


class CacheLayout(NamedTuple):
    """How the engine keeps its KV cache (`rollout.kv_page_size` / `kv_pages` / `kv_dtype`)."""
    page_size: int = 0  # 0: one max_len row per slot
    pages: int = 0  # the run's pool; 0: the contiguous size
    dtype: str = ""  # "": the compute dtype

    @classmethod
    def of(cls, r) -> "CacheLayout":
        return cls(int(r.kv_page_size), int(r.kv_pages), str(r.kv_dtype))


def _cache(cfg, mesh: Mesh, num_slots: int, max_len: int, layout: CacheLayout = CacheLayout()):
    """This process's engine's (k, v) KV cache (its share of the run's `num_slots`), on the
    engine's mesh: one max_len row per slot, or a pool of pages (`kernels.kv_pages`)."""
    emesh = _engine_mesh(mesh, cfg)
    n = slots_per_process(num_slots, mesh)
    page = layout.page_size
    rows, length = (n, max_len) if not page else ((layout.pages or num_slots * max_len // page) * n // num_slots, page)
    shape = kernels.cache_shape(cfg, rows, length, emesh)
    one = jax.ShapeDtypeStruct(shape, jnp.dtype(layout.dtype or cfg.compute_dtype),
                               sharding=named_sharding(emesh, kv_layout.cache_axes(emesh), shape, ENGINE_RULES))
    return one, one


def _replicated(mesh: Mesh, shape, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P()))


def _batch_array(mesh: Mesh, shape, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype, sharding=named_sharding(mesh, ("batch",) + (None,) * (len(shape) - 1),
                                                                      shape))


# ---- model arithmetic ---------------------------------------------------------------------------

def _weight_bytes(cfg: models.Qwen3Config) -> float:
    """The params once in the compute dtype (what every chip reads per pass under FSDP)."""
    return float(cfg.num_params()) * jnp.dtype(cfg.compute_dtype).itemsize


# ---- the model of a config ------------------------------------------------------------------------

def model_config(config) -> models.Qwen3Config:
    """`config.model` as the run builds it, without loading weights or training a tokenizer:
    a preset, the config of `model.init_from` (HF `config.json` or a reagent_jax params dir), or
    the small model of the fields with the tokenizer's size (compact: `tokenizer.vocab_size`)."""
    m = config.model
    path = m.get("init_from", "")
    if path and not m.get("preset"):
        overrides = dict(param_dtype=m.param_dtype, compute_dtype=m.compute_dtype, remat_policy=m.remat_policy,
                         attention=m.get("attention", "auto"))
        if checkpoint.is_params_dir(path):
            return checkpoint.load_config(path, **overrides)
        return models.Qwen3Config.from_hf_json(os.path.join(path, "config.json"), **overrides)
    t = config.tokenizer
    size = QWEN3_TOKENIZER_SIZE if t.kind == "qwen3" else int(t.vocab_size)
    return from_fields(config, size)


# ---- programs -----------------------------------------------------------------------------------------

def _resident_engine(cfg, mesh, num_slots: int, max_len: int, layout: CacheLayout = CacheLayout()) -> float:
    return per_chip_bytes(_cache(cfg, mesh, num_slots, max_len, layout))


def _logprob_gather_bytes(cfg, rows: int, length: int, passes: int) -> float:
    """Vocabulary-parallel logprobs: each pass collects a chunk's hidden rows from the batch
    shards (and, backward, reduces their gradient back)."""
    return passes * rows * length * cfg.hidden_size * jnp.dtype(cfg.compute_dtype).itemsize


def train_program(name: str, cfg, mesh: Mesh, objective, rows: int, length: int, micro_batches: int,
                  optimizer_cfg: ts.OptimizerConfig, resident: dict[str, float], pairs: bool = False) -> Program:
    optimizer = ts.make_optimizer(optimizer_cfg)
    state = _train_state(cfg, mesh, optimizer)
    lead = (rows, 2) if pairs else (rows,)
    batch = {k: _batch_array(mesh, lead + (length,), jnp.int32) for k in ("tokens", "attention_mask", "loss_mask")}
    if isinstance(objective, obj.GRPOObjective):
        batch["old_logprobs"] = _batch_array(mesh, (rows, length), jnp.float32)
        batch["advantages"] = _batch_array(mesh, (rows,), jnp.float32)
        if objective.beta:
            batch["ref_logprobs"] = _batch_array(mesh, (rows, length), jnp.float32)
    if pairs:
        batch["ref_logps"] = _batch_array(mesh, (rows, 2), jnp.float32)
    shardings = jax.tree.map(lambda s: s.sharding, state)
    step = ts.make_train_step(objective, optimizer, num_micro_batches=micro_batches, shardings=shardings)
    seqs = rows * (2 if pairs else 1)
    weights = _weight_bytes(cfg)
    # weight passes per micro-batch: read for the forward and the backward (+ the recomputed forward);
    # over the links the weights are gathered once per pass but the backward shares its gather with
    # the recompute, and the gradient is reduce-scattered once
    passes = 3 if cfg.remat_policy != "none" else 2
    link = 0.0
    if ts.batch_shards(mesh) > 1:
        link = micro_batches * passes * weights + _logprob_gather_bytes(cfg, seqs, length, 3)
    hbm = micro_batches * passes * weights + 24.0 * cfg.num_params() / mesh.size  # weights + AdamW update
    return Program(name, step, (state, batch), {}, 3.0 * sequence_flops(cfg, seqs, length), hbm, link, resident,
                   notes=f"{seqs} sequences x {length} tokens in {micro_batches} micro-batches; remat "
                         f"{cfg.remat_policy}; attention {attention.choose(cfg.attention, mesh, length, cfg.jnp_dtype, cfg.head_dim)}")


def logprob_program(name: str, cfg, mesh: Mesh, rows: int, length: int, resident: dict[str, float]) -> Program:
    params = _params(cfg, mesh)
    tokens = _batch_array(mesh, (rows, length), jnp.int32)
    fn = jax.jit(lambda p, t, m: token_logprobs(cfg, p, t, m, mesh=mesh))
    link = 0.0 if ts.batch_shards(mesh) == 1 else _weight_bytes(cfg) + _logprob_gather_bytes(cfg, rows, length, 1)
    return Program(name, fn, (params, tokens, tokens), {}, sequence_flops(cfg, rows, length), _weight_bytes(cfg),
                   link, resident, notes=f"forward only, {rows} x {length} (one micro-batch); attention "
                                         f"{attention.choose(cfg.attention, mesh, length, cfg.jnp_dtype, cfg.head_dim)}")


def _sampling(mesh, n):
    return kernels.Sampling(_replicated(mesh, (n,), jnp.float32), _replicated(mesh, (n,), jnp.float32),
                            _replicated(mesh, (n,), jnp.int32), _replicated(mesh, (n,), jnp.uint32))


def _tp_link_bytes(cfg, emesh: Mesh, tokens_per_chip: float) -> float:
    """Tensor parallelism's minimum: two all-reduces of the tokens' [embed] activations per layer
    (after attention and after the MLP), in `hlo_stats.link_bytes` units (an all-reduce counts
    twice)."""
    if emesh.shape["tensor"] == 1:
        return 0.0
    return 2 * 2 * cfg.num_layers * tokens_per_chip * cfg.hidden_size * jnp.dtype(cfg.compute_dtype).itemsize


def _block_table(emesh: Mesh, num_slots: int, max_len: int, page: int) -> Optional[jax.ShapeDtypeStruct]:
    return _replicated(emesh, (num_slots, max_len // page), jnp.int32) if page else None


def prefill_program(name: str, cfg, mesh: Mesh, num_slots: int, max_len: int, chunk: int,
                    resident: dict[str, float], layout: CacheLayout = CacheLayout()) -> Program:
    emesh = _engine_mesh(mesh, cfg)
    params, cache = _engine_params(cfg, mesh), _cache(cfg, mesh, num_slots, max_len, layout)
    rows = min(ENGINE_PREFILL_ROWS, slots_per_process(num_slots, mesh))
    r = lambda dtype, *shape: _replicated(emesh, shape, dtype)
    args = (params, cache, r(jnp.int32, rows, chunk), r(jnp.int32, rows), r(jnp.int32, rows), r(jnp.int32, rows),
            _sampling(emesh, rows), _block_table(emesh, slots_per_process(num_slots, mesh), max_len, layout.page_size))
    fn = jax.jit(lambda p, c, t, w, s, l, smp, pg: kernels.prefill(cfg, p, c, t, w, s, l, smp, pg, window=max_len,
                                                                   truncation=True, mesh=emesh, rules=ENGINE_RULES),
                 donate_argnums=(1,))
    hosts = mesh.size // emesh.size  # each host's engine runs this program on its own chips
    flops = hosts * rows * (chunk * (dense_flops_per_token(cfg) + attention_flops_per_token(cfg, max_len)) +
                            projection_flops(cfg))
    window_kv = 2 * rows * cfg.num_layers * cfg.num_kv_heads * max_len * cfg.head_dim * \
        jnp.dtype(cfg.compute_dtype).itemsize
    weights = per_chip_bytes(params)
    link = _tp_link_bytes(cfg, emesh, rows * chunk / emesh.shape["data"])
    return Program(name, fn, args, {}, flops, weights + window_kv / emesh.size, link, resident,
                   notes=f"{rows} rows x {chunk}-token chunk, window {max_len}; engine mesh {_mesh_str(emesh)}",
                   weight_bytes=weights, large_copy_bytes=min(64 * 1024 ** 2, per_chip_bytes(cache[0])))


def decode_program(name: str, cfg, mesh: Mesh, num_slots: int, max_len: int, steps: int,
                   resident: dict[str, float], layout: CacheLayout = CacheLayout()) -> Program:
    emesh = _engine_mesh(mesh, cfg)
    params, cache = _engine_params(cfg, mesh), _cache(cfg, mesh, num_slots, max_len, layout)
    r = lambda dtype, *shape: _replicated(emesh, shape, dtype)
    n = slots_per_process(num_slots, mesh)
    state = kernels.DecodeState(r(jnp.int32, n), r(jnp.int32, n), r(jnp.bool_, n), r(jnp.int32, n),
                                _sampling(emesh, n), r(jnp.int32, n, ENGINE_STOP_IDS), r(jnp.bool_))
    fn = jax.jit(lambda p, c, s, pg: kernels.decode(cfg, p, c, s, pg, num_steps=steps, window=max_len, truncation=True,
                                                    mesh=emesh, rules=ENGINE_RULES), donate_argnums=(1,))
    flops = steps * num_slots * (dense_flops_per_token(cfg) + attention_flops_per_token(cfg, max_len) + projection_flops(cfg))
    weights, kv = per_chip_bytes(params), per_chip_bytes(cache)
    link = steps * _tp_link_bytes(cfg, emesh, n / emesh.shape["data"])
    kernel = attention.choose_decode(cfg.attention, emesh)
    table = _block_table(emesh, n, max_len, layout.page_size)
    paged = "" if not layout.page_size else f"; paged KV: {cache[0].shape[1]} pages x {layout.page_size}"
    paged += f"; {layout.dtype} KV" if layout.dtype else ""
    return Program(name, fn, (params, cache, state, table), {}, flops, steps * (weights + kv), link, resident,
                   notes=f"{steps} fused steps x {n} slots{_of_total(n, num_slots)}, window {max_len} (every slot full "
                         f"length){paged}; engine mesh {_mesh_str(emesh)}; decode attention {kernel}",
                   weight_bytes=weights, large_copy_bytes=min(64 * 1024 ** 2, per_chip_bytes(cache[0])),
                   mixed_lengths=mixed_length_step_bytes(cfg, emesh, n, max_len, weights, kernel, layout.page_size, kv,
                                                         kv_itemsize=cache[0].dtype.itemsize))


def mixed_length_step_bytes(cfg, emesh: Mesh, num_slots: int, max_len: int, weights: float, kernel: str,
                            page: int = 0, pool_bytes: float = 0.0, kv_itemsize: int = 0, seed: int = 0) -> dict:
    """HBM bytes one decode step reads on the busiest chip for a population of slots whose
    lengths spread evenly over [max_len / 16, max_len) (shuffled over the slots), against the
    minimum (a weight shard + the live KV of the chip holding the most). xla attention reads every slot up
    to the window that holds the longest; the ragged kernel reads each slot's blocks up to its
    own length (a paged pool's blocks are its pages). With a paged pool (`page` > 0, K and V
    taking `pool_bytes` per chip), `fits` says whether the population's pages fit every chip's
    pool."""
    rng = np.random.default_rng(seed)
    lengths = rng.permutation(np.linspace(max_len // 16, max_len - 1, num_slots).astype(np.int64))
    data, tensor = emesh.shape["data"], emesh.shape["tensor"]
    itemsize = kv_itemsize or jnp.dtype(cfg.compute_dtype).itemsize  # of the cache
    per_position = 2 * cfg.num_layers * (cfg.num_kv_heads // tensor) * cfg.head_dim * itemsize
    if kernel == "ragged":
        block = page or ragged_decode.decode_block(max_len, cfg.num_kv_heads // tensor, cfg.head_dim, itemsize)
        read = np.maximum(-(-lengths // block), 1) * block
    else:
        read = np.full_like(lengths, kernels.bucket(int(lengths.max()) + 1, kernels.geometric_buckets(256, max_len, 4)))
    shards = np.array_split(np.arange(num_slots), data)  # slots over data, in order (the cache's sharding)
    read_bytes = weights + max(float(read[idx].sum()) for idx in shards) * per_position  # the slowest chip
    min_bytes = weights + max(float(lengths[idx].sum()) for idx in shards) * per_position
    out = {"lengths": f"{int(lengths.min())}-{int(lengths.max())}", "read_bytes": read_bytes, "min_bytes": min_bytes,
           "vs_min": read_bytes / min_bytes}
    if page:
        pool = pool_bytes / (page * per_position)  # pages in a chip's pool
        out["fits"] = bool(max(float(np.ceil(lengths[idx] / page).sum()) for idx in shards) <= pool)
    return out


def _of_total(local: int, total: int) -> str:
    return "" if local == total else f" (this host's share of {total})"


def _mesh_str(mesh: Mesh) -> str:
    return " x ".join(f"{k} {v}" for k, v in mesh.shape.items() if v > 1) or "one device"


def _opt(block) -> ts.OptimizerConfig:
    """The optimizer of a typed stage block (SFT and DPO clip gradients at 1.0, as their trainers do)."""
    return ts.OptimizerConfig(learning_rate=block.learning_rate, max_grad_norm=getattr(block, "max_grad_norm", 1.0))


def _grpo_rows(config, g, block_name: str) -> int:
    per_episode = 2 if config.get("strategy") == "reagent_u" and block_name == "grpo" else 1
    rows = g.questions_per_step * g.n * per_episode
    rows = -(-rows // g.micro_batches) * g.micro_batches
    cap = -(-rows // g.mini_batches)
    return -(-cap // g.micro_batches) * g.micro_batches


def _grpo_programs(config, blocks, name, cfg, mesh, length, resident, engine_resident) -> list[Program]:
    g = blocks[name]
    rows = _grpo_rows(config, g, name)
    temperature = float(config.agent.temperature) if name == "grpo" else 1.0
    objective = obj.grpo_objective(cfg, g, temperature)
    train_resident = dict(engine_resident)
    if g.beta:
        train_resident["reference params"] = per_chip_bytes(_params(cfg, mesh))
    out = [train_program(f"{name}/train_step", cfg, mesh, objective, rows, length, g.micro_batches, _opt(g),
                         {**resident, **train_resident})]
    per_micro = rows // g.micro_batches
    if g.beta:
        out.append(logprob_program(f"{name}/ref_logprobs", cfg, mesh, per_micro, length,
                                   {**resident, **train_resident, **_opt_state_bytes(cfg, mesh, g)}))
    if g.old_logprobs == "recompute":
        out.append(logprob_program(f"{name}/old_logprobs", cfg, mesh, per_micro, length,
                                   {**resident, **train_resident, **_opt_state_bytes(cfg, mesh, g)}))
    return out


def _opt_state_bytes(cfg, mesh, block) -> dict[str, float]:
    return {"optimizer state": per_chip_bytes(_train_state(cfg, mesh, ts.make_optimizer(_opt(block))).opt_state)}


def _engine_programs(prefix, cfg, mesh, r, max_len, resident, layout: CacheLayout = CacheLayout()) -> list[Program]:
    return [prefill_program(f"{prefix}/prefill", cfg, mesh, r.num_slots, max_len, min(r.prefill_chunk, max_len),
                            resident, layout),
            decode_program(f"{prefix}/decode", cfg, mesh, r.num_slots, max_len, r.decode_steps, resident, layout)]


def _engine_weights(cfg, mesh: Mesh) -> float:
    return per_chip_bytes(_engine_params(cfg, mesh))


def agent_programs(config, cfg, mesh: Mesh) -> list[Program]:
    """What stays resident: the policy engine's KV cache always; its weights during SFT and the
    judge's calls, but not during a GRPO update (the trainer frees them after the rollouts and
    syncs a fresh copy each step, `timing_s/sync_weights`); the trainer's params and optimizer
    state during rollouts; a local judge's weights and KV cache throughout."""
    stages = [s.strip() for s in config.stages.split(",") if s.strip()]
    blocks = typed_blocks(config)
    r = blocks["rollout"]
    engine = {"engine KV cache": _resident_engine(cfg, mesh, r.num_slots, r.max_len, CacheLayout.of(r))}
    engine_weights = {"engine weights": _engine_weights(cfg, mesh)}
    out: list[Program] = []
    if any(s.startswith("rrm_") for s in stages):
        rrm_len = int(config.rrm.max_len)
        if "rrm_sft" in stages:
            b = blocks["rrm_sft"]
            out.append(train_program("rrm_sft/train_step", cfg, mesh, obj.SFTObjective(cfg), b.batch_size,
                                     min(b.max_len, rrm_len), b.micro_batches, _opt(b), {**engine, **engine_weights}))
        if "rrm_grpo" in stages:
            judge_engine = {"judge engine KV cache": _resident_engine(cfg, mesh, r.num_slots, rrm_len)}
            out += _grpo_programs(config, blocks, "rrm_grpo", cfg, mesh, rrm_len, {**engine, **engine_weights}, judge_engine)
    if "sft" in stages:
        b = blocks["sft"]
        out.append(train_program("sft/train_step", cfg, mesh, obj.SFTObjective(cfg, context_weight=b.context_loss_weight),
                                 b.batch_size, b.max_len, b.micro_batches, _opt(b), {**engine, **engine_weights}))
    judge_resident = {}
    if config.get("strategy", "grpo") != "grpo" and config.rrm.judge == "local":
        judge_resident = {"judge engine KV cache": _resident_engine(cfg, mesh, r.num_slots, int(config.rrm.max_len)),
                          "judge engine weights": _engine_weights(cfg, mesh)}
    if "grpo" in stages:
        out += _grpo_programs(config, blocks, "grpo", cfg, mesh, r.max_len, judge_resident, engine)
    policy_state = {"trainer params": per_chip_bytes(_params(cfg, mesh)),
                    **_opt_state_bytes(cfg, mesh, blocks["grpo"] if "grpo" in stages else blocks["sft"])}
    out += _engine_programs("rollout", cfg, mesh, r, r.max_len, {**policy_state, **judge_resident}, CacheLayout.of(r))
    if judge_resident:
        out += _engine_programs("judge", cfg, mesh, r, int(config.rrm.max_len),
                                {**policy_state, **engine, **engine_weights})
    return out


def evalplanner_programs(config, cfg, mesh: Mesh) -> list[Program]:
    stages = [s.strip() for s in config.stages.split(",") if s.strip()]
    blocks = typed_blocks(config)
    r = blocks["rollout"]
    engine = {"engine KV cache": _resident_engine(cfg, mesh, r.num_slots, r.max_len, CacheLayout.of(r)),
              "engine weights": _engine_weights(cfg, mesh)}
    out: list[Program] = []
    for stage, block in (("judge_seed", blocks.get("seed_judge")), ("judge_sft", blocks["sft"])):
        if stage in stages:
            out.append(train_program(f"{stage}/train_step", cfg, mesh, obj.SFTObjective(cfg), block.batch_size,
                                     block.max_len, block.micro_batches, _opt(block), dict(engine)))
    if "judge_dpo" in stages:
        d = blocks["dpo"]
        dpo = obj.DPOObjective(cfg, loss_type=d.loss_type, beta=d.beta, label_smoothing=d.label_smoothing,
                               nll_coef=d.nll_coef)
        out.append(train_program("judge_dpo/train_step", cfg, mesh, dpo, d.batch_size, d.max_len, d.micro_batches,
                                 _opt(d), dict(engine), pairs=True))
        out.append(logprob_program("judge_dpo/ref_logprobs", cfg, mesh, 2 * d.batch_size, d.max_len,
                                   {**engine, **_opt_state_bytes(cfg, mesh, d)}))
    out += _engine_programs("rollout", cfg, mesh, r, r.max_len, {"trainer params": per_chip_bytes(_params(cfg, mesh)),
                                                                 **_opt_state_bytes(cfg, mesh, blocks["sft"])}, CacheLayout.of(r))
    return out


def run_programs(config, mesh: Mesh) -> tuple[models.Qwen3Config, list[Program]]:
    """(model config, every device program of `config`'s run on `mesh`)."""
    cfg = model_config(config)
    if config.get("pipeline", "agent") == "evalplanner":
        return cfg, evalplanner_programs(config, cfg, mesh)
    return cfg, agent_programs(config, cfg, mesh)

