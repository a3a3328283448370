"""Whether a difference is real: confidence intervals for the comparisons the papers make.

Three questions come back in every experiment of this project:
  * two policies or judges scored on the same items (attempt 1 vs attempt 2 of Reagent-C, SFT vs
    GRPO on the same held-out questions): `paired_bootstrap` resamples the items, so the interval
    reflects which questions happen to be in the set, and the pairing removes per-item difficulty;
  * a recipe run with several seeds (Reagent-R vs rule-only GRPO): `mean_ci`, a Student-t interval
    of the per-seed values, honest with 3 seeds (wide) where a normal interval is not;
  * a score meant to rank good above bad (an RRM's score against correctness): `auroc`.
Each returns an `Interval` (or a float) that prints as `+0.050 [-0.012, +0.112]`.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
from scipy import stats

_CHUNK = 1000  # bootstrap resamples drawn at once: [chunk, n] indices in memory


@dataclasses.dataclass(frozen=True)
class Interval:
    """An estimate with its confidence interval [lo, hi] at `confidence`, from `n` items or seeds."""
    estimate: float
    lo: float
    hi: float
    confidence: float
    n: int

    @property
    def excludes_zero(self) -> bool:
        """The sign of the estimate is established at this confidence."""
        return self.lo > 0 or self.hi < 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        return f"{self.estimate:+.3f} [{self.lo:+.3f}, {self.hi:+.3f}]"


def _vector(values: Sequence[float], name: str) -> np.ndarray:
    x = np.asarray(values, np.float64).reshape(-1)
    if x.size == 0:
        raise ValueError(f"{name}: no values")
    if not np.isfinite(x).all():
        raise ValueError(f"{name}: non-finite values at {np.flatnonzero(~np.isfinite(x))[:5].tolist()}")
    return x


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def paired_bootstrap(before: Sequence[float], after: Sequence[float], *, resamples: int = 10_000,
                     confidence: float = 0.95, seed: int = 0) -> Interval:
    """mean(after - before) over paired items with a percentile bootstrap interval.

    `before[i]` and `after[i]` score the same item (e.g. 0/1 correctness of one held-out question
    before and after training). Items are resampled with replacement `resamples` times."""
    a, b = _vector(before, "before"), _vector(after, "after")
    if a.shape != b.shape:
        raise ValueError(f"paired scores differ in length: {a.size} before vs {b.size} after")
    _check_confidence(confidence)
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    diff = b - a  # [n]
    rng = np.random.default_rng(seed)
    means = np.concatenate([diff[rng.integers(0, diff.size, (min(_CHUNK, resamples - k), diff.size))].mean(axis=1)
                            for k in range(0, resamples, _CHUNK)])  # [resamples]
    tail = (1 - confidence) / 2
    lo, hi = np.quantile(means, [tail, 1 - tail])
    return Interval(float(diff.mean()), float(lo), float(hi), confidence, int(diff.size))


def mean_ci(values: Sequence[float], *, confidence: float = 0.95) -> Interval:
    """The mean of per-seed values with a Student-t interval (n - 1 degrees of freedom).

    One value has no spread: its interval is the value itself and `n` = 1 says so."""
    x = _vector(values, "values")
    _check_confidence(confidence)
    mean = float(x.mean())
    if x.size == 1:
        return Interval(mean, mean, mean, confidence, 1)
    half = float(stats.t.ppf((1 + confidence) / 2, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))
    return Interval(mean, mean - half, mean + half, confidence, int(x.size))


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Probability that a random positive scores above a random negative (ties count one half):
    how well `scores` rank the items with label True above those with label False."""
    s = _vector(scores, "scores")
    y = np.asarray(labels, bool).reshape(-1)
    if y.shape != s.shape:
        raise ValueError(f"{s.size} scores vs {y.size} labels")
    pos, neg = int(y.sum()), int((~y).sum())
    if not pos or not neg:
        raise ValueError(f"AUROC needs both classes; got {pos} positive and {neg} negative items")
    ranks = stats.rankdata(s)  # average ranks: ties share them (Mann-Whitney U)
    return float((ranks[y].sum() - pos * (pos + 1) / 2) / (pos * neg))


def consecutive_comparisons(scores: dict[str, Sequence[float]], *, confidence: float = 0.95,
                            seed: int = 0) -> list[dict]:
    """Each policy against the one evaluated before it on the same items (dict order), as
    `{"before", "after", estimate, lo, hi, confidence, n}` rows of a paired bootstrap."""
    names = list(scores)
    return [{"before": a, "after": b, **paired_bootstrap(scores[a], scores[b], confidence=confidence,
                                                         seed=seed).to_dict()}
            for a, b in zip(names, names[1:])]


def describe_comparison(row: dict) -> str:
    """One line for a `consecutive_comparisons` row: `sft -> grpo: +0.050 [-0.012, +0.112] ...`."""
    ci = Interval(**{k: row[k] for k in ("estimate", "lo", "hi", "confidence", "n")})
    verdict = "a real difference" if ci.excludes_zero else "not distinguishable from no change"
    return (f"{row['before']} -> {row['after']}: {ci} over {ci.n} paired items "
            f"({ci.confidence:.0%} bootstrap interval; {verdict})")
