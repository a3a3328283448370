"""Benchmarks of serving and evaluation; each function returns a dict of figures.

  server_under_load(...)  N concurrent clients on loopback, fixed prompt and output lengths:
                          requests/s, output tokens/s, latency percentiles, next to the engine's
                          offline throughput on the same workload with the same engine (all
                          requests queued at once), and next to the same N clients as threads in
                          process (closed loop, no HTTP). server vs closed loop is the server's
                          own overhead (HTTP, JSON, detokenisation, threads); closed loop vs
                          offline is what clients that wait for each answer cost the batch.
  eval_wall_time(...)     wall time of the evaluation harness per 100 questions of a multi-hop QA
                          set, tiny random model, local BM25 retrieval (a cold pass that compiles,
                          then the timed pass with other seeds).

Prompts are random token ids sent to /v1/completions with ignore_eos, so every request draws
exactly `new_tokens` tokens whatever the model says. The clients run in a separate process.
Both measurements follow one untimed warm-up (compilation). On a shared CPU compare ratios.
"""
from __future__ import annotations

import os
import tempfile
import time
from typing import Any, Optional

import jax
import numpy as np

from reagent_jax import chat, models
from reagent_jax.agent import tools as tools_lib
from reagent_jax.agent.loop import AgentConfig
from reagent_jax.benchmarks import loadgen
from reagent_jax.data import benchmark_dir, list_benchmarks, load_benchmark
from reagent_jax.eval.harness import BenchmarkSpec, EvalSettings, Evaluator
from reagent_jax.rollout import Engine, SamplingParams
from reagent_jax.serve.app import make_app
from reagent_jax.serve.policy import load_policy
from reagent_jax.serve.protocol import ServerLimits
from reagent_jax.serve.server import ServerThread
from reagent_jax.serve.service import ModelService


def _tokenizer_for(cfg):
    """The real Qwen3 tokenizer for full-vocabulary presets, else a compact one that fits."""
    if cfg.vocab_size >= chat.QWEN3_MODEL_VOCAB_SIZE:
        return chat.load_tokenizer(None)
    texts = ["The quick brown fox jumps over the lazy dog. " * 20, "Search, browse and compute: \\boxed{42}."]
    return chat.build_compact_tokenizer(texts, vocab_size=min(cfg.vocab_size, 512))


def _percentiles(xs, prefix: str) -> dict[str, float]:
    xs = np.asarray([x for x in xs if x is not None], np.float64)
    if xs.size == 0:
        return {}
    return {f"{prefix}_p{p}_ms": float(1e3 * np.percentile(xs, p)) for p in (50, 90, 99)} | {
        f"{prefix}_mean_ms": float(1e3 * xs.mean())}


