"""The agent training pipeline behind `launch/train.py` (and the README quickstart):

  random init -> [sft] expert trajectories -> [grpo] RL with the chosen strategy
  -> held-out accuracy table for every policy, curves PNG, summary JSON.

Agent-RRM stages (run before `grpo` when `rrm.judge == "local"`): [rrm_sft] the RRM learns a
rule annotator's judgements of expert and flawed trajectories (the synthetic world's, or built
from GSM8K-style worked solutions: `agent_rrm`); [rrm_grpo] it is then trained with the
verifiable reward format_ok * (1 - |score - target|). After them the trained RRM judges held-out
trajectories with no reference, and the run reports how well (`eval.judge_quality`).

Each stage saves `workdir/<stage>/final`; a stage that finished is not re-run, and an
interrupted one resumes from its last checkpoint.
"""
from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import random
import time

from reagent_jax import chat, checkpoint, data, worlds
from reagent_jax.agent import tools
from reagent_jax.agent.loop import AgentConfig, AgentLoop
from reagent_jax.endpoints import EndpointConfig
from reagent_jax.eval.agent_eval import evaluate_agent
from reagent_jax.eval.judge_quality import describe_quality
from reagent_jax.eval.statistics import consecutive_comparisons
from reagent_jax.evalplanner.judge import EngineJudge, JudgeConfig
from reagent_jax.evalplanner.reward import PairwiseJudgeReward, PairwiseRRM
from reagent_jax.kernels.attention import kernels_report
from reagent_jax.parallel import hosts
from reagent_jax.pipelines import agent_rrm
from reagent_jax.pipelines.context import load_policy, load_records, make_context, write_summary
from reagent_jax.registry import Registry
from reagent_jax.rollout import Engine
from reagent_jax.rrm import strategies, training
from reagent_jax.rrm.judges import LocalJudge
from reagent_jax.rrm.remote import RemoteJudge
from reagent_jax.rrm.strategies import evaluate_refinement
from reagent_jax.trainers.grpo import run_grpo
from reagent_jax.trainers.sft import render_examples, run_sft
from reagent_jax.worlds import critique_demos, rrm_annotator

log = logging.getLogger(__name__)

STAGES = ("rrm_sft", "rrm_grpo", "sft", "grpo")  # the order they run in


def build_registry(ctx):
    """The synthetic world's search corpus, or the tools' own env-configured backends."""
    names = [n.strip() for n in ctx.config.agent.tools.split(",") if n.strip()]
    if ctx.world is None:
        return tools.build_registry(names=names)
    corpus = ctx.world.write_corpus_jsonl(os.path.join(ctx.workdir, "corpus.jsonl"))
    return tools.build_registry({"search": {"backend": "local", "corpus": corpus}}, names=names)


def sft_conversations(ctx, registry, loop, train_records) -> list[list[dict]]:
    """Expert trajectories of the synthetic world, the worked solutions of the training rows
    (`data.sft_from="solutions"`: GSM8K-style calculator annotations), or `data.sft_path` rows;
    plus, for `sft.critique_fraction` of the world's questions or solution rows, a demonstration of
    the Reagent-C conversation (`critique_conversations`)."""
    if ctx.world is not None:  # the first sft.num_examples questions (GRPO still sees them all)
        questions = ctx.world.train[:ctx.blocks["sft"].num_examples or None]
        return expert_conversations(ctx, registry, loop, questions) + critique_conversations(
            ctx, registry, loop, questions)
    if ctx.config.data.get("sft_from", "") == "solutions":
        convs = solution_conversations(ctx, registry, loop, train_records)
        return convs + critique_conversations(ctx, registry, loop, train_records)
    if ctx.blocks["sft"].critique_fraction:
        raise ValueError("sft.critique_fraction needs demonstrations it can build (the synthetic world or "
                         "data.sft_from='solutions'); put attempt-critique-retry rows in data.sft_path instead, "
                         "the first attempt's assistant turns with \"weight\": 0")
    if not ctx.config.data.sft_path:
        raise ValueError("the sft stage needs config.data.sft_path (agent SFT JSONL) without a synthetic world")
    rows = data.open_rows(ctx.config.data.sft_path, data.AGENT_SFT, data_dir=ctx.config.data.get("data_dir", "") or None)
    return [list(r["messages"]) for r in rows]


