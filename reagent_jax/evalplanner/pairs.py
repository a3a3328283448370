"""Synthetic preference data for EvalPlanner: triples in, labelled chains, DPO pairs and SFT chains out.

The paper's recipe, step by step:
  1. Triples (instruction, chosen response, rejected response), from a local JSONL file
     (`load_triples`, schema `EVALPLANNER_PAIR`), from math problems with sampled solutions
     checked by the rule rewards (`math_triples`), or from the synthetic world
     (`worlds.pairwise.synthetic_triples`).
  2. `sample_chains`: for every triple, |P| plans from the instruction, and for each plan |E|
     executions in both response orders (chosen shown as A, then as B), from a chain source (the
     judge model on the rollout engine, `judge.EngineJudge`, or a scripted one). Each chain is
     labelled correct when its verdict names the chosen response.
  3. `build_preference_data`: DPO pairs are formed inside one (plan, order) group, a correct chain
     (chosen) against an incorrect one (rejected: wrong verdict, or none), so the pair differs
     only in how the plan was executed. Instructions where no chain is correct are dropped. The
     SFT set is one random correct chain per kept instruction, taken from the two response orders
     alternately (where possible) so that SFT does not teach a position preference.

Pairing inside a group with c correct and w incorrect chains: "one_to_one" (default) shuffles both
lists and pairs them up (min(c, w) pairs, every chain used at most once); "all" takes every
combination (c * w pairs; chains with equal texts are not merged, so repeated samples weigh
more). A pair whose chosen and rejected texts are equal (possible only with inconsistent labels)
is never made; it is counted in stats["identical_pairs"]. Everything is seeded, so the data of a
round is a pure function of the chains and the seed. Triple ids must be unique.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import random
from typing import Any, Callable, Iterable, Mapping, Sequence

from reagent_jax import chat
from reagent_jax.data import open_rows
from reagent_jax.evalplanner.judge import PairItem, request_seed
from reagent_jax.rewards import score_answer
from reagent_jax.rollout import SamplingParams

log = logging.getLogger(__name__)

PAIRINGS = ("one_to_one", "all")


@dataclasses.dataclass(frozen=True)
class Triple:
    id: str
    instruction: str
    chosen: str
    rejected: str
    category: str = "default"
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def item(self, swapped: bool) -> PairItem:
        """Chosen shown as A (swapped=False; correct verdict "A") or as B (swapped=True; "B")."""
        if swapped:
            return PairItem(self.instruction, self.rejected, self.chosen)
        return PairItem(self.instruction, self.chosen, self.rejected)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "instruction": self.instruction, "chosen": self.chosen, "rejected": self.rejected,
                "category": self.category, "meta": dict(self.meta)}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> "Triple":
        return cls(str(row["id"]), row["instruction"], row["chosen"], row["rejected"],
                   str(row.get("category") or "default"), dict(row.get("meta") or {}))


def correct_verdict(swapped: bool) -> str:
    return "B" if swapped else "A"


@dataclasses.dataclass(frozen=True)
class LabelledChain:
    triple_id: str
    plan_index: int
    swapped: bool
    exec_index: int
    plan: str
    output: str
    verdict: str | None
    status: str
    correct: bool

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---- sources of triples ----------------------------------------------------------------------
def load_triples(paths: str | Sequence[str], on_error: str = "skip", data_dir: str | None = None) -> list[Triple]:
    """Triples from JSONL / parquet files or built `tfds:reagent_evalplanner_pair/NAME` datasets
    (under `data_dir`) in the `EVALPLANNER_PAIR` schema (see `data.schemas`), in the order given;
    rows without an id get "<file>:<row>"."""
    out = []
    for path in [paths] if isinstance(paths, str) else paths:
        src = open_rows(path, "evalplanner_pair", data_dir=data_dir, on_error=on_error)
        for i, row in enumerate(src):
            rid = row.get("id")
            out.append(Triple(str(rid) if rid is not None else f"{os.path.basename(src.where(i))}", row["instruction"],
                              row["chosen"], row["rejected"], str(row.get("category") or "default")))
    check_unique_ids(out, str(paths))
    return out


def check_unique_ids(triples: Sequence[Triple], where: str) -> None:
    """ValueError naming repeated triple ids: ids key chains, pairs and results, so a repeat would
    silently merge or double a pair's data."""
    dup = sorted(i for i, n in collections.Counter(t.id for t in triples).items() if n > 1)
    if dup:
        raise ValueError(f"{where}: duplicate pair ids {dup[:5]}; ids must be unique (they key chains and results)")


