"""Benchmark evaluation of an agent policy, the way the paper measures it.

For each benchmark (a JSONL file in the `data.BENCHMARK` schema): k episodes per question
through the agent loop (up to `max_turns` turns, the last one after the final-step message),
with the benchmark's tool set; every final answer scored (`eval.scoring`); optionally a
Reagent-C second attempt per sample: an Agent-RRM judge reads the first trajectory, its critique
goes back to the agent as a user turn (`rrm.build_refinement_message`) and the episode continues
(`AgentLoop.continue_episode`, what `continue_many` runs per item). Both attempts are scored.

Pipelining: every (question, sample) is one job in a thread pool of `max_parallel` episodes,
all sharing the engine's continuous batch; when a question's k jobs are done it is scored on a
small scoring pool (LLM judge calls overlap with generation) and its line is appended to the
results file (`eval.results.ResultStore`), so an interrupted run resumes where it stopped.
Seeds depend on (run seed, question id, sample index) only, so a resumed run draws the same.

    summary = evaluate(engine, tok, [BenchmarkSpec("bamboogle", path, ("search", "browse"))], out_dir,
                       registry=registry, agent_config=AgentConfig(max_turns=30), scorer=AnswerScorer(),
                       settings=EvalSettings(k=4))
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
import os
import time
import zlib
from typing import Any, Mapping, Optional, Sequence

from reagent_jax import rewards, rrm
from reagent_jax.agent.loop import AgentConfig, AgentLoop
from reagent_jax.agent.tools import TOOL_NAMES
from reagent_jax.agent.trajectory import Trajectory
from reagent_jax.data import load_benchmark
from reagent_jax.eval import passk, report
from reagent_jax.eval.results import ResultStore
from reagent_jax.eval.scoring import AnswerScorer, ScoreItem
from reagent_jax.metrics import ProgressBar
from reagent_jax.rrm.base import JudgeRequest, failed_judgement

log = logging.getLogger(__name__)

RESULTS_NAME = "results.jsonl"
# Tool sets by benchmark name, then by its `source`, then by kind (rewards.source_kind), then "default".
DEFAULT_TOOL_SETS: Mapping[str, tuple[str, ...]] = {
    "gaia": tuple(TOOL_NAMES), "math": ("python",), "qa": ("search", "browse"),
    "default": ("search", "browse", "python")}


def tools_for(name: str, source: Optional[str] = None,
              tool_sets: Mapping[str, Sequence[str]] = DEFAULT_TOOL_SETS) -> tuple[str, ...]:
    for key in (name, source, rewards.source_kind(source or name), "default"):
        if key and key in tool_sets:
            tools = tuple(tool_sets[key])
            unknown = [t for t in tools if t not in TOOL_NAMES]
            if unknown:
                raise ValueError(f"tool set {key!r} names unknown tools {unknown}; known: {', '.join(TOOL_NAMES)}")
            return tools
    return ()


@dataclasses.dataclass(frozen=True)
class BenchmarkSpec:
    name: str  # key in the results and the reports
    path: str  # a JSONL file, a name under the benchmark directory, or a tfds:reagent_benchmark/... spec
    tools: tuple[str, ...]
    limit: Optional[int] = None  # first N questions only
    data_dir: Optional[str] = None  # where tfds: specs are built ($TFDS_DATA_DIR when None)


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    k: int = 1  # episodes per question
    greedy: bool = False
    seed: int = 0
    max_parallel: int = 64  # episodes in flight (more than the engine's slots keeps them full)
    scoring_workers: int = 4
    refine: bool = False  # Reagent-C second attempt (needs an rrm judge)

    def __post_init__(self):
        if self.k < 1 or self.max_parallel < 1 or self.scoring_workers < 1:
            raise ValueError(f"EvalSettings: k, max_parallel and scoring_workers must be >= 1, got {self}")


def sample_seed(run_seed: int, qid: str, index: int) -> int:
    return (run_seed * 1_000_003 + zlib.crc32(str(qid).encode()) * 1009 + index) % (2 ** 31)


def as_agent_record(row: Mapping[str, Any]) -> dict[str, Any]:
    """A benchmark row as the agent loop and the rewards read it (`source` -> `data_source`)."""
    return {**row, "data_source": row.get("source")}


class Evaluator:
    """Runs benchmarks for one policy engine; see the module docstring."""

    def __init__(self, engine, tokenizer, out_dir: str, *, registry, agent_config: AgentConfig = AgentConfig(),
                 scorer: Optional[AnswerScorer] = None, settings: EvalSettings = EvalSettings(), rrm_judge=None,
                 progress: Optional[bool] = None, identity: Optional[Mapping[str, Any]] = None):
        """identity: what else decides the results (policy path, tokenizer, engine lengths); with
        the sampling, agent and scoring settings it is the results file's fingerprint."""
        if settings.refine and rrm_judge is None:
            raise ValueError("Reagent-C refinement (settings.refine) needs an rrm_judge with judge_many()")
        self.engine, self.tok, self.out_dir, self.registry = engine, tokenizer, out_dir, registry
        self.agent_config, self.scorer, self.settings = agent_config, scorer or AnswerScorer(), settings
        self.rrm_judge, self.progress = rrm_judge, progress
        os.makedirs(out_dir, exist_ok=True)
        fingerprint = {"greedy": settings.greedy, "seed": settings.seed, "refine": settings.refine,
                       "agent": {k: v for k, v in dataclasses.asdict(self.agent_config).items()
                                 if k != "max_parallel_episodes"},  # concurrency does not change results
                       "scoring": self.scorer.mode,
                       **dict(identity or {})}
        self.store = ResultStore(os.path.join(out_dir, RESULTS_NAME), settings=fingerprint)

    # ---- one sample: episode (+ critique and second attempt) ---------------------------------
    def _sample(self, loop: AgentLoop, record: dict, index: int):
        """(first, second or None); a failure becomes an "error" trajectory (scored wrong, kept
        in the results) instead of stopping the run."""
        try:
            return self._attempts(loop, record, index)
        except Exception as e:  # noqa: BLE001
            log.warning("%s sample %d failed: %s: %s", record["id"], index, type(e).__name__, e)
            failed = lambda attempt: Trajectory.failed(record, f"{type(e).__name__}: {e}", sample_index=index,
                                                       attempt=attempt)
            return failed(1), (failed(2) if self.settings.refine else None)

    def _attempts(self, loop: AgentLoop, record: dict, index: int):
        s = self.settings
        first = loop.run_episode(record, sample_index=index, seed=sample_seed(s.seed, record["id"], index),
                                 greedy=s.greedy)
        if not s.refine:
            return first, None
        try:
            j = self.rrm_judge.judge_many([JudgeRequest(record["question"], first.messages, loop.tool_names)])[0]
        except Exception as e:  # noqa: BLE001 - refine with an empty critique rather than lose the sample
            log.warning("Agent-RRM judge failed for %s: %s", record["id"], e)
            j = failed_judgement()
        first.critique = j.critique
        first.extras.update(rrm_score=float(j.score), rrm_status=str(j.status))
        second = loop.continue_episode(first, [rrm.build_refinement_message(j.critique)], greedy=s.greedy)
        return first, second

    # ---- scoring one question -----------------------------------------------------------------
    def _score_question(self, spec: BenchmarkSpec, row: dict, samples: list) -> dict[str, Any]:
        trajs = [t for pair in samples for t in pair if t is not None]
        scores = self.scorer.score_many([ScoreItem(row["question"], row["answer"], t.final_text, row.get("source"))
                                         for t in trajs])
        by_traj = {id(t): sc for t, sc in zip(trajs, scores)}
        out = []
        for i, (first, second) in enumerate(samples):
            item = {"sample_index": i, **by_traj[id(first)].to_json(), "trajectory": first.to_json()}
            if second is not None:
                item["refined"] = {**by_traj[id(second)].to_json(), "critique": first.critique,
                                   "rrm_score": first.extras.get("rrm_score"), "trajectory": second.to_json()}
            out.append(item)
        return {"benchmark": spec.name, "id": row["id"], "question": row["question"], "answer": row["answer"],
                "source": row.get("source"), "k": len(samples), "tools": list(spec.tools), "samples": out}

    # ---- a benchmark --------------------------------------------------------------------------
    def run_benchmark(self, spec: BenchmarkSpec) -> dict[str, Any]:
        s = self.settings
        broken: list = []  # rows of the file that do not parse: reported, as they cannot be run
        rows = load_benchmark(spec.path, limit=spec.limit, skipped=broken, data_dir=spec.data_dir)
        todo = [r for r in rows if not self.store.done(spec.name, r["id"], s.k, s.refine)]
        ids = {r["id"] for r in rows}
        finished = [[bool(x["correct"]) for x in r["samples"][:s.k]] for r in self.store.records(spec.name)
                    if r["id"] in ids and self.store.done(spec.name, r["id"], s.k, s.refine)]
        log.info("%s: %d questions, %d already scored, %d to run (k=%d, tools=%s)", spec.name, len(rows),
                 len(rows) - len(todo), len(todo), s.k, ",".join(spec.tools) or "none")
        loop = AgentLoop(self.engine, self.tok, self.registry, self.agent_config, tool_names=list(spec.tools))
        t0 = time.perf_counter()
        bar = ProgressBar(len(rows), desc=spec.name, keys={"avg@k": "acc", "pass@k": f"pass@{s.k}"},
                          initial=len(rows) - len(todo), disable=None if self.progress is None else not self.progress,
                          log_every=max(1, len(rows) // 10))
        try:
            self._run_jobs(spec, todo, loop, bar, finished)
        finally:
            bar.close()
        wall = time.perf_counter() - t0
        records = [r for r in self.store.records(spec.name) if r["id"] in ids]
        summary = report.benchmark_summary(records, s.k, s.refine)
        summary.update(tools=list(spec.tools), path=spec.path, wall_s=wall, questions_run=len(todo),
                       wall_s_per_100_questions=100 * wall / len(todo) if todo else None,
                       skipped_rows=len(broken), skipped_reasons=[f"{f}:{n}: {r}" for f, n, r in broken[:5]])
        return summary

    def _run_jobs(self, spec, todo, loop, bar, finished) -> None:
        s = self.settings
        collected: dict[str, list] = {r["id"]: [None] * s.k for r in todo}
        by_id = {r["id"]: r for r in todo}
        with cf.ThreadPoolExecutor(s.max_parallel, thread_name_prefix="eval-episode") as episodes, \
                cf.ThreadPoolExecutor(s.scoring_workers, thread_name_prefix="eval-score") as scoring:
            jobs = {episodes.submit(self._sample, loop, as_agent_record(r), i): (r["id"], i)
                    for r in todo for i in range(s.k)}
            active: set = set(jobs)
            try:
                while active:
                    done, _ = cf.wait(active, return_when=cf.FIRST_COMPLETED)
                    for f in done:  # each leaves `active` once handled: what is left is unsaved work
                        if f in jobs:  # an episode (pair) finished
                            qid, i = jobs[f]
                            collected[qid][i] = f.result()
                            if all(x is not None for x in collected[qid]):
                                active.add(scoring.submit(self._score_question, spec, by_id[qid],
                                                          collected.pop(qid)))
                        else:  # a question was scored
                            record = f.result()
                            self.store.append(record)
                            finished.append([bool(x["correct"]) for x in record["samples"]])
                            bar.update(1, {"avg@k": passk.avg_at_k(finished),
                                           "pass@k": passk.mean_pass_at_k(finished, s.k)})
                        active.discard(f)
            except BaseException:  # an error or Ctrl-C: stop here, not after every queued episode
                self._abandon(active, jobs)
                raise

    def _abandon(self, active: set, jobs: dict) -> None:
        """Cancels the episodes not yet started (leaving the pools waits only for those in flight)
        and stores the questions already scored, so a rerun resumes after them."""
        for f in active:
            f.cancel()
        for f in active:
            if f in jobs or not f.done() or f.cancelled() or f.exception() is not None:
                continue
            try:
                self.store.append(f.result())
            except Exception as e:  # noqa: BLE001 - the original error is the one to raise
                log.warning("could not store a scored question while stopping: %s", e)

    # ---- all benchmarks + reports -------------------------------------------------------------
    def run(self, specs: Sequence[BenchmarkSpec], extra: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
        names = [sp.name for sp in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"benchmark names must be unique, got {names}")
        t0 = time.perf_counter()
        summaries = {sp.name: self.run_benchmark(sp) for sp in specs}
        info = {"settings": dataclasses.asdict(self.settings), "agent": dataclasses.asdict(self.agent_config),
                "scoring": self.scorer.mode, "wall_s": time.perf_counter() - t0,
                "results": os.path.join(self.out_dir, RESULTS_NAME), **(extra or {})}
        stats = getattr(self.engine, "stats", None)
        if stats is not None:
            info["engine"] = {k: v for k, v in stats().items() if isinstance(v, (int, float))}
        paths = report.write_reports(self.out_dir, summaries, info)
        return {"benchmarks": summaries, "paths": paths, **info}


def evaluate(engine, tokenizer, specs: Sequence[BenchmarkSpec], out_dir: str, **kw) -> dict[str, Any]:
    """`Evaluator(engine, tokenizer, out_dir, **kw).run(specs)`."""
    return Evaluator(engine, tokenizer, out_dir, **kw).run(specs)