def critique_conversations(ctx, registry, loop, items) -> list[list[dict]]:
    """Attempt (out of the loss), the rule judge's critique, the expert's retry, for a seeded
    `sft.critique_fraction` of the first `sft.num_examples` `items` (world questions or solution
    rows, any indexable source): `worlds.critique_demos`."""
    fraction = ctx.blocks["sft"].critique_fraction
    if not fraction:
        return []
    limit = min(ctx.blocks["sft"].num_examples or len(items), len(items))
    items = [items[i] for i in range(limit)]
    rng = random.Random(f"{ctx.config.seed}/critique")  # apart from by_hand's draws: those stay as they were
    chosen = [item for item in items if rng.random() < fraction]
    real = worlds.RegistryTools(registry)
    kw = dict(system_prompt=loop.config.system_prompt, restate_question=restate_question(ctx))
    if ctx.world is not None:
        convs = [critique_demos.synthetic_critique_demonstration(ctx.world, q, rng, tools=real, **kw) for q in chosen]
    else:
        convs = [c for c in (critique_demos.gsm8k_critique_demonstration(r, real.python, rng, **kw) for r in chosen)
                 if c is not None]
    log.info("SFT: %d attempt-critique-retry demonstrations (sft.critique_fraction=%g)", len(convs), fraction)
    return convs


def expert_conversations(ctx, registry, loop: AgentLoop, questions) -> list[list[dict]]:
    """Expert trajectories with the real tools' responses and the agent loop's own prompt."""
    system = loop.config.system_prompt
    real = worlds.RegistryTools(registry)
    fraction = ctx.blocks["sft"].by_hand_fraction
    rng = random.Random(ctx.config.seed)
    by_hand = [rng.random() < fraction for _ in questions]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda q, h: worlds.expert_trajectory(ctx.world, q, tools=real, system_prompt=system,
                                                                 by_hand=h),
                             questions, by_hand))


def solution_conversations(ctx, registry, loop, records) -> list[list[dict]]:
    """SFT conversations from the first `sft.num_examples` training rows with a worked solution."""
    real = worlds.RegistryTools(registry)
    limit = ctx.blocks["sft"].num_examples or len(records)
    convs, skipped = [], 0
    for rec in records:
        if len(convs) >= limit:
            break
        conv = worlds.annotated_trajectory(rec, real.python, system_prompt=loop.config.system_prompt)
        if conv is None:
            skipped += 1
        else:
            convs.append(conv)
    if skipped:
        log.warning("SFT: %d training rows have no meta.solution and give no demonstration", skipped)
    if not convs:
        raise ValueError("data.sft_from='solutions' but no training row has a worked solution in meta.solution")
    return convs


JUDGES: Registry = Registry("Agent-RRM judge")  # config.rrm.judge -> factory(ctx) -> a `rrm.base.Judge`


@JUDGES.register("rule")
def rule_judge(ctx) -> rrm_annotator.RuleJudge:
    """The synthetic world's rule-based annotator (needs the question records with answers)."""
    return rrm_annotator.RuleJudge()


@JUDGES.register("local")
def local_judge(ctx) -> LocalJudge:
    """The RRM trained by this run's rrm_sft / rrm_grpo stages, on an engine of its own."""
    r = ctx.config.rrm
    stage = "rrm_grpo" if ctx.has_final("rrm_grpo") else "rrm_sft"
    if not ctx.has_final(stage):
        raise ValueError("rrm.judge=local needs a trained RRM: add rrm_sft (and rrm_grpo) to config.stages")
    cfg, params = load_policy(ctx, stage)
    engine = rrm_engine(ctx, cfg, params)
    engine.start_background()
    return LocalJudge(engine, ctx.tokenizer, max_new_tokens=r.max_new_tokens)


