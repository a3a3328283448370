"""Rollout benchmarks (called by launch/bench.py): each function returns a dict of figures.

  throughput(...)            prefill / decode tokens/s of the engine vs transformers `generate`
  roofline(...)              per-decode-step bound from the machine's FLOP/s and bandwidth
  mixed_decode(...)          decode of many slots of mixed lengths against the HBM roofline
  decode_kernel(...)         the fused decode call alone, all slots live, per KV order and attention form
  decode_steps_sweep(...)    tokens/s vs decode steps fused per host round trip
  multi_turn(...)            8-turn trajectories: cache reuse vs re-prefilling the history
  continuous_vs_static(...)  skewed lengths: continuous batching vs static batches
  sampler(...)               the fused sampler alone on [batch, vocab] logits, per setting

Timings are medians over `iters` runs after one warm-up run (compiles excluded); on a shared
CPU compare ratios rather than absolute numbers. Everything runs in fp32 by default so the
torch CPU comparison is like for like; dtype="bfloat16" keeps fp32 weights and computes in bf16
(torch: bf16 autocast).
"""
from __future__ import annotations

import functools
import itertools
import tempfile
import time
from typing import Callable, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from reagent_jax.metrics import perf
from reagent_jax.kernels import kv_layout, xla_attention
from reagent_jax.models.config import Qwen3Config
from reagent_jax.models.functional import init_params
from reagent_jax.models.hf_io import save_hf_checkpoint
from reagent_jax.models.presets import preset
from reagent_jax.parallel.chips import chip_spec
from reagent_jax.parallel.mesh import mesh_platform
from reagent_jax.rollout import kernels
from reagent_jax.rollout.engine import Engine
from reagent_jax.rollout.sampling import SamplingParams, sample_vocab_major


def _model(cfg: Union[Qwen3Config, str], dtype: str = "float32", param_dtype: str = "float32"):
    """Random weights in `param_dtype` (fp32 like the torch baseline) computing in `dtype`, for a
    config or a preset name."""
    cfg = preset(cfg) if isinstance(cfg, str) else cfg
    cfg = cfg.replace(param_dtype=param_dtype, compute_dtype=perf.check_bench_dtype(dtype))
    return cfg, init_params(cfg, jax.random.PRNGKey(0))


def _prompts(cfg: Qwen3Config, n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, cfg.vocab_size, length).tolist() for _ in range(n)]


def _median_run(run: Callable[[], dict], iters: int) -> dict:
    """Runs once to warm up (compile), then `iters` times; returns the median-wall run."""
    run()
    runs = sorted((run() for _ in range(iters)), key=lambda r: r["wall_s"])
    return runs[len(runs) // 2]


def _engine_run(make: Callable[[], Engine], work: Callable[[Engine], object]) -> dict:
    eng = make()
    t0 = time.perf_counter()
    out = work(eng)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "stats": eng.stats(), "out": out, "decode_windows": eng.decode_windows}


def throughput(cfg: Union[Qwen3Config, str] = "bench-256", batch: int = 16, prompt_len: int = 64, new_tokens: int = 64,
               decode_steps: int = 8, iters: int = 3, with_torch: bool = True, dtype: str = "float32") -> dict:
    """Greedy generation of `new_tokens` for `batch` prompts: our engine vs transformers."""
    cfg, params = _model(cfg, dtype)
    prompts = _prompts(cfg, batch, prompt_len)
    sp = SamplingParams(temperature=0.0, max_new_tokens=new_tokens)
    make = lambda: Engine(cfg, params, num_slots=batch, max_len=prompt_len + new_tokens, prefill_chunk=prompt_len,
                          max_prefill_rows=batch, length_buckets=(prompt_len,), row_buckets=(batch,),
                          decode_steps=decode_steps)
    r = _median_run(lambda: _engine_run(make, lambda e: e.generate(prompts, sp)), iters)
    st = r["stats"]
    out = {
        "shape": dict(hidden=cfg.hidden_size, layers=cfg.num_layers, vocab=cfg.vocab_size, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens, decode_steps=decode_steps),
        "dtype": dtype,
        "engine_tokens_per_s": batch * new_tokens / r["wall_s"],
        "engine_prefill_tokens_per_s": st["prefill_tokens"] / st["prefill_seconds"],
        "engine_decode_tokens_per_s": st["decode_tokens"] / st["decode_seconds"],
        "engine_decode_step_ms": 1e3 * st["decode_seconds"] / max(1, st["decode_steps"]),
        "engine_wall_s": r["wall_s"],
    }
    if with_torch:
        hf = _transformers_generate(cfg, params, prompts, new_tokens, iters, dtype)
        ours = [o.tokens for o in r["out"]]
        out.update(hf.pop("figures"))
        out["greedy_rows_identical_to_transformers"] = float(np.mean([a == b for a, b in zip(ours, hf["tokens"])]))
        out["speedup_vs_transformers"] = out["engine_tokens_per_s"] / out["transformers_tokens_per_s"]
        out["decode_speedup_vs_transformers"] = out["engine_decode_tokens_per_s"] / out["transformers_decode_tokens_per_s"]
    return out


