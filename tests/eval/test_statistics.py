"""Confidence intervals and AUROC against plain NumPy references and their coverage."""
import numpy as np
import pytest

from reagent_jax.eval.statistics import Interval, auroc, mean_ci, paired_bootstrap


def _bootstrap_reference(a, b, resamples, confidence, seed):
    """The textbook loop: resample item indices, mean difference, percentiles (same draws)."""
    diff = np.asarray(b, float) - np.asarray(a, float)
    rng = np.random.default_rng(seed)
    means = []
    for k in range(0, resamples, 1000):
        idx = rng.integers(0, diff.size, (min(1000, resamples - k), diff.size))
        means.extend(np.mean(diff[row]) for row in idx)
    tail = (1 - confidence) / 2
    return diff.mean(), np.percentile(means, 100 * tail), np.percentile(means, 100 * (1 - tail))


def test_paired_bootstrap_matches_the_reference_loop():
    rng = np.random.default_rng(0)
    before = rng.random(80) < 0.3
    after = before | (rng.random(80) < 0.2)  # some questions fixed, none broken
    got = paired_bootstrap(before, after, resamples=2500, seed=4)
    mean, lo, hi = _bootstrap_reference(before, after, 2500, 0.95, 4)
    assert (got.estimate, got.lo, got.hi) == pytest.approx((mean, lo, hi), abs=1e-12)
    assert got.n == 80 and got.excludes_zero and got.lo > 0
    assert str(got).startswith(f"{mean:+.3f} [")


def test_paired_bootstrap_covers_the_true_difference():
    """Over 300 draws of 200 paired items with a true difference of +0.1, the 90% interval
    contains +0.1 in about 90% of them."""
    rng = np.random.default_rng(1)
    covered = 0
    for trial in range(300):
        before = rng.random(200) < 0.4
        flip = rng.random(200)
        after = np.where(flip < 0.2, True, np.where(flip < 0.3, False, before))  # E[after - before] = 0.2*0.6 - 0.1*0.4
        ci = paired_bootstrap(before, after, resamples=400, confidence=0.9, seed=trial)
        covered += ci.lo <= 0.2 * 0.6 - 0.1 * 0.4 <= ci.hi
    assert 0.84 <= covered / 300 <= 0.95


def test_identical_scores_give_a_zero_width_interval_and_bad_input_is_named():
    ci = paired_bootstrap([1, 0, 1], [1, 0, 1])
    assert (ci.estimate, ci.lo, ci.hi) == (0.0, 0.0, 0.0) and not ci.excludes_zero
    with pytest.raises(ValueError, match="3 before vs 2 after"):
        paired_bootstrap([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="non-finite values at \\[1\\]"):
        paired_bootstrap([1, float("nan"), 1], [1, 0, 1])
    with pytest.raises(ValueError, match="confidence must be in"):
        paired_bootstrap([1], [0], confidence=95)


def test_mean_ci_is_the_student_t_interval():
    values = [0.05, 0.112, 0.0]
    got = mean_ci(values)
    x = np.asarray(values)
    half = 4.302652729911275 * x.std(ddof=1) / np.sqrt(3)  # t(0.975, df=2), from the tables
    assert (got.estimate, got.lo, got.hi) == pytest.approx((x.mean(), x.mean() - half, x.mean() + half), abs=1e-9)  # the table value has 16 digits
    assert not got.excludes_zero and got.n == 3
    assert mean_ci([0.2]) == Interval(0.2, 0.2, 0.2, 0.95, 1)
    big = mean_ci(np.arange(1000.0), confidence=0.9)  # many values: close to the normal interval
    assert big.hi - big.estimate == pytest.approx(1.6449 * np.arange(1000.0).std(ddof=1) / np.sqrt(1000), rel=2e-3)


def test_auroc_matches_counting_pairs():
    rng = np.random.default_rng(2)
    labels = rng.random(60) < 0.4
    scores = np.round(rng.random(60) + 0.3 * labels, 1)  # rounded: many ties
    pos, neg = scores[labels], scores[~labels]
    pairs = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert auroc(scores, labels) == pytest.approx(pairs / (pos.size * neg.size), abs=1e-12)
    assert auroc([0.9, 0.8, 0.1], [True, True, False]) == 1.0
    assert auroc([0.5, 0.5], [True, False]) == 0.5
    with pytest.raises(ValueError, match="both classes; got 2 positive and 0 negative"):
        auroc([0.1, 0.2], [True, True])


def test_consecutive_comparisons_pair_each_policy_with_the_one_before():
    from reagent_jax.eval.statistics import consecutive_comparisons, describe_comparison
    scores = {"random_init": [0] * 40, "sft": [1] * 20 + [0] * 20, "grpo": [1] * 21 + [0] * 19}
    rows = consecutive_comparisons(scores, seed=3)
    assert [(r["before"], r["after"], r["n"]) for r in rows] == [("random_init", "sft", 40), ("sft", "grpo", 40)]
    assert rows[0]["estimate"] == 0.5 and rows[1]["estimate"] == pytest.approx(0.025)
    assert rows[1] == {"before": "sft", "after": "grpo", **paired_bootstrap(scores["sft"], scores["grpo"], seed=3).to_dict()}
    assert describe_comparison(rows[0]).startswith("random_init -> sft: +0.500 [") and "a real difference" in describe_comparison(rows[0])
    assert "not distinguishable from no change" in describe_comparison(rows[1])
    assert consecutive_comparisons({"only": [1, 0]}) == []