def server_under_load(preset: str = "bench-256", clients: int = 64, requests: int = 256, prompt_len: int = 64,
                      new_tokens: int = 64, num_slots: int = 64, decode_steps: int = 8, stream: bool = False,
                      repeats: int = 3, seed: int = 0, **model_overrides) -> dict[str, Any]:
    """See the module docstring. `requests` in all, `clients` at a time; offline and server runs
    alternate `repeats` times; throughputs are medians, overheads the median over repeats of each
    repeat's back-to-back ratio (a shared machine drifts).
    `model_overrides` change the preset's shape (e.g. vocab_size=16384)."""
    cfg = models.preset(preset, compute_dtype="float32", param_dtype="float32", **model_overrides)
    params = models.init_params(cfg, jax.random.PRNGKey(seed))
    tok = _tokenizer_for(cfg)
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, min(cfg.vocab_size, len(tok)), prompt_len).tolist() for _ in range(requests)]
    rows = min(num_slots, 16)
    engine = Engine(cfg, params, num_slots=num_slots, max_len=prompt_len + new_tokens, prefill_chunk=prompt_len,
                    max_prefill_rows=rows, length_buckets=(prompt_len,), row_buckets=(rows,),
                    decode_steps=decode_steps, tokenizer=tok, seed=seed)
    engine.start_background()
    sp = [SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=i) for i in range(requests)]
    bodies = [{"model": preset, "prompt": p, "max_tokens": new_tokens, "ignore_eos": True, "temperature": 1.0,
               "seed": i} for i, p in enumerate(prompts)]
    service = ModelService(engine, tok, preset, limits=ServerLimits(max_tokens=new_tokens,
                                                                    max_concurrent=max(256, 2 * clients)))
    offline, closed, loads = [], [], []
    try:
        with ServerThread(make_app(service)) as server:
            engine.generate(prompts[:num_slots], sp[:num_slots])  # warm-up: compile every shape the runs use
            loadgen.run_in_subprocess(server.base_url, bodies[:clients], clients, stream=stream)
            for _ in range(repeats):
                t0 = time.perf_counter()
                outs = engine.generate(prompts, sp)
                offline.append((time.perf_counter() - t0, sum(len(o.tokens) for o in outs)))
                closed.append(_closed_loop(engine, prompts, sp, clients))
                loads.append(loadgen.run_in_subprocess(server.base_url, bodies, clients, stream=stream))
            peak = server.app.state.inflight.peak
    finally:
        engine.stop_background()
    offline_wall, offline_tokens = sorted(offline)[len(offline) // 2]
    closed_wall = sorted(closed)[len(closed) // 2]
    load = sorted(loads, key=lambda x: x["wall_s"])[len(loads) // 2]
    res = load["results"]
    ok = [r for r in res if r["ok"]]
    tokens = sum(r["completion_tokens"] for r in ok)
    out = {
        "shape": dict(preset=preset, clients=clients, requests=requests, prompt_len=prompt_len, new_tokens=new_tokens,
                      num_slots=num_slots, decode_steps=decode_steps, stream=stream, repeats=repeats,
                      cpus=os.cpu_count(), backend=jax.default_backend(), **model_overrides),
        "server_requests_ok": len(ok), "server_requests_failed": len(res) - len(ok),
        "server_wall_s": load["wall_s"], "server_requests_per_s": len(ok) / load["wall_s"],
        "server_output_tokens_per_s": tokens / load["wall_s"], "server_peak_in_flight": peak,
        **_percentiles([r["latency_s"] for r in ok], "latency"),
        "offline_wall_s": offline_wall, "offline_requests_per_s": requests / offline_wall,
        "offline_output_tokens_per_s": offline_tokens / offline_wall,
        "closed_loop_wall_s": closed_wall, "closed_loop_output_tokens_per_s": offline_tokens / closed_wall,
        "server_wall_s_all": [x["wall_s"] for x in loads], "offline_wall_s_all": [w for w, _ in offline],
        "closed_loop_wall_s_all": closed,
    }
    if stream:
        out.update(_percentiles([r["ttft_s"] for r in ok], "ttft"))
    # Overheads from each repeat's back-to-back runs (robust to a machine whose load drifts), median.
    walls = [(o[0], c, x["wall_s"]) for o, c, x in zip(offline, closed, loads)]
    out["server_overhead_pct"] = float(np.median([100.0 * (1.0 - o / x) for o, _, x in walls]))
    out["server_overhead_vs_closed_loop_pct"] = float(np.median([100.0 * (1.0 - c / x) for _, c, x in walls]))
    out["closed_loop_cost_vs_offline_pct"] = float(np.median([100.0 * (1.0 - o / c) for o, c, _ in walls]))
    return out


def _closed_loop(engine, prompts, sp, clients: int) -> float:
    """Wall time of the same requests from `clients` threads in this process, each sending its
    next request when the last one is answered: the server's arrival pattern without HTTP."""
    import concurrent.futures
    import queue
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for i in range(len(prompts)):
        todo.put(i)

    def client():
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            engine.wait(engine.start(prompts[i], sp[i]))
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(client) for _ in range(clients)]:
            f.result()
    return time.perf_counter() - t0


def _retrieval_corpus(path: str, exclude: str) -> int:
    """A BM25 corpus from the other benchmark files' questions and GSM8K's worked solutions
    (realistic text and size for timing; it does not hold the evaluated set's answers)."""
    import json
    n = 0
    with open(path, "w") as f:
        for name in list_benchmarks():
            if name == exclude:
                continue
            for row in load_benchmark(os.path.join(benchmark_dir(), name + ".jsonl")):
                for j, text in enumerate([row["question"], (row.get("meta") or {}).get("solution")]):
                    if isinstance(text, str) and text.strip():
                        f.write(json.dumps({"id": f"{row['id']}/{j}", "title": row["source"], "text": text[:1500]}) + "\n")
                        n += 1
    return n


def eval_wall_time(benchmark: str = "hotpotqa", questions: int = 100, k: int = 1, max_turns: int = 4,
                   max_tokens_per_turn: int = 96, num_slots: int = 64, max_len: int = 2048,
                   include_tool_schemas: bool = False, policy_path: Optional[str] = None,
                   seed: int = 0) -> dict[str, Any]:
    """Evaluation wall time per 100 questions (search + browse tools, local BM25 retrieval).
    Default policy: the tiny random preset with a compact tokenizer (as the quickstart, without
    tool schemas in the prompt, so prompts stay short); or `policy_path`."""

    with tempfile.TemporaryDirectory() as d:
        corpus = os.path.join(d, "corpus.jsonl")
        docs = _retrieval_corpus(corpus, benchmark)
        if policy_path:
            policy = load_policy(policy_path)
            cfg, params, tok = policy.cfg, policy.params, policy.tokenizer
        else:
            tok = chat.build_compact_tokenizer([open(corpus).read()], vocab_size=512)
            cfg = models.preset("tiny", compute_dtype="float32", vocab_size=512)
            params = models.init_params(cfg, jax.random.PRNGKey(seed))
        registry = tools_lib.build_registry({"search": {"backend": "local", "corpus": corpus}},
                                            names=["search", "browse"])
        registry.call("search", {"query": "warm up the index"})  # build the BM25 index outside the timing
        queries = [r["question"][:200] for r in load_benchmark(benchmark, limit=questions)]
        t0 = time.perf_counter()
        hits = registry.call_many([("search", {"query": q}) for q in queries], max_workers=1)
        search_ms = 1e3 * (time.perf_counter() - t0) / len(queries)
        search_ok = sum(h.ok for h in hits) / len(hits)
        engine = Engine(cfg, params, num_slots=num_slots, max_len=max_len, prefill_chunk=512, tokenizer=tok, seed=seed)
        engine.start_background()
        agent = AgentConfig(max_turns=max_turns, max_tokens_per_turn=max_tokens_per_turn, temperature=1.0, seed=seed,
                            include_tool_schemas=include_tool_schemas)
        spec = BenchmarkSpec(benchmark, benchmark, ("search", "browse"), questions)
        try:  # a cold pass (compiles the shapes these prompts need), then the timed pass with other seeds
            warm = Evaluator(engine, tok, os.path.join(d, "cold"), registry=registry, agent_config=agent,
                             settings=EvalSettings(k=k, seed=seed + 1, max_parallel=2 * num_slots), progress=False)
            t0 = time.perf_counter()
            warm.run([spec])
            cold_wall = time.perf_counter() - t0
            before = engine.stats()
            ev = Evaluator(engine, tok, os.path.join(d, "run"), registry=registry, agent_config=agent,
                           settings=EvalSettings(k=k, seed=seed, max_parallel=2 * num_slots), progress=False)
            t0 = time.perf_counter()
            summary = ev.run([spec])
            wall = time.perf_counter() - t0
            after = engine.stats()
        finally:
            engine.stop_background()
    s = summary["benchmarks"][benchmark]
    decode_tokens = after["decode_tokens"] - before["decode_tokens"]
    return {
        "shape": dict(benchmark=benchmark, questions=s["questions"], k=k, max_turns=max_turns,
                      max_tokens_per_turn=max_tokens_per_turn, num_slots=num_slots, max_len=max_len,
                      include_tool_schemas=include_tool_schemas, corpus_docs=docs,
                      policy=policy_path or "tiny random", cpus=os.cpu_count()),
        "wall_s": wall, "wall_s_per_100_questions": 100 * wall / max(1, s["questions"]),
        "cold_wall_s_per_100_questions": 100 * cold_wall / max(1, s["questions"]),
        "episodes_per_s": s["questions"] * k / wall, "turns_per_episode": s["turns"],
        "tool_calls_per_episode": s["tool_calls"], "response_tokens_per_episode": s["response_tokens"],
        "generated_tokens_per_s": decode_tokens / wall,
        "compiles_during_run": after["compiles"] - before["compiles"],
        **{f"engine_{k}_during_run": after[k] - before[k] for k in (
            "prefill_calls", "prefill_tokens", "prefill_padded_tokens", "prefill_seconds", "decode_calls",
            "decode_steps", "decode_seconds")},
        "tool_seconds_per_episode": s.get("tool_seconds"),
        "search_ms_per_call": search_ms, "search_ok_fraction": search_ok,  # the questions as queries, one at a time
        "avg@k": s["avg@k"],
    }