def _transformers_generate(cfg, params, prompts, new_tokens, iters, dtype) -> dict:
    import torch
    from transformers import Qwen3ForCausalLM
    perf.set_torch_threads()
    with tempfile.TemporaryDirectory() as d:
        save_hf_checkpoint(d, cfg, params)
        model = Qwen3ForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    ids = torch.tensor(prompts)
    mask = torch.ones_like(ids)

    def gen():
        with torch.no_grad(), perf.torch_compute(dtype):
            return model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                  do_sample=False, use_cache=True, pad_token_id=0)

    def prefill():
        with torch.no_grad(), perf.torch_compute(dtype):
            return model(ids, attention_mask=mask, use_cache=True, logits_to_keep=1)

    t_gen = perf.median(perf.time_calls(gen, iters=iters, warmup=1))
    t_pre = perf.median(perf.time_calls(prefill, iters=iters, warmup=1))
    n = ids.shape[0] * new_tokens
    tokens = gen()[:, ids.shape[1]:].tolist()
    return {"tokens": tokens, "figures": {
        "transformers_tokens_per_s": n / t_gen,
        "transformers_prefill_tokens_per_s": ids.numel() / t_pre,
        "transformers_decode_tokens_per_s": (n - ids.shape[0]) / max(1e-9, t_gen - t_pre),
        "transformers_wall_s": t_gen}}


def _kv_bytes_per_token(cfg: Qwen3Config, dtype: str) -> int:
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(dtype).itemsize  # K and V, all layers


def _hbm_bandwidth() -> tuple[float, float]:
    """(bytes/s the bound uses: the chip table's (`parallel.chips`), else the measured; measured)."""
    spec, measured = chip_spec(jax.devices()[0]), perf.memory_bandwidth()
    return (spec.hbm_gbps * 1e9 if spec is not None and spec.hbm_gbps else measured), measured


def roofline(cfg: Union[Qwen3Config, str] = "bench-256", batch: int = 16, prompt_len: int = 64, new_tokens: int = 64,
             decode_steps: int = 8, iters: int = 5, dtype: str = "float32") -> dict:
    """Bound of one decode step = max(FLOPs / peak, bytes / bandwidth), where bytes = every
    weight once + the KV cache the step attends over, both at the compute dtype's size (in bf16
    the bound of an engine that holds bf16 weights); the peak is that of a matmul in `dtype`; the
    fraction of it reached. On a shared machine every figure is the best of `iters` (least
    disturbed) run, measured interleaved."""
    cfg, params = _model(cfg, dtype)
    n = 2048
    a, b = jnp.ones((n, n), dtype), jnp.ones((n, n), dtype)
    big = jnp.ones((64 * 1024 * 1024,))  # 256 MiB
    matmul = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))  # as perf.matmul_peak_flops
    read = jax.jit(jnp.sum)
    prompts = _prompts(cfg, batch, prompt_len)
    sp = SamplingParams(temperature=0.0, max_new_tokens=new_tokens)
    make = lambda: Engine(cfg, params, num_slots=batch, max_len=prompt_len + new_tokens, prefill_chunk=prompt_len,
                          max_prefill_rows=batch, length_buckets=(prompt_len,), row_buckets=(batch,),
                          decode_steps=decode_steps)
    _engine_run(make, lambda e: e.generate(prompts, sp))  # compile
    t_mm, t_rd, t_step = [], [], []
    for _ in range(iters):
        t_mm += perf.time_calls(lambda: matmul(a, b), iters=2)
        t_rd += perf.time_calls(lambda: read(big), iters=2)
        st = _engine_run(make, lambda e: e.generate(prompts, sp))["stats"]
        t_step.append(st["decode_seconds"] / st["decode_steps"])
    peak, bw = 2.0 * n ** 3 / min(t_mm), big.size * 4 / min(t_rd)
    max_len = prompt_len + new_tokens
    size = jnp.dtype(dtype).itemsize
    param_bytes = size * cfg.num_params()
    kv_bytes = _kv_bytes_per_token(cfg, dtype) * batch * max_len
    flops = batch * cfg.flops_per_token(2 * max_len)  # attention over the whole cache row
    head_flops, head_bytes = 2 * batch * cfg.hidden_size * cfg.vocab_size, size * cfg.hidden_size * cfg.vocab_size
    bound_s = max(flops / peak, (param_bytes + kv_bytes) / bw)
    return {
        "dtype": dtype, "machine_matmul_peak_gflops": peak / 1e9, "machine_read_bandwidth_gb_s": bw / 1e9,
        "decode_step_gflop": flops / 1e9, "decode_step_mb": (param_bytes + kv_bytes) / 1e6,
        "output_projection_share_of_flops": head_flops / flops,
        "output_projection_share_of_bytes": head_bytes / (param_bytes + kv_bytes),
        "bound": "memory" if (param_bytes + kv_bytes) / bw > flops / peak else "compute",
        "decode_step_bound_ms": 1e3 * bound_s, "decode_step_best_ms": 1e3 * min(t_step),
        "decode_step_median_ms": 1e3 * perf.median(t_step),
        "fraction_of_roofline": bound_s / min(t_step),
    }


