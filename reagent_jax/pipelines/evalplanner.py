"""The EvalPlanner pipeline behind `launch/train.py` (config.pipeline == "evalplanner"):

  [judge_seed]  (quickstart) SFT on a scripted, deliberately mediocre judge's chains -> seed judge
                (otherwise the seed judge is `model.init_from`, e.g. an instruct checkpoint)
  judge_data    round-1 chains sampled with the seed judge: |P| plans x |E| executions x 2 orders
                per instruction -> labelled chains, DPO pairs, SFT chains (JSONL)
  judge_sft     SFT on one correct chain per instruction, from the seed judge
  judge_dpo     round 1: DPO on the round-1 pairs from the SFT judge (reference = the SFT judge);
                round r > 1: fresh instructions, chains regenerated with the round r-1 judge, DPO
                from it (reference = it). `dpo.rounds` rounds (2 in the paper).

After the seed and after every training stage the judge is evaluated on the held-out pairs
(pairwise and position-consistent accuracy, per category); the table is printed and saved.

Workdir layout (every round's data, checkpoint and metrics are kept):
  data/<split>.jsonl           triples of each split (seed, round1, round2, ..., eval)
  tokenizer/                   the compact tokenizer (quickstart)
  judge_seed/ judge_sft/ judge_dpo_r<r>/   metrics.jsonl, TensorBoard, ckpt/, final/
  judge_data/ judge_data_r<r>/ chains.jsonl, pairs.jsonl, sft.jsonl, stats.json (written last)
  eval/<judge>.json + .jsonl   report and every judgement
  summary.json, curves_<stage>.png
A stage whose output exists (final/ or stats.json) is not redone; an interrupted training stage
resumes from its last checkpoint.
"""
from __future__ import annotations

import json
import logging
import os
import time

from reagent_jax import chat, checkpoint, metrics as metrics_lib
from reagent_jax.data import load_benchmark
from reagent_jax.evalplanner import prompts as P
from reagent_jax.evalplanner.evaluate import evaluate_pairs, load_pairwise_set, report_rows
from reagent_jax.evalplanner.judge import EngineJudge, JudgeConfig
from reagent_jax.evalplanner.pairs import (Triple, build_preference_data, chain_records, engine_solution_sampler,
                                           load_triples, math_triples, read_jsonl, sample_chains, write_jsonl)
from reagent_jax.worlds.pairwise import SyntheticTeacher, synthetic_triples
from reagent_jax.evalplanner.training import dpo_rows, fit_batch, run_dpo, sft_rows
from reagent_jax.kernels.attention import kernels_report
from reagent_jax.pipelines.context import build_world, load_policy, make_context
from reagent_jax.rollout import Engine
from reagent_jax.trainers.sft import run_sft

log = logging.getLogger(__name__)

STAGES = ("judge_seed", "judge_data", "judge_sft", "judge_dpo")


def parse_stages(text: str) -> list[str]:
    stages = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise ValueError(f"unknown stages {unknown}; the evalplanner pipeline has {', '.join(STAGES)}")
    if stages != sorted(stages, key=STAGES.index):
        raise ValueError(f"stages {stages} are out of order; run them in the order {', '.join(STAGES)}")
    return stages


# ---- triples -----------------------------------------------------------------------------------
def _synthetic_splits(config, world) -> dict[str, list[Triple]]:
    d = config.data
    flaws = [f.strip() for f in d.flaws.split(",") if f.strip()] or None
    make = lambda qs: synthetic_triples(world, qs, seed=config.seed, response_kind=d.response_kind, flaws=flaws)
    train = list(world.train)
    sizes = [("seed", d.num_seed)] + [(f"round{r}", d.num_per_round) for r in range(1, config.dpo.rounds + 1)]
    if sum(n for _, n in sizes) > len(train):
        raise ValueError(f"data: {sum(n for _, n in sizes)} train instructions needed ({sizes}) but the world has "
                         f"{len(train)}; raise world.n_questions or lower data.num_seed / num_per_round")
    out, start = {}, 0
    for name, n in sizes:
        out[name] = make(train[start:start + n])
        start += n
    out["eval"] = make(list(world.heldout)[:d.num_eval])
    return out


