"""Pairwise evaluation of a judge: accuracy, position-consistent accuracy, per-category tables.

Data: local JSONL pairwise sets in the `EVALPLANNER_PAIR` schema (one row per pair; export
RewardBench / RM-Bench / JudgeBench to it):

    {"id": "rb-17", "instruction": "...", "chosen": "better response", "rejected": "worse one",
     "category": "reasoning"}

Protocols (records are the parser's dicts {"id", "swapped", "verdict", "correct"} plus "category"):
  pairwise accuracy      RewardBench: each pair is shown in ONE order, drawn at random per pair
                         (seeded), and scored 1 / 0, or 0.5 without a single verdict.
  position-consistent    the pair is shown in both orders and counts only when both verdicts are
                         right (the paper's metric for every benchmark but RewardBench).
Extra columns: no_verdict (share of judgements without a single verdict) and picks_A (share of
the A / B verdicts that are "A", None without any; 0.5 is unbiased since the correct answer is A
exactly half of the time).

    report = evaluate_pairs(judge, load_pairwise_set("rewardbench.jsonl"), seed=0)
    print(category_table(report))
"""
from __future__ import annotations

import random
from typing import Any, Mapping, Sequence

from reagent_jax.evalplanner.pairs import Triple, check_unique_ids, correct_verdict, load_triples
from reagent_jax.evalplanner.parser import pairwise_accuracy, position_consistent_accuracy
from reagent_jax.metrics import markdown_table


ALL = "all"


def load_pairwise_set(paths, on_error: str = "skip", data_dir: str | None = None) -> list[Triple]:
    """Pairs from JSONL / parquet files or built `tfds:` datasets in the documented schema (bad rows
    skipped with a warning)."""
    return load_triples(paths, on_error=on_error, data_dir=data_dir)


def random_orders(ids: Sequence[Any], seed: int) -> dict[Any, bool]:
    """The one order per pair used for RewardBench-style accuracy: id -> swapped."""
    rng = random.Random(seed)
    return {i: rng.random() < 0.5 for i in ids}


def judge_pairs(judge, triples: Sequence[Triple], *, seed: int = 0, both_orders: bool = True,
                greedy: bool = True) -> list[dict[str, Any]]:
    """Runs `judge.judge(items, seed, greedy)` over the pairs; one record per judgement.

    both_orders=False judges only each pair's random order (enough for pairwise accuracy)."""
    check_unique_ids(triples, "judge_pairs")
    orders = random_orders([t.id for t in triples], seed)
    jobs = [(t, s) for t in triples for s in ((False, True) if both_orders else (orders[t.id],))]
    chains = list(judge.judge([t.item(s) for t, s in jobs], seed=seed, greedy=greedy))
    if len(chains) != len(jobs):  # zip would silently drop the last pairs from both metrics
        raise ValueError(f"judge_pairs: the judge returned {len(chains)} judgements for {len(jobs)} items")
    return [{"id": t.id, "category": t.category, "swapped": s, "verdict": ch.verdict,
             "correct": correct_verdict(s), "status": ch.status, "plan": ch.plan, "output": ch.output}
            for (t, s), ch in zip(jobs, chains)]


def _summary(records: Sequence[Mapping[str, Any]], orders: Mapping[Any, bool]) -> dict[str, Any]:
    ids = list(dict.fromkeys(r["id"] for r in records))
    chosen = [r for r in records if bool(r["swapped"]) == orders[r["id"]]]
    if len(chosen) != len(ids):
        raise ValueError("every pair needs a record in its random order (judge_pairs makes them)")
    out = {"n": len(ids), "pairwise_accuracy": pairwise_accuracy(chosen)}
    ids_with_both = {i for i in ids if len({bool(r["swapped"]) for r in records if r["id"] == i}) == 2}
    both = [r for r in records if r["id"] in ids_with_both]
    out["position_consistent_accuracy"] = position_consistent_accuracy(both) if both else None
    verdicts = [r["verdict"] for r in records]
    out["no_verdict"] = sum(v not in ("A", "B") for v in verdicts) / len(verdicts)
    decided = [v for v in verdicts if v in ("A", "B")]  # a judge that often abstains is not biased to B
    out["picks_A"] = sum(v == "A" for v in decided) / len(decided) if decided else None
    return out


def report_from_records(records: Sequence[Mapping[str, Any]], seed: int = 0) -> dict[str, Any]:
    """{"all": summary, "categories": {category: summary}}; `seed` picks the RewardBench orders
    (use the seed given to `judge_pairs`)."""
    records = list(records)
    if not records:
        raise ValueError("report_from_records needs at least one judgement record")
    orders = random_orders(list(dict.fromkeys(r["id"] for r in records)), seed)
    cats: dict[str, list] = {}
    for r in records:
        cats.setdefault(str(r.get("category", "default")), []).append(r)
    return {ALL: _summary(records, orders), "categories": {c: _summary(rs, orders) for c, rs in sorted(cats.items())}}


def evaluate_pairs(judge, triples: Sequence[Triple], *, seed: int = 0, both_orders: bool = True,
                   greedy: bool = True) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(report, records): see `report_from_records` and `judge_pairs`."""
    if not triples:
        raise ValueError("evaluate_pairs: no pairs to evaluate")
    records = judge_pairs(judge, triples, seed=seed, both_orders=both_orders, greedy=greedy)
    return report_from_records(records, seed), records


def report_rows(name: str, report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Table rows (judge, category, n, accuracies, no_verdict, picks_A): "all" first."""
    rows = []
    for cat, s in [(ALL, report[ALL])] + list(report["categories"].items()):
        rows.append({"judge": name, "category": cat, "n": s["n"], "pairwise acc": s["pairwise_accuracy"],
                     "pos-consistent acc": s["position_consistent_accuracy"], "no verdict": s["no_verdict"],
                     "picks A": s["picks_A"]})
    return rows


def category_table(report: Mapping[str, Any], name: str = "judge") -> str:
    return markdown_table(report_rows(name, report))