SolutionSampler = Callable[[list[str], int], list[list[str]]]


def math_triples(problems: Sequence[Mapping[str, Any]], sample_solutions: SolutionSampler, *, n: int = 8,
                 seed: int = 0, default_source: str = "math") -> list[Triple]:
    """Math problems -> (problem, correct solution, incorrect solution) triples.

    `problems`: benchmark-schema rows {"id", "question", "answer": str | [str], "source"?}.
    `sample_solutions(questions, n)` returns n solution texts per question (e.g.
    `engine_solution_sampler`). A solution is correct when `rewards.score_answer` gives 1 and
    incorrect when it gives 0 (partial credit is neither); problems without one of each are skipped.
    """
    if n < 2:
        raise ValueError(f"math_triples: n={n} solutions per problem cannot give a correct and an incorrect one")
    for i, p in enumerate(problems):
        if not isinstance(p.get("question"), str) or not p.get("answer"):
            raise ValueError(f"math_triples: problem {i} needs a 'question' string and an 'answer': {dict(p)!r:.200}")
    solutions = sample_solutions([p["question"] for p in problems], n)
    if len(solutions) != len(problems):
        raise ValueError(f"math_triples: the sampler returned {len(solutions)} lists for {len(problems)} problems")
    rng = random.Random(seed)
    out = []
    for i, (p, sols) in enumerate(zip(problems, solutions)):
        golds = p["answer"] if isinstance(p["answer"], (list, tuple)) else [p["answer"]]
        source = str(p.get("data_source") or p.get("source") or default_source)
        scores = [score_answer(s, golds, source) for s in sols]
        right = [s for s, v in zip(sols, scores) if v == 1.0]
        wrong = [s for s, v in zip(sols, scores) if v == 0.0 and s.strip()]
        if right and wrong:
            out.append(Triple(str(p.get("id", f"math/{i}")), p["question"], rng.choice(right), rng.choice(wrong),
                              f"math/{source}", {"answer": list(golds)}))
    log.info("math_triples: %d of %d problems gave a correct and an incorrect solution", len(out), len(problems))
    return out


MATH_SYSTEM = "Solve the problem step by step. Put the final answer in \\boxed{}."


def engine_solution_sampler(engine, tokenizer, *, temperature: float = 0.8, top_p: float = 0.95,
                            max_new_tokens: int = 512, seed: int = 0, system: str = MATH_SYSTEM) -> SolutionSampler:
    """A `SolutionSampler` that draws solutions from the policy behind `engine`."""
    stop = chat.stop_token_ids(tokenizer)

    def sample(questions: list[str], n: int) -> list[list[str]]:
        prompts, samplings = [], []
        for i, q in enumerate(questions):
            ids = chat.render(tokenizer, [{"role": "system", "content": system}, {"role": "user", "content": q}],
                              add_generation_prompt=True).ids
            for k in range(n):
                prompts.append(ids)
                samplings.append(SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                                                seed=request_seed(seed, 3, i, k), stop_token_ids=stop))
        texts = [tokenizer.decode([t for t in r.tokens if t not in stop]) if r.finish_reason != "error" else ""
                 for r in engine.generate(prompts, samplings)]
        return [texts[i * n:(i + 1) * n] for i in range(len(questions))]

    return sample


# ---- chains ----------------------------------------------------------------------------------
def sample_chains(triples: Sequence[Triple], source, *, num_plans: int, num_executions: int,
                  seed: int = 0) -> list[LabelledChain]:
    """|P| plans per triple, |E| executions per (plan, order); every chain labelled (see module doc).

    `source` has `plans(items, n, seed)` and `executions(requests, n, seed)` (`judge.EngineJudge`).
    Plans are asked with the chosen response shown first (only the single-pass format shows the
    responses to the planner at all). Result order: triple, plan, order (not swapped first), execution.
    """
    if num_plans < 1 or num_executions < 1:
        raise ValueError(f"num_plans={num_plans} and num_executions={num_executions} must be >= 1")
    plans = source.plans([t.item(False) for t in triples], num_plans, seed)
    if len(plans) != len(triples) or any(len(p) != num_plans for p in plans):
        raise ValueError("chain source returned the wrong number of plans")
    keys, requests = [], []
    for t, tplans in zip(triples, plans):
        for p, plan in enumerate(tplans):
            for swapped in (False, True):
                keys.append((t.id, p, swapped))
                requests.append((t.item(swapped), plan))
    results = source.executions(requests, num_executions, seed + 1)
    if len(results) != len(requests) or any(len(r) != num_executions for r in results):
        raise ValueError("chain source returned the wrong number of executions")
    out = []
    for (tid, p, swapped), (_, plan), chains in zip(keys, requests, results):
        for e, ch in enumerate(chains):
            out.append(LabelledChain(tid, p, swapped, e, plan, ch.output, ch.verdict, ch.status,
                                     ch.verdict == correct_verdict(swapped)))
    return out


