"""pass@k and avg@k from n sampled answers per question.

    avg@k   = mean over questions of c / n           (pass@1 averaged over the n samples)
    pass@k  = mean over questions of 1 - C(n - c, k) / C(n, k)

with n samples of a question and c of them correct. The pass@k estimator is the unbiased one of
Chen et al. 2021 ("Evaluating Large Language Models Trained on Code"): the chance that at least
one of k samples drawn without replacement from the n is correct. For k = n it is 1 when any
sample is correct; for k = 1 it equals c / n. It is computed exactly in integers and rounded once:
C(n - c, k) / C(n, k) = perm(n - k, c) / perm(n, c) = perm(n - c, k) / perm(n, k), whichever has
fewer factors, so no large binomial coefficient is formed and no float rounding accumulates
(a float product drifts by ~n ulps and misses c / n at k = 1).
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one question with n samples, c of them correct."""
    if not (isinstance(n, (int, np.integer)) and isinstance(c, (int, np.integer)) and isinstance(k, (int, np.integer))):
        raise TypeError(f"pass_at_k: n, c, k must be integers, got {n!r}, {c!r}, {k!r}")
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    n, c, k = int(n), int(c), int(k)
    if n - c < k:
        return 1.0
    if c <= k:
        total, missed = math.perm(n, c), math.perm(n - k, c)
    else:
        total, missed = math.perm(n, k), math.perm(n - c, k)
    return (total - missed) / total  # int / int: correctly rounded, even for huge integers


def _counts(correct: Sequence[Sequence[bool]]) -> list[tuple[int, int]]:
    out = []
    for q, row in enumerate(correct):
        row = [bool(x) for x in row]
        if not row:
            raise ValueError(f"question {q} has no samples")
        out.append((len(row), sum(row)))
    return out


def avg_at_k(correct: Sequence[Sequence[bool]]) -> float:
    """Mean over questions of the fraction of correct samples (questions may differ in n)."""
    counts = _counts(correct)
    return float(np.mean([c / n for n, c in counts])) if counts else float("nan")


def mean_pass_at_k(correct: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k averaged over questions; each question needs at least k samples."""
    counts = _counts(correct)
    if not counts:
        return float("nan")
    short = [q for q, (n, _) in enumerate(counts) if n < k]
    if short:
        raise ValueError(f"pass@{k} needs >= {k} samples per question; question {short[0]} has {counts[short[0]][0]}")
    return float(np.mean([pass_at_k(n, c, k) for n, c in counts]))


def pass_curve(correct: Sequence[Sequence[bool]]) -> Mapping[int, float]:
    """{k: pass@k} for k = 1 .. the smallest n over the questions."""
    counts = _counts(correct)
    if not counts:
        return {}
    return {k: mean_pass_at_k(correct, k) for k in range(1, min(n for n, _ in counts) + 1)}
