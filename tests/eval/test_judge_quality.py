"""Judge quality against labels: format-valid rate, AUROC (vs a brute-force pair count) with a
bootstrap interval, and step agreement counted by hand."""
import itertools

import numpy as np
import pytest

from reagent_jax.eval.judge_quality import auroc_interval, critique_step, describe_quality, judge_quality
from reagent_jax.rrm.parser import parse_judgement


def _j(score, critique="fine", ok=True):
    text = f"<think>t</think><critique>{critique}</critique><score>{score}</score>" if ok else "no tags at all"
    return parse_judgement(text)


def _pairs_auroc(scores, labels):
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    return np.mean([1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg)])


def test_critique_step():
    assert critique_step("Step 3 is missing or wrong: ...") == 3
    assert critique_step("fine; see step 12 and step 2") == 12
    assert critique_step("Steps were fine") is None and critique_step("") is None


def test_quality_against_references():
    rng = np.random.default_rng(0)
    labels = rng.random(60) < 0.4
    scores = np.round(np.clip(labels * 0.3 + rng.random(60) * 0.7, 0, 1), 2)
    steps = [None if y else int(rng.integers(1, 4)) for y in labels]
    named = [s if (s is not None and i % 3) else (None if i % 2 else 1) for i, s in enumerate(steps)]
    judgements = [_j(s, f"Step {n} is wrong." if n else "Looks fine.", ok=(i % 10 != 0))
                  for i, (s, n) in enumerate(zip(scores, named))]
    q = judge_quality(judgements, labels, steps, seed=0)
    assert q["n"] == 60 and q["format_valid"] == 54 and q["format_valid_rate"] == pytest.approx(0.9)
    used = [j.score for j in judgements]  # the unparsed ones keep the fallback score
    assert q["auroc"] == pytest.approx(_pairs_auroc(used, labels))
    assert q["auroc_lo"] <= q["auroc"] <= q["auroc_hi"]
    want = [critique_step(j.critique) == s for j, s in zip(judgements, steps) if s is not None]
    assert q["step_items"] == len(want) and q["step_agreement"] == pytest.approx(np.mean(want))
    clean = [critique_step(j.critique) is None for j, y in zip(judgements, labels) if y]
    assert q["names_no_step_when_correct"] == pytest.approx(np.mean(clean))
    assert sum(q["statuses"].values()) == 60 and q["statuses"]["ok"] == 54  # the parser's status names
    assert "format-valid 54/60" in describe_quality("annotated", q)


def test_one_class_has_no_auroc_and_bad_lengths_raise():
    q = judge_quality([_j(0.2), _j(0.4)], [False, False])
    assert q["auroc"] is None and q["mean_score_correct"] is None and q["mean_score_wrong"] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="2 judgements vs 1 labels"):
        judge_quality([_j(0.2), _j(0.4)], [False])
    with pytest.raises(ValueError, match="at least one"):
        judge_quality([], [])


def test_auroc_interval_narrows_with_more_items_and_covers_a_perfect_ranker():
    est, lo, hi = auroc_interval([0.9, 0.8, 0.1, 0.2], [True, True, False, False])
    assert est == lo == hi == 1.0
    rng = np.random.default_rng(1)
    widths = []
    for n in (20, 400):
        y = rng.random(n) < 0.5
        s = y * 0.5 + rng.random(n)
        _, lo, hi = auroc_interval(s, y, resamples=500)
        widths.append(hi - lo)
    assert widths[1] < widths[0] / 2
