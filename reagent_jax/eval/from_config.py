"""Builds an evaluation from an ml_collections config (launch/evaluate.py, notebooks).

See configs/evaluate_example.py for every field. The pieces: the policy and its engine
(`serve.load_policy`), the tool registry, one `BenchmarkSpec` per benchmark with its tool set,
the answer scorer (rule, or an LLM judge: an OpenAI-compatible endpoint, the evaluated policy
itself through its engine, or another checkpoint with its own engine), and for Reagent-C an
Agent-RRM judge from the same three kinds of backend.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Optional

from reagent_jax import parallel
from reagent_jax.agent import tools as tools_lib
from reagent_jax.agent.loop import AgentConfig, FINAL_STEP_MESSAGE, DEFAULT_SYSTEM_PROMPT
from reagent_jax.data import benchmark_name, load_benchmark, resolve_benchmark
from reagent_jax.endpoints import EndpointConfig
from reagent_jax.eval.harness import DEFAULT_TOOL_SETS, BenchmarkSpec, EvalSettings, Evaluator, tools_for
from reagent_jax.eval.llm_judge import LLMAnswerJudge
from reagent_jax.eval.scoring import AnswerScorer
from reagent_jax.rollout import RolloutConfig
from reagent_jax.rrm.remote import RemoteJudge
from reagent_jax.serve import EngineChatClient, ModelService, ServerLimits, build_engine, load_policy


log = logging.getLogger(__name__)
JUDGE_KINDS = ("endpoint", "policy", "checkpoint")


def _plain(value: Any) -> Any:
    return value.to_dict() if hasattr(value, "to_dict") else value


def _split(text: str) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def tool_sets(config) -> dict[str, tuple[str, ...]]:
    sets = dict(DEFAULT_TOOL_SETS)
    for key, value in (_plain(config.get("tool_sets")) or {}).items():
        sets[key] = tuple(_split(value) if isinstance(value, str) else value)
    return sets


def benchmark_specs(config) -> list[BenchmarkSpec]:
    """`config.benchmarks`: comma-separated names (files in the benchmark directory), paths,
    `tfds:reagent_benchmark/NAME` specs (built under `config.data_dir`), or name=path pairs (e.g.
    "gaia=/data/gaia.jsonl")."""
    sets, limit = tool_sets(config), int(config.get("limit", 0) or 0) or None
    data_dir = config.get("data_dir", "") or None
    specs = []
    for item in _split(config.benchmarks):
        name, _, path = item.partition("=") if "=" in item else ("", "", item)
        path = resolve_benchmark(path, data_dir)
        name = name or benchmark_name(path)
        rows = load_benchmark(path, limit=1, data_dir=data_dir)
        source = rows[0].get("source") if rows else None
        specs.append(BenchmarkSpec(name, path, tools_for(name, source, sets), limit, data_dir))
    if not specs:
        raise ValueError("config.benchmarks names no benchmark (e.g. 'bamboogle,gsm8k_full' or 'gaia=/path/gaia.jsonl')")
    return specs


def tool_registry(config, names) -> tools_lib.ToolRegistry:
    """Only the tools some benchmark uses; per-tool settings from config.tools (empty values dropped)."""
    settings = {}
    for tool, kw in (_plain(config.get("tools")) or {}).items():
        kw = {k: v for k, v in (kw or {}).items() if v not in ("", None)}
        if kw and tool in names:
            settings[tool] = kw
    return tools_lib.build_registry(settings, names=[n for n in tools_lib.TOOL_NAMES if n in names])


def agent_config(config) -> AgentConfig:
    a = config.agent
    return AgentConfig(max_turns=a.max_turns, max_tokens_per_turn=a.max_tokens_per_turn, temperature=a.temperature,
                       top_p=a.top_p, system_prompt=a.get("system_prompt") or DEFAULT_SYSTEM_PROMPT,
                       final_step_message=a.get("final_step_message") or FINAL_STEP_MESSAGE,
                       include_tool_schemas=a.include_tool_schemas, max_parallel_episodes=config.max_parallel,
                       seed=config.seed)


class _Backends:
    """Chat clients for judges; keeps engines it loads so they are built once and stopped at the end."""

    def __init__(self, config, policy, engine, mesh, engine_kwargs: dict[str, Any]):
        self.config, self.policy, self.engine, self.mesh = config, policy, engine, mesh
        self.engine_kwargs = engine_kwargs  # config.rollout's, for the judges' engines too
        self.engines: list = []
        self._policy_service: Optional[ModelService] = None

    def client(self, j, role: str):
        kind = j.kind
        if kind not in JUDGE_KINDS:
            raise ValueError(f"{role}.kind={kind!r}; use one of {JUDGE_KINDS}")
        if kind == "endpoint":
            if not j.base_url or not j.model:
                raise ValueError(f"{role}: kind 'endpoint' needs base_url and model")
            return None, EndpointConfig(base_urls=j.base_url, model=j.model, api_key_env=j.get("api_key_env") or None,
                                        max_concurrency=j.max_concurrency, temperature=0.0, max_tokens=j.max_tokens)
        limits = ServerLimits(max_tokens=j.max_tokens)
        if kind == "policy":
            svc = ModelService(self.engine, self.policy.tokenizer, self.config.policy.name or "policy", limits=limits)
        else:
            if not j.path:
                raise ValueError(f"{role}: kind 'checkpoint' needs path")
            judge_policy = load_policy(j.path, j.get("tokenizer") or None, dtype=self.config.policy.dtype, mesh=self.mesh)
            engine = build_engine(judge_policy, mesh=self.mesh, seed=self.config.seed,
                                  **self.engine_kwargs)
            self.engines.append(engine)
            svc = ModelService(engine, judge_policy.tokenizer, os.path.basename(j.path.rstrip("/")) or "judge",
                               limits=limits)
        client = EngineChatClient(svc, max_concurrency=j.max_concurrency, temperature=0.0)
        return client, EndpointConfig(model=svc.name)

    def close(self) -> None:
        for e in self.engines:
            e.stop_background()


def _judge_identity(judge) -> dict:
    """What of a judge block decides its verdicts (not where it is served from or how fast)."""
    return {k: judge.get(k) for k in ("kind", "model", "path", "tokenizer", "max_tokens")}


def run(config, out_dir: str) -> dict[str, Any]:
    """Loads everything the config names, evaluates, writes the reports; returns the summary."""
    mesh = None if config.mesh == "single" else parallel.mesh_from_preset(config.mesh)
    specs = benchmark_specs(config)
    if not config.policy.path:
        raise ValueError("config.policy.path is empty: give an HF checkpoint dir or a reagent_jax params dir")
    policy = load_policy(config.policy.path, config.policy.tokenizer or None, dtype=config.policy.dtype, mesh=mesh)
    engine_kwargs = RolloutConfig.from_config(config.rollout, "rollout").engine_kwargs()
    engine = build_engine(policy, mesh=mesh, seed=config.seed, **engine_kwargs)
    backends = _Backends(config, policy, engine, mesh, engine_kwargs)
    try:
        scorer = AnswerScorer(correct_threshold=config.scoring.correct_threshold)
        if config.scoring.method == "llm":
            client, cfg = backends.client(config.scoring.judge, "scoring.judge")
            scorer = AnswerScorer(LLMAnswerJudge(cfg, client=client), correct_threshold=config.scoring.correct_threshold)
        elif config.scoring.method != "rule":
            raise ValueError(f"scoring.method={config.scoring.method!r}; use 'rule' or 'llm'")
        rrm_judge = None
        if config.reagent_c.enabled:
            client, cfg = backends.client(config.reagent_c.judge, "reagent_c.judge")
            rrm_judge = RemoteJudge(cfg, client=client)
        names = sorted({t for s in specs for t in s.tools})
        settings = EvalSettings(k=config.k, greedy=config.greedy, seed=config.seed, max_parallel=config.max_parallel,
                                refine=bool(config.reagent_c.enabled))
        extra = {"policy": policy.path, "tokenizer": policy.tokenizer_path or "qwen3"}
        identity = {**extra, "dtype": str(config.policy.dtype), "rollout.max_len": int(config.rollout.max_len),
                    "scoring": {"method": config.scoring.method, "correct_threshold": config.scoring.correct_threshold,
                                **(_judge_identity(config.scoring.judge) if config.scoring.method == "llm" else {})},
                    "reagent_c": _judge_identity(config.reagent_c.judge) if config.reagent_c.enabled else None}
        evaluator = Evaluator(engine, policy.tokenizer, out_dir, registry=tool_registry(config, names),
                              agent_config=agent_config(config), scorer=scorer, settings=settings, rrm_judge=rrm_judge,
                              identity=identity)
        return evaluator.run(specs, extra)
    finally:
        backends.close()
        engine.stop_background()