def _file_splits(config) -> dict[str, list[Triple]]:
    d = config.data
    if not d.eval_paths:
        raise ValueError("data.source='jsonl' needs data.eval_paths (pairwise JSONL, EVALPLANNER_PAIR schema)")
    data_dir = d.get("data_dir", "") or None
    out = {"eval": load_pairwise_set(d.eval_paths.split(","), data_dir=data_dir)[:d.num_eval]}
    if d.source == "jsonl":
        train = load_triples(d.train_paths.split(","), data_dir=data_dir)
        rounds = config.dpo.rounds
        if len(train) <= (rounds - 1) * d.num_per_round:  # the last round would get no instruction at all
            raise ValueError(f"data: {rounds} DPO rounds of {d.num_per_round} fresh instructions need more than "
                             f"{(rounds - 1) * d.num_per_round} triples, but data.train_paths has {len(train)}; "
                             "add triples or lower dpo.rounds / data.num_per_round")
        for r in range(1, rounds + 1):  # fresh instructions for every round
            out[f"round{r}"] = train[(r - 1) * d.num_per_round:r * d.num_per_round]
    return out


def load_splits(config, workdir: str, world) -> dict[str, list[Triple]]:
    """Triples of every split, written once to data/ and reloaded afterwards (math rounds are
    made later, with the judge being trained as the solution sampler)."""
    ddir = os.path.join(workdir, "data")
    if os.path.exists(os.path.join(ddir, "eval.jsonl")):
        return {f[:-6]: [Triple.from_json(r) for r in read_jsonl(os.path.join(ddir, f))]
                for f in sorted(os.listdir(ddir)) if f.endswith(".jsonl")}
    if config.data.source == "synthetic":
        splits = _synthetic_splits(config, world)
    elif config.data.source in ("jsonl", "math"):
        splits = _file_splits(config)
    else:
        raise ValueError(f"data.source={config.data.source!r}; use 'synthetic', 'jsonl' or 'math'")
    # eval.jsonl marks the splits as written, so it goes last: a crash in between redoes them all.
    for name in sorted(splits, key=lambda n: n == "eval"):
        write_jsonl(os.path.join(ddir, f"{name}.jsonl"), [t.to_json() for t in splits[name]])
    return splits


def judge_prompt_texts() -> list[str]:
    """The fixed text of every judge prompt and output marker (tokenizer training data)."""
    demo = ("instruction", "response A", "response B")
    prompts = P.plan_messages(demo[0]) + P.execution_messages(*demo, "plan") + P.judge_messages(*demo) \
        + P.verdict_only_messages(*demo)
    return [m["content"] for m in prompts] + [P.format_judge_output("plan", "execution", v) for v in P.VERDICTS]


def build_judge_tokenizer(texts: list[str], vocab_size: int):
    """Compact BPE on the task's texts plus the judge prompts (weighted, so the fixed prompt words
    become single tokens and a tiny model reads short sequences)."""
    return chat.build_compact_tokenizer(list(texts) + judge_prompt_texts() * 20, vocab_size=vocab_size)


def ensure_tokenizer(config, workdir: str, splits) -> None:
    """Trains the compact tokenizer once per workdir; `make_context` then loads it."""
    path = os.path.join(workdir, "tokenizer")
    if config.tokenizer.kind != "compact" or os.path.exists(os.path.join(path, "tokenizer.json")):
        return
    if config.tokenizer.path:  # e.g. the tokenizer of the run whose seed judge this run starts from
        chat.load_tokenizer(config.tokenizer.path).save_pretrained(path)
        return
    texts = [x for ts in splits.values() for t in ts for x in (t.instruction, t.chosen, t.rejected)]
    if "seed" in splits:  # the scripted teacher's chains: the words a seed judge will write
        teacher = SyntheticTeacher(build_world(config), splits["seed"], fmt=config.judge.format)
        for t in splits["seed"]:
            texts += [teacher.plans([t.item(False)], 1)[0][0], teacher.chain(t.item(False), "", False).output]
    tok = build_judge_tokenizer(texts, config.tokenizer.vocab_size)
    os.makedirs(path, exist_ok=True)
    tok.save_pretrained(path)