def mixed_decode(cfg: Union[Qwen3Config, str] = "bench-256", slots: int = 16, min_prompt: int = 32,
                 max_prompt: int = 256, new_tokens: int = 32, decode_steps: int = 16, iters: int = 2,
                 dtype: str = "float32", param_dtype: str = "float32") -> dict:
    """The agentic decode shape: `slots` prompts with lengths spread evenly over [min_prompt,
    max_prompt] decode `new_tokens` greedy tokens together. Decode tokens/s and step time against
    the step's HBM bound: every weight once at the engine's (compute) dtype plus the KV cache it
    reads, either the live tokens (each slot up to its own length: a ragged kernel's bytes) or
    slots x the decode window (the XLA decode's bytes: every slot reads the window of the longest),
    at the bandwidth of the chip table (`parallel.chips`) or, off it, the measured one."""
    cfg, params = _model(cfg, dtype, param_dtype)
    lengths = np.linspace(min_prompt, max_prompt, slots).astype(int)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, cfg.vocab_size, int(n)).tolist() for n in lengths]
    sp = SamplingParams(temperature=0.0, max_new_tokens=new_tokens)
    max_len = max_prompt + new_tokens
    make = lambda: Engine(cfg, params, num_slots=slots, max_len=max_len, prefill_chunk=min(512, max_prompt),
                          max_prefill_rows=min(slots, 8), decode_steps=decode_steps)
    r = _median_run(lambda: _engine_run(make, lambda e: e.generate(prompts, sp)), iters)
    st = r["stats"]
    step_s = st["decode_seconds"] / max(1, st["decode_steps"])
    kv_token = _kv_bytes_per_token(cfg, dtype)
    live_kv = kv_token * (lengths.sum() + slots * (new_tokens - 1) / 2)  # mean over the decode steps
    window = min(w for w in r["decode_windows"] if w >= int(lengths.max()) + new_tokens - 1)
    weights = jnp.dtype(dtype).itemsize * cfg.num_params()
    bw, measured_bw = _hbm_bandwidth()
    bound = {"live": (weights + live_kv) / bw, "window": (weights + kv_token * slots * window) / bw}
    return {"shape": dict(hidden=cfg.hidden_size, layers=cfg.num_layers, vocab=cfg.vocab_size, slots=slots,
                          min_prompt=min_prompt, max_prompt=max_prompt, new_tokens=new_tokens,
                          decode_steps=decode_steps, decode_window=window),
            "dtype": dtype, "device": jax.devices()[0].device_kind,
            "decode_tokens_per_s": st["decode_tokens"] / st["decode_seconds"], "decode_step_ms": 1e3 * step_s,
            "prefill_tokens_per_s": st["prefill_tokens"] / st["prefill_seconds"], "wall_s": r["wall_s"],
            "bandwidth_gb_s": bw / 1e9, "measured_bandwidth_gb_s": measured_bw / 1e9,
            "step_gb/weights": weights / 1e9, "step_gb/live_kv": live_kv / 1e9,
            "step_gb/window_kv": kv_token * slots * window / 1e9,
            **{f"bound_ms/{k}": 1e3 * v for k, v in bound.items()},
            **{f"fraction_of_roofline/{k}": v / step_s for k, v in bound.items()},
            "peak_memory_gb": perf.peak_memory_bytes() / 1e9}