@JUDGES.register("remote")
def remote_judge(ctx) -> RemoteJudge:
    """An Agent-RRM behind OpenAI-compatible endpoints (`rrm.base_urls`, `rrm.model`)."""
    r = ctx.config.rrm
    return RemoteJudge(EndpointConfig(base_urls=tuple(r.base_urls.split(",")), model=r.model or None))


@JUDGES.register("evalplanner")
def evalplanner_judge(ctx) -> PairwiseRRM:
    """An EvalPlanner judge (`rrm.judge_dir`: a finished EvalPlanner run) as Reagent-R's model
    reward: every pair of a GRPO group judged in both orders, score = win rate (`PairwiseRRM`)."""
    r = ctx.config.rrm
    final = latest_judge_dir(r.get("judge_dir", ""))
    tok = chat.load_tokenizer(os.path.join(os.path.dirname(os.path.dirname(final)), "tokenizer"))
    cfg, params = checkpoint.load_params(final, mesh=ctx.mesh)
    ro = ctx.rollout
    engine = Engine(cfg, params, num_slots=ro.num_slots, max_len=r.max_len, prefill_chunk=ro.prefill_chunk,
                    decode_steps=ro.decode_steps, mesh=ctx.mesh, tokenizer=tok, seed=ctx.config.seed)
    engine.start_background()
    jcfg = JudgeConfig(format=r.get("judge_format", "plan_execute"), max_plan_tokens=r.max_new_tokens,
                       max_execution_tokens=r.max_new_tokens)
    log.info("rrm.judge=evalplanner: %s (%s, pairwise round robin in both orders)", final, jcfg.format)
    return PairwiseRRM(PairwiseJudgeReward(EngineJudge(engine, tok, jcfg), seed=ctx.config.seed))


def latest_judge_dir(workdir: str) -> str:
    """The final params of an EvalPlanner run's last finished judge: DPO rounds, then SFT, then seed."""
    if not workdir or not os.path.isdir(workdir):
        raise ValueError(f"rrm.judge=evalplanner needs rrm.judge_dir, a finished EvalPlanner run's workdir "
                         f"(python launch/train.py --config=configs/evalplanner_quickstart.py); got {workdir!r}")
    rounds = sorted((int(n[len("judge_dpo_r"):]) for n in os.listdir(workdir)
                     if n.startswith("judge_dpo_r") and n[len("judge_dpo_r"):].isdigit()), reverse=True)
    for stage in [f"judge_dpo_r{k}" for k in rounds] + ["judge_sft", "judge_seed"]:
        final = os.path.join(workdir, stage, "final")
        if checkpoint.is_params_dir(final):
            return final
    raise ValueError(f"rrm.judge_dir={workdir!r} has no finished judge stage (judge_dpo_r<k>, judge_sft or "
                     "judge_seed with a final/ checkpoint)")


def make_judge(ctx):
    """The Agent-RRM judge named by config.rrm.judge (`JUDGES`)."""
    return JUDGES.get(ctx.config.rrm.judge)(ctx)


def restate_question(ctx) -> bool:
    """rrm.restate_question: critique turns (demonstrations, Reagent-U and -C retries) end with the question."""
    return bool((ctx.config.get("rrm") or {}).get("restate_question", False))


def make_strategy(ctx, judge):
    r = ctx.config.rrm
    return strategies.build(ctx.config.strategy, judge, strategies.RRMConfig(
        lam=r.lam, refine_below=r.refine_below, restate_question=restate_question(ctx)))


def rrm_engine(ctx, cfg, params) -> Engine:
    """An engine for the RRM: the run's rollout settings at the RRM's own max_len."""
    r = ctx.rollout
    return Engine(cfg, params, num_slots=r.num_slots, max_len=ctx.config.rrm.max_len, prefill_chunk=r.prefill_chunk,
                  decode_steps=r.decode_steps, mesh=ctx.mesh, tokenizer=ctx.tokenizer)