# ---- the pipeline ------------------------------------------------------------------------------
class _Run:
    def __init__(self, config, workdir: str):
        self.config, self.workdir = config, workdir
        self.world = build_world(config) if config.data.source == "synthetic" else None
        self.splits = load_splits(config, workdir, self.world)
        ensure_tokenizer(config, workdir, self.splits)
        self.ctx = make_context(config, workdir)
        self.tok = self.ctx.tokenizer
        j = config.judge
        self.jcfg = JudgeConfig(format=j.format, temperature=j.temperature, top_p=j.top_p,
                                max_plan_tokens=j.max_plan_tokens, max_execution_tokens=j.max_execution_tokens,
                                enable_thinking=j.enable_thinking)
        self.cfg, self.params = load_policy(self.ctx, None)
        self.engine = Engine(self.cfg, self.params, **self.ctx.rollout.engine_kwargs(), mesh=self.ctx.mesh,
                             tokenizer=self.tok, seed=config.seed)
        self.judge = EngineJudge(self.engine, self.tok, self.jcfg)
        self.rows = []

    def set_params(self, params) -> None:
        self.params = params
        self.engine.update_params(params)

    def train_stage(self, stage: str, train_fn):
        """Loads <stage>/final when the stage finished before, else trains (resuming if needed)."""
        if self.ctx.has_final(stage):
            log.info("%s already finished; loading its final params", stage)
            _, params = load_policy(self.ctx, stage)
        else:
            params = train_fn()
        self.set_params(params)

    def evaluate(self, name: str) -> None:
        path = os.path.join(self.workdir, "eval", f"{name}.json")
        if os.path.exists(path):
            with open(path) as f:
                report = json.load(f)
        else:
            report, records = evaluate_pairs(self.judge, self.splits["eval"], seed=self.config.seed,
                                             both_orders=self.config.eval.both_orders)
            write_jsonl(path[:-5] + ".jsonl", records)
            with open(path + ".tmp", "w") as f:
                json.dump(report, f, indent=2)
            os.replace(path + ".tmp", path)
        self.rows.extend(report_rows(name, report))
        log.info("%s: pairwise accuracy %.3f", name, report["all"]["pairwise_accuracy"])

    def round_triples(self, r: int) -> list[Triple]:
        name = f"round{r}"
        if name not in self.splits:  # math: solutions sampled now, by the judge being trained
            d = self.config.data
            problems = load_benchmark(d.math_path, limit=r * d.num_per_round,
                                      data_dir=d.get("data_dir", "") or None)[(r - 1) * d.num_per_round:]
            sampler = engine_solution_sampler(self.engine, self.tok, seed=self.config.seed + r,
                                              max_new_tokens=self.jcfg.max_execution_tokens)
            self.splits[name] = math_triples(problems, sampler, n=d.math_samples, seed=self.config.seed + r)
            write_jsonl(os.path.join(self.workdir, "data", f"{name}.jsonl"), [t.to_json() for t in self.splits[name]])
        return self.splits[name]

    def chain_source(self, triples):
        c = self.config.chains
        if c.source == "model":
            return self.judge
        if c.source == "teacher":  # scripted chains (tests, or distilling the rule-based judge)
            return SyntheticTeacher(self.world, triples, fmt=self.jcfg.format,
                                    error_rate=self.ctx.blocks["seed_judge"].teacher_error_rate)
        raise ValueError(f"chains.source={c.source!r}; use 'model' or 'teacher'")

    def data_round(self, r: int) -> dict:
        """Labelled chains, pairs and SFT chains of round r (loaded when already made)."""
        d = self.ctx.stage_dir("judge_data" if r == 1 else f"judge_data_r{r}")
        stats_path = os.path.join(d, "stats.json")
        if not os.path.exists(stats_path):
            c = self.config.chains
            triples = self.round_triples(r)
            t0 = time.perf_counter()
            chains = sample_chains(triples, self.chain_source(triples), num_plans=c.num_plans,
                                   num_executions=c.num_executions, seed=self.config.seed * 1000 + r)
            data = build_preference_data(triples, chains, pairing=c.pairing, seed=self.config.seed + r)
            write_jsonl(os.path.join(d, "chains.jsonl"), [ch.to_json() for ch in chains])
            write_jsonl(os.path.join(d, "pairs.jsonl"), data.pairs)
            write_jsonl(os.path.join(d, "sft.jsonl"), data.sft)
            stats = {"round": r, **data.stats, "dropped_ids": data.dropped_ids, "seconds": time.perf_counter() - t0}
            with open(stats_path + ".tmp", "w") as f:
                json.dump(stats, f, indent=2)
            os.replace(stats_path + ".tmp", stats_path)
        return {"pairs": read_jsonl(os.path.join(d, "pairs.jsonl")), "sft": read_jsonl(os.path.join(d, "sft.jsonl"))}

    # ---- stages --------------------------------------------------------------------------------
    def seed_stage(self) -> None:
        if self.world is None or "seed" not in self.splits:
            raise ValueError("judge_seed needs data.source='synthetic' (the scripted teacher judges synthetic pairs)")
        s = self.ctx.blocks["seed_judge"]
        formats = [f.strip() for f in (s.formats or self.jcfg.format).split(",") if f.strip()]

        def train():
            triples, rows = self.splits["seed"], []
            for fmt in formats:  # several formats: one seed judge for the format ablations
                teacher = SyntheticTeacher(self.world, triples, fmt=fmt, error_rate=s.teacher_error_rate)
                chains = sample_chains(triples, teacher, num_plans=1, num_executions=1, seed=self.config.seed)
                rows += sft_rows(self.tok, chain_records(triples, chains), fmt,
                                 enable_thinking=self.jcfg.enable_thinking, max_len=s.max_len)
            return run_sft(self.ctx, self.cfg, self.params, rows, fit_batch(s, len(rows)), stage="judge_seed",
                           seed=self.config.seed)
        self.train_stage("judge_seed", train)

    def skip(self, stage: str, why: str):
        """A stage without data keeps its start params (saved as its final), so later rounds can run."""
        log.warning("%s: %s; the stage keeps its start params", stage, why)
        checkpoint.save_params(self.ctx.final_dir(stage), self.cfg, self.params)
        return self.params

    def sft_stage(self) -> None:
        def train():
            records = self.data_round(1)["sft"]
            rows = sft_rows(self.tok, records, self.jcfg.format, enable_thinking=self.jcfg.enable_thinking,
                            max_len=self.ctx.blocks["sft"].max_len)
            if not rows:
                return self.skip("judge_sft", "no correct chain in round 1 (the seed judge was never right)")
            return run_sft(self.ctx, self.cfg, self.params, rows, fit_batch(self.ctx.blocks["sft"], len(rows)),
                           stage="judge_sft", seed=self.config.seed)
        self.train_stage("judge_sft", train)

    def dpo_round(self, r: int) -> None:
        def train():
            pairs = dpo_rows(self.tok, self.data_round(r)["pairs"], self.jcfg.format,
                             enable_thinking=self.jcfg.enable_thinking, max_len=self.ctx.blocks["dpo"].max_len)
            if not pairs:
                return self.skip(f"judge_dpo_r{r}", f"no DPO pairs in round {r} (no plan and order had both a "
                                                    "right and a wrong chain)")
            return run_dpo(self.ctx, self.cfg, self.params, pairs, fit_batch(self.ctx.blocks["dpo"], len(pairs)),
                           stage=f"judge_dpo_r{r}", seed=self.config.seed + r)
        self.train_stage(f"judge_dpo_r{r}", train)