def decode_kernel(cfg: Union[Qwen3Config, str] = "bench-256", slots: int = 16, min_len: int = 32,
                  max_len: int = 256, steps: int = 16, iters: int = 3, dtype: str = "float32",
                  param_dtype: str = "float32", orders: Sequence[str] = ("",), forms: Sequence[str] = ("",)) -> dict:
    """`rollout.kernels.decode` alone: one call of `steps` greedy steps with every slot live, the
    slots' cached lengths spread evenly over [min_len, max_len), over a window of max_len +
    steps. No prefill or host scheduling in the time (what `mixed_decode` includes). For each
    KV cache axis order in `orders` ("" = this platform's, `kernels.kv_layout.ORDERS`; e.g.
    "lnksd" vs "lnskd") and each decode attention form in `forms` ("" = this platform's,
    `kernels.xla_attention.DECODE_FORMS`; e.g. "einsum" vs "reduce"), so they can be compared
    on the machine itself. Figures are keyed by the order, then "/form" when one is named."""
    cfg, params = _model(cfg, dtype, param_dtype)
    params = jax.tree.map(lambda x: x.astype(cfg.compute_dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x,
                          params)  # what the engine holds
    window = max_len + steps
    lengths = jnp.asarray(np.linspace(min_len, max_len - 1, slots).astype(np.int32))
    ones = jnp.ones(slots, jnp.float32)
    state = kernels.DecodeState(
        tokens=jnp.zeros(slots, jnp.int32), lengths=lengths, active=jnp.ones(slots, bool),
        remaining=jnp.full(slots, steps, jnp.int32),
        sampling=kernels.Sampling(0 * ones, ones, jnp.zeros(slots, jnp.int32), jnp.arange(slots, dtype=jnp.uint32)),
        stop_ids=jnp.full((slots, 1), -1, jnp.int32), exit_on_done=jnp.bool_(False))
    kv_token, weights = _kv_bytes_per_token(cfg, dtype), jnp.dtype(dtype).itemsize * cfg.num_params()
    bw, _ = _hbm_bandwidth()
    bound = {"live": (weights + kv_token * (float(lengths.sum()) + slots * (steps - 1) / 2)) / bw,
             "window": (weights + kv_token * slots * window) / bw}
    out = {"shape": dict(hidden=cfg.hidden_size, layers=cfg.num_layers, slots=slots, min_len=min_len,
                         max_len=max_len, steps=steps, window=window),
           "dtype": dtype, "device": jax.devices()[0].device_kind, "bandwidth_gb_s": bw / 1e9,
           **{f"bound_ms/{k}": 1e3 * v for k, v in bound.items()}}
    platform = mesh_platform(None)
    for order, form in itertools.product(orders, forms):
        key = "/".join(x for x in (order or kv_layout.order(None), form) if x)
        saved = dict(kv_layout.ORDERS), dict(xla_attention.DECODE_FORMS)
        kv_layout.ORDERS[platform] = order or saved[0].get(platform, saved[0]["gpu"])  # both read at trace time:
        xla_attention.DECODE_FORMS[platform] = form or saved[1].get(platform, "einsum")  # one program per variant
        try:
            holder = {"cache": kernels.init_cache(cfg, slots, window)}

            def call():
                holder["cache"], tok, _ = kernels.decode(cfg, params, holder["cache"], state, num_steps=steps,
                                                         window=window, truncation=False)
                return tok

            t = perf.median(perf.time_calls(call, iters=iters, warmup=1)) / steps
            del holder
        finally:
            for table, before in zip((kv_layout.ORDERS, xla_attention.DECODE_FORMS), saved):
                table.clear()
                table.update(before)
        out.update({f"step_ms/{key}": 1e3 * t, f"tokens_per_s/{key}": slots / t,
                    **{f"fraction_of_roofline/{k}/{key}": v / t for k, v in bound.items()}})
    return out


def decode_steps_sweep(cfg: Union[Qwen3Config, str] = "bench-256", steps: Sequence[int] = (1, 4, 16), batch: int = 16,
                       prompt_len: int = 64, new_tokens: int = 64, iters: int = 3, dtype: str = "float32") -> dict:
    """Decode tokens/s for several fused steps per host round trip."""
    out = {}
    for k in steps:
        r = throughput(cfg, batch, prompt_len, new_tokens, k, iters, with_torch=False, dtype=dtype)
        out[f"decode_tokens_per_s@{k}"] = r["engine_decode_tokens_per_s"]
        out[f"tokens_per_s@{k}"] = r["engine_tokens_per_s"]
    out["speedup_fused_vs_1"] = out[f"tokens_per_s@{steps[-1]}"] / out[f"tokens_per_s@{steps[0]}"]
    return out


def multi_turn(cfg: Union[Qwen3Config, str] = "bench-256", trajectories: int = 8, turns: int = 8, prompt_len: int = 64,
               turn_tokens: int = 16, tool_tokens: int = 48, iters: int = 3, dtype: str = "float32") -> dict:
    """Agent-like trajectories (turn_tokens drawn, then tool_tokens appended, `turns` times):
    appending into the live cache vs starting a fresh request with the whole history each turn."""
    cfg, params = _model(cfg, dtype)
    prompts = _prompts(cfg, trajectories, prompt_len)
    tools = _prompts(cfg, trajectories * turns, tool_tokens, seed=1)
    sp = SamplingParams(temperature=0.0, max_new_tokens=turn_tokens)
    max_len = prompt_len + turns * (turn_tokens + tool_tokens) + turn_tokens
    make = lambda: Engine(cfg, params, num_slots=trajectories, max_len=max_len, prefill_chunk=256,
                          max_prefill_rows=trajectories, length_buckets=(64, 256), row_buckets=(trajectories,))

    def reuse(e: Engine):
        sids = [e.start(p, sp, multi_turn=True) for p in prompts]
        for t in range(turns):  # batched like `recompute`: all turns end, then all tools answer
            for sid in sids:
                e.wait(sid)
            for i, sid in enumerate(sids):
                e.append(sid, tools[t * trajectories + i], then_resume=sp)
        for sid in sids:
            e.wait(sid)
        return [e.tokens(sid) for sid in sids]  # prompt, every turn and every tool response

    def recompute(e: Engine):
        hist = [list(p) for p in prompts]
        for t in range(turns + 1):
            outs = e.generate(hist, sp)
            if t < turns:
                hist = [h + o.tokens + tools[t * trajectories + i] for i, (h, o) in enumerate(zip(hist, outs))]
        return [h + o.tokens for h, o in zip(hist, outs)]

    a = _median_run(lambda: _engine_run(make, reuse), iters)
    b = _median_run(lambda: _engine_run(make, recompute), iters)
    return {
        "shape": dict(hidden=cfg.hidden_size, layers=cfg.num_layers, vocab=cfg.vocab_size, trajectories=trajectories, turns=turns, prompt_len=prompt_len,
                      turn_tokens=turn_tokens, tool_tokens=tool_tokens),
        "reuse_wall_s": a["wall_s"], "recompute_wall_s": b["wall_s"],
        "reuse_prefill_tokens": a["stats"]["prefill_tokens"], "recompute_prefill_tokens": b["stats"]["prefill_tokens"],
        "reuse_prefill_s": a["stats"]["prefill_seconds"], "recompute_prefill_s": b["stats"]["prefill_seconds"],
        "reuse_decode_s": a["stats"]["decode_seconds"], "recompute_decode_s": b["stats"]["decode_seconds"],
        "speedup": b["wall_s"] / a["wall_s"],
        "prefill_token_ratio": b["stats"]["prefill_tokens"] / a["stats"]["prefill_tokens"],
        "prefill_time_ratio": b["stats"]["prefill_seconds"] / a["stats"]["prefill_seconds"],
        "same_trajectories": a["out"] == b["out"],
    }


def continuous_vs_static(cfg: Union[Qwen3Config, str] = "bench-256", requests: int = 24, slots: int = 8, prompt_len: int = 32,
                         short_tokens: int = 12, long_every: int = 8, long_factor: int = 10, iters: int = 3,
                         dtype: str = "float32") -> dict:
    """Every `long_every`-th request draws long_factor x more tokens. Continuous batching refills
    freed slots at once; a static batch of `slots` requests waits for its longest member."""
    cfg, params = _model(cfg, dtype)
    prompts = _prompts(cfg, requests, prompt_len)
    budgets = [short_tokens * (long_factor if i % long_every == 0 else 1) for i in range(requests)]
    sps = [SamplingParams(temperature=0.0, max_new_tokens=n) for n in budgets]
    make = lambda: Engine(cfg, params, num_slots=slots, max_len=prompt_len + max(budgets), prefill_chunk=prompt_len,
                          max_prefill_rows=slots, length_buckets=(prompt_len,), row_buckets=(slots,))
    cont = _median_run(lambda: _engine_run(make, lambda e: e.generate(prompts, sps)), iters)
    static_work = lambda e: sum((e.generate(prompts[i:i + slots], sps[i:i + slots]) for i in range(0, requests, slots)), [])
    stat = _median_run(lambda: _engine_run(make, static_work), iters)
    total = sum(budgets)
    return {
        "shape": dict(hidden=cfg.hidden_size, layers=cfg.num_layers, vocab=cfg.vocab_size, requests=requests, slots=slots, short_tokens=short_tokens, long_factor=long_factor),
        "continuous_wall_s": cont["wall_s"], "static_wall_s": stat["wall_s"],
        "continuous_tokens_per_s": total / cont["wall_s"], "static_tokens_per_s": total / stat["wall_s"],
        "continuous_utilisation": cont["stats"]["utilisation"], "static_utilisation": stat["stats"]["utilisation"],
        "continuous_decode_steps": cont["stats"]["decode_steps"], "static_decode_steps": stat["stats"]["decode_steps"],
        "speedup": stat["wall_s"] / cont["wall_s"],
        "same_tokens": [o.tokens for o in cont["out"]] == [o.tokens for o in stat["out"]],
    }


def sampler(cfg: Union[Qwen3Config, str] = "bench-256", batch: int = 16, iters: int = 5) -> dict:
    """Milliseconds per sampler call on random vocabulary-major [vocab, batch] logits (median of
    `iters`), as the kernels call it (`sample_vocab_major`), for greedy, temperature, and top-p on
    a flat (random-init-like) and a peaked distribution. The kernels compile `truncation=False`
    when no row truncates, as the engine does."""
    cfg = preset(cfg) if isinstance(cfg, str) else cfg
    flat = jax.random.normal(jax.random.PRNGKey(0), (cfg.vocab_size, batch))
    ones, zeros = jnp.ones(batch), jnp.zeros(batch)
    rest = (jnp.zeros(batch, jnp.int32), jnp.arange(batch, dtype=jnp.uint32), jnp.full(batch, 70, jnp.int32))
    plain = jax.jit(functools.partial(sample_vocab_major, truncation=False))
    full = jax.jit(sample_vocab_major)
    cases = {"greedy": (plain, flat, zeros, ones), "temperature_0.7": (plain, flat, zeros + 0.7, ones),
             "top_p_0.95_flat": (full, flat, zeros + 0.7, ones * 0.95),
             "top_p_0.95_peaked": (full, flat * 8.0, zeros + 0.7, ones * 0.95)}
    out = {}
    for name, (fn, logits, temp, top_p) in cases.items():
        times = perf.time_calls(lambda: fn(logits, temp, top_p, *rest), iters=iters, warmup=1)
        out[f"{name}_ms"] = 1e3 * perf.median(times)
    return out


def run(cfg: Union[Qwen3Config, str] = "bench-256", batch: int = 16, prompt_len: int = 64, new_tokens: int = 64,
        iters: int = 3, with_torch: bool = True, dtype: str = "float32") -> dict:
    """All rollout figures (launch/bench.py --mode=rollout): throughput vs transformers, the
    roofline, fused-step sweep, multi-turn reuse, continuous vs static batching; in `dtype`
    (the sampler always sees fp32 logits)."""
    return {"throughput": throughput(cfg, batch, prompt_len, new_tokens, iters=iters, with_torch=with_torch, dtype=dtype),
            "roofline": roofline(cfg, batch, prompt_len, new_tokens, iters=max(iters, 3), dtype=dtype),
            "decode_steps_sweep": decode_steps_sweep(cfg, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens,
                                                     iters=iters, dtype=dtype),
            "multi_turn": multi_turn(cfg, iters=iters, dtype=dtype),
            "continuous_vs_static": continuous_vs_static(cfg, iters=iters, dtype=dtype),
            "sampler": sampler(cfg, batch)}
