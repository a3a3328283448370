"""How good is an Agent-RRM as a judge of trajectories it has never seen?

Agent-RRM is useful only if (a) its reply parses (think, critique, one score), (b) its score
ranks correct trajectories above wrong ones, and (c) its critique points at the real flaw.
`judge_quality` measures the three against labels from a reference annotator: the format-valid
rate, the AUROC of the score against correctness (with a bootstrap interval over items; a
judgement that failed to parse keeps its fallback score, so failures count against it), and how
often the critique names the same solution step the annotator did.
"""
from __future__ import annotations

import collections
import re
from typing import Optional, Sequence

import numpy as np

from reagent_jax.eval.statistics import auroc
from reagent_jax.rrm.parser import Judgement

_STEP_IN_CRITIQUE = re.compile(r"\bstep (\d+)\b", re.IGNORECASE)


def critique_step(critique: str) -> Optional[int]:
    """The first solution step a critique names ("Step 2 is missing ..."), None if it names none."""
    m = _STEP_IN_CRITIQUE.search(critique or "")
    return int(m.group(1)) if m else None


def auroc_interval(scores: Sequence[float], labels: Sequence[bool], *, resamples: int = 2000,
                   confidence: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """(AUROC, lo, hi): a percentile bootstrap over items, resampling positives and negatives
    separately so every resample has both classes."""
    s, y = np.asarray(scores, float), np.asarray(labels, bool)
    estimate = auroc(s, y)
    rng = np.random.default_rng(seed)
    pos, neg = s[y], s[~y]
    draws = [auroc(np.concatenate([rng.choice(pos, pos.size), rng.choice(neg, neg.size)]),
                   np.r_[np.ones(pos.size, bool), np.zeros(neg.size, bool)]) for _ in range(resamples)]
    lo, hi = np.quantile(draws, [(1 - confidence) / 2, (1 + confidence) / 2])
    return estimate, float(lo), float(hi)


def judge_quality(judgements: Sequence[Judgement], correct: Sequence[bool],
                  steps: Optional[Sequence[Optional[int]]] = None, *, seed: int = 0) -> dict:
    """Quality of `judgements` against the labels: `correct[i]` says whether trajectory i is right,
    `steps[i]` the solution step the reference annotator's critique names (None: none)."""
    if len(judgements) != len(correct) or (steps is not None and len(steps) != len(judgements)):
        raise ValueError(f"{len(judgements)} judgements vs {len(correct)} labels"
                         + (f" and {len(steps)} steps" if steps is not None else ""))
    n = len(judgements)
    if not n:
        raise ValueError("judge_quality needs at least one judgement")
    scores = [j.score for j in judgements]
    labels = [bool(c) for c in correct]
    valid = [j.ok for j in judgements]
    out: dict = {"n": n, "correct": int(sum(labels)), "format_valid": int(sum(valid)),
                 "format_valid_rate": sum(valid) / n,
                 "statuses": dict(collections.Counter(getattr(j.status, "value", str(j.status)) for j in judgements)),
                 "mean_score_correct": _mean([s for s, c in zip(scores, labels) if c]),
                 "mean_score_wrong": _mean([s for s, c in zip(scores, labels) if not c])}
    if 0 < sum(labels) < n:
        a, lo, hi = auroc_interval(scores, labels, seed=seed)
        out.update(auroc=a, auroc_lo=lo, auroc_hi=hi)
    else:
        out.update(auroc=None, auroc_lo=None, auroc_hi=None)  # one class only: ranking is undefined
    if steps is not None:
        named = [(critique_step(j.critique), s) for j, s in zip(judgements, steps) if s is not None]
        out["step_items"] = len(named)
        out["step_agreement"] = _mean([float(got == want) for got, want in named])
        clean = [critique_step(j.critique) is None for j, c in zip(judgements, labels) if c]
        out["names_no_step_when_correct"] = _mean([float(x) for x in clean])
    return out


def _mean(values: Sequence[float]) -> Optional[float]:
    return float(np.mean(values)) if len(values) else None


def describe_quality(name: str, q: dict) -> str:
    """One line for the run's log and the lines under its results table."""
    parts = [f"{name}: format-valid {q['format_valid']}/{q['n']}"]
    if q["auroc"] is not None:
        parts.append(f"score AUROC {q['auroc']:.3f} [{q['auroc_lo']:.3f}, {q['auroc_hi']:.3f}]")
    if q.get("step_agreement") is not None:
        parts.append(f"names the annotator's step in {q['step_agreement']:.0%} of {q['step_items']} flawed")
    return "; ".join(parts)
