"""Benchmarks of the update path: `train_step` (tokens/s, MFU) and one whole `grpo_step`
(generation + reference logprobs + reward + update) on a fixed workload."""
from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from reagent_jax.aot import hlo_stats
from reagent_jax.kernels import attention
from reagent_jax.metrics import perf
from reagent_jax.models.config import Qwen3Config
from reagent_jax.models.flops import train_flops
from reagent_jax.models.functional import init_params, token_logprobs
from reagent_jax.rl.advantages import grpo_advantages
from reagent_jax.rl.objectives import GRPOObjective
from reagent_jax.rl.train_step import OptimizerConfig, init_state, make_optimizer, make_train_step
from reagent_jax.rollout import Engine, SamplingParams


def _grpo_batch(cfg, b, t, rng):
    return {"tokens": rng.integers(0, cfg.vocab_size, (b, t)).astype(np.int32),
            "attention_mask": np.ones((b, t), np.int32),
            "loss_mask": np.concatenate([np.zeros((b, t // 2)), np.ones((b, t - t // 2))], 1).astype(np.int32),
            "old_logprobs": np.full((b, t), -11.0, np.float32), "ref_logprobs": np.full((b, t), -11.0, np.float32),
            "advantages": rng.normal(size=(b,)).astype(np.float32)}


def run_train_step(cfg: Qwen3Config, batch: int = 4, seq_len: int = 512, iters: int = 3, micro_batches: int = 1,
                   beta: float = 0.04, dtype: str = "float32", param_dtype: str = "float32",
                   attentions: Sequence[str] = ("auto",)) -> dict:
    """Median step time of the GRPO update (policy + KL loss, AdamW) at this shape, and MFU (model
    FLOPs = 3 x forward FLOPs) against the machine's measured matmul peak in `dtype` and, on a
    chip `parallel.chips` lists, its datasheet bf16 peak. Weights and optimizer state are in
    `param_dtype` (fp32 as in training; bf16 halves them, to fit an 8B model's AdamW on one
    GPU); the model computes in `dtype`. Each attention kernel in `attentions` (`auto` first,
    then e.g. `xla` as the baseline) is timed on the same state; figures per kernel."""
    cfg = cfg.replace(param_dtype=param_dtype, compute_dtype=perf.check_bench_dtype(dtype))
    opt = make_optimizer(OptimizerConfig(learning_rate=1e-6))
    holder = {"s": init_state(init_params(cfg, jax.random.PRNGKey(0)), opt)}
    b = _grpo_batch(cfg, batch, seq_len, np.random.default_rng(0))
    peak, datasheet = perf.matmul_peak_flops(dtype=jnp.dtype(dtype)), perf.datasheet_peak_flops()
    n_tok = batch * seq_len
    flops = 3 * cfg.flops_per_token(seq_len) * n_tok
    out = {"shape": dict(hidden=cfg.hidden_size, layers=cfg.num_layers, vocab=cfg.vocab_size, batch=batch,
                         seq_len=seq_len, remat=cfg.remat_policy),
           "dtype": dtype, "param_dtype": param_dtype, "device": jax.devices()[0].device_kind,
           "machine_matmul_peak_gflops": peak / 1e9, "model_tflop_per_step": flops / 1e12}
    for impl in attentions:
        c = cfg.replace(attention=impl)
        step = make_train_step(GRPOObjective(c, beta=beta), opt, num_micro_batches=micro_batches)

        def one():
            holder["s"], m = step(holder["s"], b)
            return m

        t = perf.median(perf.time_calls(one, iters=iters, warmup=1))
        kernel = attention.choose(impl, None, seq_len, c.jnp_dtype, c.head_dim)
        key = "" if impl == attentions[0] else f"/{impl}"
        out.update({f"attention{key}": kernel, f"step_s{key}": t, f"tokens_per_s{key}": n_tok / t,
                    f"model_tflops_per_s{key}": flops / t / 1e12, f"mfu{key}": flops / t / peak,
                    **({f"mfu_vs_datasheet{key}": flops / t / datasheet} if datasheet else {})})
        if key:
            out[f"speedup_over{key}"] = t / out["step_s"]
    out["peak_memory_gb"] = perf.peak_memory_bytes() / 1e9
    return out


def _compiled_update(step, state, batch) -> tuple[float, float]:
    """(matmul FLOPs the compiled update executes, loops unrolled (`hlo_stats.matmul_flops`); its
    temporary buffers in bytes)."""
    compiled = step.lower(state, batch).compile()
    return hlo_stats.matmul_flops(compiled.as_text()), float(compiled.memory_analysis().temp_size_in_bytes)


def run_grpo_step(cfg: Qwen3Config, prompts: int = 4, n: int = 4, prompt_len: int = 64, new_tokens: int = 64,
                  beta: float = 0.04, iters: int = 3, dtype: str = "float32", baseline: bool = True) -> dict:
    """One full GRPO step, timed by phase: gen (engine), ref (reference logprobs), reward, update;
    fp32 weights computing in `dtype`. The update's executed matmul FLOPs (from its compiled HLO)
    against the model's (3 x forward) give HFU and MFU; `memory/temp_gb` is its compiled
    temporaries. With `baseline`, the same update with the rematerialised output head
    (`fused_head=False`, the path before the fused head) is also timed on every step's batch,
    from a copy of the same state: `timing_s/update_unfused`."""
    cfg = cfg.replace(param_dtype="float32", compute_dtype=perf.check_bench_dtype(dtype))
    params = init_params(cfg, jax.random.PRNGKey(0))
    ref_params = jax.tree.map(jnp.copy, params)
    opt = make_optimizer(OptimizerConfig(learning_rate=1e-6))
    obj = GRPOObjective(cfg, beta=beta, temperature=1.0)
    steps = {"update": make_train_step(obj, opt)}
    if baseline:
        steps["update_unfused"] = make_train_step(dataclasses.replace(obj, fused_head=False), opt)
    state = init_state(params, opt)
    engine = Engine(cfg, state.params, num_slots=prompts * n, max_len=prompt_len + new_tokens + 1,
                    prefill_chunk=prompt_len, decode_steps=8)
    rng = np.random.default_rng(0)
    prompt_ids = [list(rng.integers(0, cfg.vocab_size, prompt_len)) for _ in range(prompts)]
    ref_fn = jax.jit(lambda p, t, m: token_logprobs(cfg, p, t, m))
    phases = {"gen": [], "ref": [], "reward": [], "update": [], **({"update_unfused": []} if baseline else {})}
    holder = {"s": state}
    compiled = {}
    for it in range(iters + 1):
        engine.update_params(holder["s"].params)
        t0 = time.perf_counter()
        sps = [SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=it * 1000 + k)
               for k in range(prompts * n)]
        outs = engine.generate([p for p in prompt_ids for _ in range(n)], sps)
        t1 = time.perf_counter()
        toks = np.array([p + o.tokens for p, o in zip([p for p in prompt_ids for _ in range(n)], outs)], np.int32)
        mask = np.ones_like(toks)
        ref = np.asarray(ref_fn(ref_params, toks, mask))
        t2 = time.perf_counter()
        rewards = np.array([np.mean(np.array(o.tokens) % 2 == 0) for o in outs], np.float32)  # a cheap rule
        adv = np.asarray(grpo_advantages(jnp.asarray(rewards), jnp.repeat(jnp.arange(prompts), n)).advantages)
        t3 = time.perf_counter()
        loss_mask = np.zeros_like(toks)
        loss_mask[:, prompt_len:] = 1
        old = np.zeros(toks.shape, np.float32)
        old[:, prompt_len:] = np.array([o.logprobs for o in outs], np.float32)
        batch = {"tokens": toks, "attention_mask": mask, "loss_mask": loss_mask, "old_logprobs": old,
                 "ref_logprobs": ref, "advantages": adv}
        if it == 0:
            compiled = {k: _compiled_update(st, holder["s"], batch) for k, st in steps.items()}
        if baseline:  # the state is donated: the baseline runs on a copy, its result is dropped
            copy = jax.tree.map(jnp.copy, holder["s"])
            jax.block_until_ready(copy)
            tb = time.perf_counter()
            jax.block_until_ready(steps["update_unfused"](copy, batch))
            unfused_s = time.perf_counter() - tb
            del copy
        t4 = time.perf_counter()
        holder["s"], m = steps["update"](holder["s"], batch)
        jax.block_until_ready(m)
        t5 = time.perf_counter()
        if it > 0:  # iteration 0 compiles
            for k, v in zip(("gen", "ref", "reward", "update"), (t1 - t0, t2 - t1, t3 - t2, t5 - t4)):
                phases[k].append(v)
            if baseline:
                phases["update_unfused"].append(unfused_s)
    med = {k: perf.median(v) for k, v in phases.items()}
    total = sum(v for k, v in med.items() if k != "update_unfused")
    model = train_flops(cfg, mask)
    peak = perf.matmul_peak_flops(dtype=jnp.dtype(dtype))
    flops = {f"flops/executed_over_model/{k}": f / model for k, (f, _) in compiled.items()}
    temps = {f"memory/temp_gb/{k}": b / 1e9 for k, (_, b) in compiled.items()}
    util = {**{f"hfu/{k}": f / med[k] / peak for k, (f, _) in compiled.items()},
            **{f"mfu/{k}": model / med[k] / peak for k in compiled}}
    return {"workload": dict(prompts=prompts, n=n, prompt_len=prompt_len, new_tokens=new_tokens, beta=beta,
                             hidden=cfg.hidden_size, layers=cfg.num_layers, vocab=cfg.vocab_size),
            "dtype": dtype, "step_s": total, **{f"timing_s/{k}": v for k, v in med.items()},
            **({"update_speedup_over_unfused": med["update_unfused"] / med["update"]} if baseline else {}),
            "gen_tokens_per_s": prompts * n * new_tokens / med["gen"], "flops/model_update": model, **flops,
            "machine_matmul_peak_gflops": peak / 1e9, **util, **temps}