def train_rrm(ctx, registry, system_prompt, stage, train_records=()):
    """rrm_sft / rrm_grpo on annotated trajectories (`agent_rrm.rrm_records`: the synthetic world's, or
    `train_records` with worked solutions when there is no world); returns the RRM params."""
    c = ctx.config
    limit = ctx.blocks["rrm_sft"].num_examples if "rrm_sft" in ctx.blocks else 0
    count = min(limit or len(train_records), len(train_records)) if ctx.world is None else 0  # a world has its own
    records = agent_rrm.rrm_records(ctx, registry, system_prompt, [train_records[i] for i in range(count)], seed=c.seed)
    if stage == "rrm_sft":
        cfg, params = load_policy(ctx, None)
        convs = [training.sft_conversation(r["question"], r["trajectory"], r["text"]) for r in records]
        rows = render_examples(ctx.tokenizer, convs, max_len=c.rrm.max_len)
        return run_sft(ctx, cfg, params, rows, ctx.blocks["rrm_sft"], stage="rrm_sft", seed=c.seed)
    cfg, params = load_policy(ctx, "rrm_sft")
    engine = rrm_engine(ctx, cfg, params)
    collect = training.RRMCollect(ctx.tokenizer, max_new_tokens=c.rrm.max_new_tokens)
    return run_grpo(ctx, cfg, params, engine, records, ctx.blocks["rrm_grpo"], strategy=collect, stage="rrm_grpo", seed=c.seed,
                    max_len=c.rrm.max_len)


def _row(name, ev, n=1, extra=None):
    return {"policy": name, "held-out accuracy": ev["accuracy"], f"pass@{n}": ev["pass_at_n"],
            "turns": ev["num_turns"], "tool calls": ev["tool_calls"], "gen tokens/s": ev["tokens_per_s"],
            **(extra or {})}


