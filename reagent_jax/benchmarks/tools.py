"""Agent-runtime benchmarks (`launch/bench.py --mode=tools`): retrieval server queries/s over
loopback, sandbox calls/s, and how well the agent loop hides tool latency behind decoding."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

from reagent_jax import chat, checkpoint, rollout, worlds
from reagent_jax.agent import retrieval, tools
from reagent_jax.agent.loop import AgentConfig, AgentLoop
from reagent_jax.benchmarks.sandbox import sandbox_calls_per_second


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def retrieval_qps(corpus_path: str, n: int = 400, concurrency: int = 8) -> dict:
    """Starts launch/retrieval_server.py on loopback, fires n queries, stops it."""
    port = _free_port()
    script = os.path.join(os.path.dirname(__file__), "..", "..", "launch", "retrieval_server.py")
    proc = subprocess.Popen([sys.executable, script, f"--corpus={corpus_path}", f"--port={port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/retrieve"
    try:
        deadline = time.time() + 60
        while True:
            try:
                retrieval.RetrievalClient(url, timeout_s=2).search(["probe"], 1)
                break
            except Exception:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError("retrieval server did not start")
                time.sleep(0.2)
        return retrieval.benchmark_queries(url, n=n, concurrency=concurrency)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class _DelayedRegistry:
    """Adds a fixed latency to every tool turn (what a remote search or browse costs)."""

    def __init__(self, registry, delay_s: float):
        self.registry, self.delay_s, self.names = registry, delay_s, registry.names

    def schemas(self):
        return self.registry.schemas()

    def call_many(self, calls):
        time.sleep(self.delay_s)
        return self.registry.call_many(calls)


def tool_overlap(workdir: str, delay_s: float = 0.2, episodes: int = 32, max_turns: int = 6) -> dict:
    """Wall time of a batch of multi-turn episodes with and without an artificial latency on every
    tool turn. Uses a quickstart workdir's SFT policy (it really calls tools) with its tokenizer
    and corpus. A ratio near 1 means the tool time is hidden behind other episodes' decoding."""
    tok = chat.load_tokenizer(os.path.join(workdir, "tokenizer"))
    cfg, params = checkpoint.load_params(os.path.join(workdir, "sft", "final"))
    registry = tools.build_registry({"search": {"backend": "local", "corpus": os.path.join(workdir, "corpus.jsonl")}},
                                    names=["search", "python"])
    records = _heldout(workdir)[:episodes]
    engine = rollout.Engine(cfg, params, num_slots=episodes, max_len=768, prefill_chunk=256, tokenizer=tok)
    engine.start_background()
    agent_cfg = AgentConfig(max_turns=max_turns, max_tokens_per_turn=96, include_tool_schemas=False, temperature=1.0)
    out = {}
    try:
        for name, reg in (("no_latency", registry), ("latency", _DelayedRegistry(registry, delay_s))):
            loop = AgentLoop(engine, tok, reg, agent_cfg, tool_names=["search", "python"])
            loop.run(records[:4], greedy=True)  # compile
            times = []
            for rep in range(3):
                t0 = time.perf_counter()
                trajs = loop.run(records, seed=rep)
                times.append(time.perf_counter() - t0)
            out[name + "_s"] = sorted(times)[1]
            out[name + "_tool_turns"] = sum(t.tool_stats.calls for t in trajs)
    finally:
        engine.stop_background()
    out["ratio"] = out["latency_s"] / out["no_latency_s"]
    out["delay_s"] = delay_s
    out["episodes"] = len(records)
    return out


def _heldout(workdir: str) -> list[dict]:
    """Held-out questions of the quickstart world (its eval files list them with answers)."""
    import json
    path = os.path.join(workdir, "eval_sft.jsonl")
    rows = [json.loads(line) for line in open(path)]
    return [{"id": r["id"], "question": r["question"], "answer": r["answer"], "data_source": "synthetic"}
            for r in rows]


def run(iters: int = 1, workdir: str | None = None) -> dict:
    out = {}
    if workdir:
        out["tool_overlap"] = tool_overlap(workdir)
    world = worlds.make_world(worlds.WorldConfig(seed=0, n_entities=200, n_questions=10))
    with tempfile.TemporaryDirectory() as d:
        corpus = world.write_corpus_jsonl(os.path.join(d, "corpus.jsonl"))
        qps = retrieval_qps(corpus)
    out.update({"retrieval": qps, "sandbox_c1": sandbox_calls_per_second(n=20, concurrency=1),
                "sandbox_c4": sandbox_calls_per_second(n=40, concurrency=4)})
    return out