@dataclasses.dataclass
class PreferenceData:
    pairs: list[dict[str, Any]]  # one DPO pair per row (see `_pair_record`)
    sft: list[dict[str, Any]]  # one correct chain per kept instruction
    kept_ids: list[str]
    dropped_ids: list[str]  # instructions with no correct chain
    stats: dict[str, Any]


def _chain_record(t: Triple, ch: LabelledChain) -> dict[str, Any]:
    item = t.item(ch.swapped)
    return {"triple_id": t.id, "category": t.category, "plan_index": ch.plan_index, "swapped": ch.swapped,
            "instruction": item.instruction, "response_a": item.response_a, "response_b": item.response_b,
            "plan": ch.plan}


def chain_records(triples: Sequence[Triple], chains: Iterable[LabelledChain]) -> list[dict[str, Any]]:
    """Chains as self-contained records (prompt fields + plan + output), e.g. for SFT rows."""
    by_id = {t.id: t for t in triples}
    return [{**_chain_record(by_id[c.triple_id], c), "output": c.output, "verdict": c.verdict, "correct": c.correct}
            for c in chains]


def build_preference_data(triples: Sequence[Triple], chains: Iterable[LabelledChain], *,
                          pairing: str = "one_to_one", seed: int = 0) -> PreferenceData:
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing={pairing!r}; expected one of {PAIRINGS}")
    check_unique_ids(triples, "build_preference_data")
    by_id = {t.id: t for t in triples}
    groups: dict[str, dict[tuple[int, bool], list[LabelledChain]]] = {t.id: {} for t in triples}
    chains = list(chains)
    for ch in chains:
        if ch.triple_id not in by_id:
            raise ValueError(f"chain for unknown triple {ch.triple_id!r}")
        groups[ch.triple_id].setdefault((ch.plan_index, ch.swapped), []).append(ch)
    rng = random.Random(seed)
    pairs, sft, kept, dropped = [], [], [], []
    identical = 0
    for t in triples:
        tchains = [c for g in groups[t.id].values() for c in g]
        correct_all = [c for c in tchains if c.correct]
        if not correct_all:
            dropped.append(t.id)
            continue
        # Alternate the preferred order between kept instructions, so that SFT does not teach the
        # seed judge's position preference (falls back to any correct chain).
        prefer_swapped = len(kept) % 2 == 1
        kept.append(t.id)
        pick = rng.choice([c for c in correct_all if c.swapped == prefer_swapped] or correct_all)
        sft.append({**_chain_record(t, pick), "output": pick.output, "verdict": pick.verdict})
        for key in sorted(groups[t.id]):
            group = groups[t.id][key]
            good = [c for c in group if c.correct]
            bad = [c for c in group if not c.correct]
            if pairing == "all":
                combos = [(g, b) for g in good for b in bad]
            else:
                good, bad = good[:], bad[:]
                rng.shuffle(good)
                rng.shuffle(bad)
                combos = list(zip(good, bad))
            for g, b in combos:
                if g.output == b.output:  # only chains with inconsistent labels (e.g. edited files)
                    identical += 1
                    continue
                pairs.append({**_chain_record(t, g), "chosen": g.output, "rejected": b.output,
                              "chosen_verdict": g.verdict, "rejected_verdict": b.verdict})
    n = len(chains)
    stats = {"triples": len(triples), "kept": len(kept), "dropped": len(dropped), "chains": n,
             "chain_accuracy": sum(c.correct for c in chains) / n if n else 0.0,
             "no_verdict_rate": sum(c.verdict is None for c in chains) / n if n else 0.0,
             "pairs": len(pairs), "identical_pairs": identical, "sft": len(sft)}
    return PreferenceData(pairs, sft, kept, dropped, stats)


# ---- files -----------------------------------------------------------------------------------
def write_jsonl(path: str, rows: Iterable[Mapping[str, Any]]) -> str:
    """Writes atomically (temp file + rename), so a crash never leaves half a data file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path


def read_jsonl(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