def run(config, workdir: str) -> dict:
    t_start = time.perf_counter()
    stages = parse_stages(config.stages)
    os.makedirs(workdir, exist_ok=True)
    run_ = _Run(config, workdir)
    run_.engine.start_background()
    try:
        if stages and stages[0] == "judge_seed":
            run_.seed_stage()
        run_.evaluate("seed")
        for stage in stages:
            if stage == "judge_data":
                run_.data_round(1)
            elif stage == "judge_sft":
                run_.sft_stage()
                run_.evaluate("sft")
            elif stage == "judge_dpo":
                for r in range(1, run_.ctx.blocks["dpo"].rounds + 1):
                    run_.dpo_round(r)
                    run_.evaluate(f"dpo_r{r}")
    finally:
        run_.engine.stop_background()

    wall = time.perf_counter() - t_start
    overall = [row for row in run_.rows if row["category"] == "all"]
    data_rows = []
    for r in range(1, run_.ctx.blocks["dpo"].rounds + 1):
        path = os.path.join(workdir, "judge_data" if r == 1 else f"judge_data_r{r}", "stats.json")
        if os.path.exists(path):
            with open(path) as f:
                data_rows.append({k: v for k, v in json.load(f).items() if k != "dropped_ids"})
    summary = {"table": overall, "categories": run_.rows, "data": data_rows, "wall_s": wall,
               "engine": run_.engine.stats(), "kernels": kernels_report(run_.cfg, run_.ctx.mesh),
               "workdir": workdir, "format": run_.jcfg.format,
               "plans_x_executions": [config.chains.num_plans, config.chains.num_executions]}
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, default=str)
    for d in sorted(os.listdir(workdir)):
        if os.path.exists(os.path.join(workdir, d, metrics_lib.JSONL_NAME)):
            keys = ["dpo/loss", "rewards/accuracies", "rewards/margins"] if d.startswith("judge_dpo") else ["sft/nll"]
            try:
                metrics_lib.plot_curves(os.path.join(workdir, d), keys=keys,
                                        out_png=os.path.join(workdir, f"curves_{d}.png"))
            except Exception as e:  # a plot must never fail a finished run
                log.warning("could not plot %s curves: %s", d, e)
    text = [metrics_lib.markdown_table(overall, columns=["judge", "n", "pairwise acc", "pos-consistent acc",
                                                         "no verdict", "picks A"])]
    if data_rows:
        text.append(metrics_lib.markdown_table(data_rows, columns=["round", "triples", "chains", "chain_accuracy",
                                                                   "kept", "dropped", "pairs", "sft", "seconds"]))
    text.append(metrics_lib.markdown_table(run_.rows, columns=["judge", "category", "n", "pairwise acc",
                                                               "pos-consistent acc"]))
    print("\n" + "\n\n".join(text) + f"\n\nwall time: {wall:.1f} s   (workdir: {workdir})")
    return summary
