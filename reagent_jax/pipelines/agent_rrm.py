"""The agent pipeline's Agent-RRM data, its held-out judge evaluation and the Reagent-C report.

Training rows: expert and flawed trajectories annotated by a rule annotator that sees the
reference (the synthetic world's `rrm_annotator`, or `gsm8k_annotator` for rows with a worked
solution). Evaluation: the trained RRM judges, with no reference, (a) the same kind of annotated
trajectories built from the held-out questions and (b) every trajectory the run's policies
produced in their held-out evaluations; `eval.judge_quality` scores it against the annotator's
labels. Results go to `rrm_eval.jsonl` (one line per judged trajectory) and summary.json.
Reagent-C (`refinement_report`): attempt 1 vs attempt 2 after the judge's critique, all attempts
refined vs only those the judge scored low, per question in `refinement.jsonl`.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Mapping, Sequence

import numpy as np

from reagent_jax import worlds
from reagent_jax.eval.judge_quality import describe_quality, judge_quality
from reagent_jax.eval.statistics import paired_bootstrap
from reagent_jax.parallel import hosts
from reagent_jax.rewards import score_trajectory
from reagent_jax.rrm.base import JudgeRequest
from reagent_jax.worlds import gsm8k_annotator, rrm_annotator

log = logging.getLogger(__name__)

EVAL_NAME = "rrm_eval.jsonl"
REFINEMENT_NAME = "refinement.jsonl"
ATTEMPT1, ATTEMPT2 = "attempt 1 (Reagent-C)", "attempt 2 (critique)"


def rrm_records(ctx, registry, system_prompt: str, records: Sequence[dict], *, split: str = "train",
                seed: int = 0) -> list[dict]:
    """Annotated RRM rows: the synthetic world's questions of `split`, else `records` (GSM8K-style
    rows with `meta.solution`); each has question, trajectory, text (the judgement), target, step."""
    if ctx.world is not None:
        return rrm_annotator.synthetic_rrm_records(ctx.world, tools=worlds.RegistryTools(registry), split=split,
                                                   seed=seed, system_prompt=system_prompt)
    rows = gsm8k_annotator.gsm8k_rrm_records(records, worlds.RegistryTools(registry).python, seed=seed,
                                             system_prompt=system_prompt)
    if not rows:
        raise ValueError("the RRM stages need annotated trajectories: a synthetic world, or data rows with a "
                         "worked solution in meta.solution (GSM8K's <<48/2=24>> annotations)")
    return rows


def _policy_items(trajs) -> list[dict]:
    """A policy's evaluated trajectories, labelled by the rule reward (and, for rows with a worked
    solution, by the step the GSM8K annotator names)."""
    out = []
    for t in trajs:
        has_solution = bool((t.question.get("meta") or {}).get("solution"))
        step = gsm8k_annotator.annotate(t.question, t.messages).step if has_solution else None
        out.append({"id": t.question.get("id"), "question": t.question["question"], "trajectory": t.messages,
                    "target": float(score_trajectory(t) >= 1.0), "step": step})
    return out


def evaluate_rrm(judge, annotated: Sequence[dict], policy_trajectories: Mapping[str, Sequence], workdir: str,
                 seed: int = 0) -> dict:
    """Judge quality per item set: "annotated" (held-out rows of `rrm_records`) and one per policy."""
    sets = {"annotated": list(annotated), **{name: _policy_items(t) for name, t in policy_trajectories.items()}}
    out, lines = {}, []
    for name, items in sets.items():
        if not items:
            continue
        judgements = judge.judge_many([JudgeRequest(it["question"], [m for m in it["trajectory"]
                                                                      if m["role"] != "system"]) for it in items])
        correct = [it["target"] >= 1.0 for it in items]
        steps = [it.get("step") for it in items]
        out[name] = judge_quality(judgements, correct, steps, seed=seed)
        log.info("RRM on %s", describe_quality(name, out[name]))
        lines += [{"set": name, "id": it.get("id"), "target": it["target"], "step": it.get("step"),
                   "score": j.score, "status": getattr(j.status, "value", str(j.status)), "critique": j.critique}
                  for it, j in zip(items, judgements)]
    if hosts.is_leader():
        with open(os.path.join(workdir, EVAL_NAME), "w") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
    return out


def refinement_report(ref: dict, records: Sequence[dict], workdir: str, *, refine_below: float,
                      selective_below: float, seed: int = 0) -> tuple[list[dict], dict[str, list], list[dict]]:
    """Reagent-C's held-out result (`strategies.evaluate_refinement`) as (table rows, per-question
    scores of attempt 1 then attempt 2 for the paired comparisons, extra comparisons).

    When every attempt was refined (`refine_below` >= 1), selective refinement is read off the
    same attempts: attempt 2 where the judge scored attempt 1 below `selective_below`, attempt 1
    elsewhere (greedy attempts do not depend on which others are refined), compared with attempt 1
    by its own paired interval. `refinement.jsonl`: one line per question."""
    s1, s2 = np.asarray(ref["attempt1_scores"], float), np.asarray(ref["attempt2_scores"], float)
    judged = np.asarray([j.score for j in ref["judgements"]], float)  # [questions] the judge's score of attempt 1
    rows = [{"policy": ATTEMPT1, "held-out accuracy": float(s1.mean())},
            {"policy": ATTEMPT2, "held-out accuracy": float(s2.mean()), "refined": ref["refined_frac"]}]
    comparisons = []
    if refine_below >= 1.0 and selective_below < 1.0:
        name = f"attempt 2 where RRM score < {selective_below:g}"
        low = judged < selective_below
        selective = np.where(low, s2, s1)
        rows.append({"policy": name, "held-out accuracy": float(selective.mean()), "refined": float(low.mean())})
        comparisons.append({"before": ATTEMPT1, "after": name,
                            **paired_bootstrap(s1, selective, seed=seed).to_dict()})
    if hosts.is_leader():
        retries = dict(zip(ref.get("refined_indices", ()), ref.get("refined", ())))
        with open(os.path.join(workdir, REFINEMENT_NAME), "w") as f:
            for i, (r, a, b, j) in enumerate(zip(records, s1, s2, ref["judgements"])):
                row = {"id": r.get("id"), "question": r["question"], "attempt1": float(a),
                       "rrm_score": j.score, "critique": j.critique, "attempt2": float(b)}
                if i in retries:  # what the retry did: its own turns after the critique, and how it ended
                    t = retries[i]
                    row.update(attempt2_messages=t.messages[len(ref["first"][i].messages) + 1:],
                               attempt2_finish_reason=t.finish_reason, attempt2_error=t.error)
                f.write(json.dumps(row) + "\n")
    return rows, {ATTEMPT1: s1.tolist(), ATTEMPT2: s2.tolist()}, comparisons