def run(config, workdir: str) -> dict:
    t_start = time.perf_counter()
    ctx = make_context(config, workdir)
    registry = build_registry(ctx)
    train_records, heldout = load_records(ctx)
    stages = [s.strip() for s in config.stages.split(",") if s.strip()]
    unknown = set(stages) - set(STAGES)
    if unknown:
        raise ValueError(f"unknown stages {sorted(unknown)}; the agent pipeline has {', '.join(STAGES)}")

    # `--config.stages=grpo` on a workdir whose SFT stage finished earlier starts from that policy
    start_from = "sft" if "sft" not in stages and ctx.has_final("sft") else None
    cfg, params = load_policy(ctx, start_from)
    if start_from:
        log.info("starting from the finished %s stage: %s", start_from, ctx.final_dir(start_from))
    r = ctx.rollout
    engine = Engine(cfg, params, **r.engine_kwargs(), mesh=ctx.mesh, tokenizer=ctx.tokenizer, seed=config.seed)
    engine.start_background()
    a = config.agent
    tool_names = registry.names
    agent_cfg = AgentConfig(max_turns=a.max_turns, max_tokens_per_turn=a.max_tokens_per_turn,
                            temperature=a.temperature, top_p=a.top_p, include_tool_schemas=a.include_tool_schemas,
                            seed=config.seed, **({"system_prompt": a.system_prompt} if "system_prompt" in a else {}))
    loop = AgentLoop(engine, ctx.tokenizer, registry, agent_cfg, tool_names=tool_names)
    eval_loop = AgentLoop(engine, ctx.tokenizer, registry,
                          AgentConfig(**{**agent_cfg.__dict__, "max_turns": config.eval.max_turns}), tool_names)
    rows, question_scores, policy_trajs = [], {}, {}  # per policy: per-question scores, its trajectories
    extra_comparisons = []  # paired comparisons beyond consecutive policies (selective Reagent-C)
    try:
        def evaluate(name):
            if not heldout:
                return None
            n = config.eval.get("n", 1)
            ev = evaluate_agent(eval_loop, heldout, n=n, greedy=config.eval.greedy, seed=config.seed)
            rows.append(_row(name, ev, n))
            question_scores[name] = ev["question_scores"]
            policy_trajs[name] = ev["trajectories"]
            log.info("%s: held-out accuracy %.3f", name, ev["accuracy"])
            if hosts.is_leader():  # every process has every trajectory; one writes them
                with open(os.path.join(workdir, f"eval_{name}.jsonl"), "w") as f:
                    for t, score in zip(ev["trajectories"], ev["trajectory_scores"]):
                        f.write(json.dumps({**t.to_json(), "score": score}) + "\n")
            return ev

        evaluate(start_from or ("init" if config.model.init_from else "random_init"))
        judge = None
        for stage in stages:
            if stage.startswith("rrm_"):
                if not ctx.has_final(stage):
                    train_rrm(ctx, registry, agent_cfg.system_prompt, stage, train_records)
                continue
            if ctx.has_final(stage):
                log.info("%s already finished; loading its final params", stage)
                cfg, params = load_policy(ctx, stage)
            elif stage == "sft":
                convs = sft_conversations(ctx, registry, loop, train_records)
                tools_schema = loop.tool_schemas if a.include_tool_schemas else None
                examples = render_examples(ctx.tokenizer, convs, tools=tools_schema, max_len=ctx.blocks["sft"].max_len)
                params = run_sft(ctx, cfg, params, examples, ctx.blocks["sft"], seed=config.seed)
            else:
                strategy = None
                if config.strategy != "grpo":
                    judge = judge or make_judge(ctx)
                    strategy = make_strategy(ctx, judge)
                params = run_grpo(ctx, cfg, params, loop, train_records, ctx.blocks["grpo"], seed=config.seed,
                                  strategy=strategy, temperature=a.temperature, max_len=r.max_len)
            engine.update_params(params)
            evaluate(stage if config.strategy == "grpo" or stage != "grpo" else config.strategy)
        if (config.strategy == "reagent_c" or config.eval.refinement) and not heldout:
            log.warning("no held-out questions (config.eval.num_questions / data.eval_path): the Reagent-C "
                        "refinement evaluation is skipped")
        elif config.strategy == "reagent_c" or config.eval.refinement:
            judge = judge or make_judge(ctx)
            ref = evaluate_refinement(eval_loop, judge, heldout, greedy=config.eval.greedy, seed=config.seed,
                                      refine_below=config.rrm.refine_below, restate_question=restate_question(ctx))
            ref_rows, ref_scores, extra_comparisons = agent_rrm.refinement_report(
                ref, heldout, workdir, refine_below=config.rrm.refine_below,
                selective_below=config.eval.get("selective_below", 0.5), seed=config.seed)
            rows += ref_rows
            question_scores.update(ref_scores)
        rrm_quality = {}
        if any(s.startswith("rrm_") for s in stages) and heldout:  # the trained RRM on held-out trajectories
            rrm = judge if config.rrm.judge == "local" and judge is not None else local_judge(ctx)
            annotated = agent_rrm.rrm_records(ctx, registry, agent_cfg.system_prompt, heldout, split="heldout",
                                              seed=config.seed + 1)[:config.eval.get("rrm_items", 40)]
            try:
                rrm_quality = agent_rrm.evaluate_rrm(rrm, annotated, policy_trajs, workdir, seed=config.seed)
            finally:
                if rrm is not judge:
                    rrm.engine.stop_background()
    finally:
        engine.stop_background()

    return write_summary(workdir, rows, stages, time.perf_counter() - t_start, engine=engine.stats(),
                         comparisons=consecutive_comparisons(question_scores, seed=config.seed) + extra_comparisons,
                         kernels=kernels_report(cfg, ctx.mesh),
                         # per held-out question, for comparisons across runs (`--strategies`)
                         question_ids=[r.get("id") for r in heldout], question_scores=question_scores,
                         notes=[f"Agent-RRM on {describe_quality(name, q)}" for name, q in rrm_quality.items()],
                         **({"rrm": rrm_quality} if rrm_quality else {}))
