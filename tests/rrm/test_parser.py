"""Agent-RRM output parser: a fuzz table of replies with the expected status and score."""

import pytest

from reagent_jax import rrm
from reagent_jax.rrm import JudgementStatus as S

GOOD = "<think>a</think>\n<critique>c</critique>\n<score>0.8</score>"

# (reply, status, score, think, critique)
TABLE = [
    (GOOD, S.OK, 0.8, "a", "c"),
    ("<think>\nstep one\n</think>\n<critique>\nsearch first\n</critique>\n<score>\n0.35\n</score>", S.OK, 0.35, "step one", "search first"),
    ("analysis only</think>\n<critique>c</critique><score>8/10</score>", S.OK, 0.8, "analysis only", "c"),  # Qwen3 thinking
    ("<THINK> a </THINK>< critique >c</ critique ><Score> 80% </Score>", S.OK, 0.8, "a", "c"),
    ("<think>a</think><critique>c</critique><score>7 out of 10</score>", S.OK, 0.7, "a", "c"),
    ("<think>a</think><critique>c</critique><score>.85</score>", S.OK, 0.85, "a", "c"),
    ("<think>a</think><critique>c</critique><score>Score: 0.6 (good)</score>", S.OK, 0.6, "a", "c"),
    ("Sure! <think>a</think> then <critique>c</critique> and <score>0.4</score> done.", S.OK, 0.4, "a", "c"),
    ("<think></think>\n\n<think>real</think><critique>c</critique><score>1</score>", S.OK, 1.0, "real", "c"),
    ("<think>I might say <score>0.1</score></think><critique>c</critique><score>0.9</score>", S.OK, 0.9, "I might say <score>0.1</score>", "c"),
    ("<think>a</think><critique>c</critique><score>1.5</score>", S.CLAMPED, 1.0, "a", "c"),
    ("<think>a</think><critique>c</critique><score>-0.3</score>", S.CLAMPED, 0.0, "a", "c"),
    ("<think>a</think><critique>c</critique><score>8</score>", S.CLAMPED, 1.0, "a", "c"),
    ("<think>a</think><critique>c</critique><score>high</score>", S.BAD_SCORE, 0.0, "a", "c"),
    ("<think>a</think><critique>c</critique><score>nan</score>", S.BAD_SCORE, 0.0, "a", "c"),
    ("<think>a</think><critique>c</critique><score>3/0</score>", S.BAD_SCORE, 0.0, "a", "c"),
    ("<think>a</think><critique>c</critique>", S.MISSING_SCORE, 0.0, "a", "c"),
    ("<think>a</think><critique>c</critique>Score: 0.7", S.MISSING_SCORE, 0.0, "a", "c"),
    ("", S.MISSING_SCORE, 0.0, "", ""),
    (None, S.MISSING_SCORE, 0.0, "", ""),
    ("<think>a</think><critique>c</critique><score>0.2</score> again <score>0.9</score>", S.MULTIPLE_SCORES, 0.9, "a", "c"),
    ("<think>a</think><critique>c</critique><score>0.5</score><score>bad</score>", S.MULTIPLE_SCORES, 0.5, "a", "c"),
    ("<think>a</think><critique>c</critique><score>0.7", S.UNCLOSED_TAG, 0.7, "a", "c"),
    ("<think>a</think><critique>cut off here", S.MISSING_SCORE, 0.0, "a", "cut off here"),
    ("<think>a ... <critique>c</critique><score>0.6</score>", S.UNCLOSED_TAG, 0.6, "a ...", "c"),
    ("<think>a</think><score>0.7</score>", S.MISSING_CRITIQUE, 0.7, "a", ""),
    ("<think>a</think><critique>   </critique><score>0.7</score>", S.MISSING_CRITIQUE, 0.7, "a", ""),
    ("<critique>c</critique><score>0.6</score>", S.MISSING_THINK, 0.6, "", "c"),
]


@pytest.mark.parametrize("text,status,score,think,critique", TABLE)
def test_fuzz_table(text, status, score, think, critique):
    j = rrm.parse_judgement(text)
    assert j.status is status, (text, j)
    assert j.score == pytest.approx(score)
    assert 0.0 <= j.score <= 1.0
    assert j.think == think and j.critique == critique
    assert (status is S.OK) == (j.issues == ()) == j.ok
    if status is not S.OK:
        assert j.issues[0] is status, "status is the most severe issue"


def test_all_issues_listed_in_severity_order():
    j = rrm.parse_judgement("")
    assert j.issues == (S.MISSING_SCORE, S.MISSING_CRITIQUE, S.MISSING_THINK)
    j = rrm.parse_judgement("<score>2</score><score>3</score>")
    assert j.issues == (S.CLAMPED, S.MULTIPLE_SCORES, S.MISSING_CRITIQUE, S.MISSING_THINK)


def test_fallback_score_is_configurable():
    assert rrm.parse_judgement("no tags at all", fallback_score=0.5).score == 0.5
    assert rrm.parse_judgement("<score>??</score>", fallback_score=0.5).score == 0.5
    assert rrm.parse_judgement(GOOD, fallback_score=0.5).score == 0.8
    with pytest.raises(ValueError, match="fallback_score"):
        rrm.parse_judgement(GOOD, fallback_score=2.0)


def test_sub_scores_and_confidence():
    text = GOOD + "\n<scores>reasoning=0.8; tool_use: 0.4, information_use=90%</scores>\n<confidence>0.7</confidence>"
    j = rrm.parse_judgement(text)
    assert j.status is S.OK and j.score == 0.8
    assert j.sub_scores == {"reasoning": 0.8, "tool_use": 0.4, "information_use": 0.9}
    assert j.confidence == 0.7
    assert rrm.parse_judgement(GOOD).sub_scores == {} and rrm.parse_judgement(GOOD).confidence is None


def test_render_then_parse_round_trip():
    text = rrm.render_judgement(
        "The agent searched twice.", "Use python for the sum.", 0.25,
        sub_scores={"reasoning": 0.2, "tool_use": 0.9, "information_use": 1.0}, confidence=0.6,
    )
    j = rrm.parse_judgement(text)
    assert (j.think, j.critique, j.score, j.status) == ("The agent searched twice.", "Use python for the sum.", 0.25, S.OK)
    assert j.sub_scores == {"reasoning": 0.2, "tool_use": 0.9, "information_use": 1.0} and j.confidence == 0.6
    with pytest.raises(ValueError, match="score"):
        rrm.render_judgement("t", "c", 1.2)


def test_parse_number_forms():
    assert rrm.parse_number("0.8") == 0.8
    assert rrm.parse_number("8/10") == 0.8
    assert rrm.parse_number("80%") == 0.8
    assert rrm.parse_number("4 out of 5") == 0.8
    assert rrm.parse_number("none") is None


def test_stats_count_statuses():
    stats = rrm.JudgementStats()
    stats.update([rrm.parse_judgement(t) for t, *_ in TABLE])
    n_ok = sum(s is S.OK for _, s, *_ in TABLE)
    assert stats.total == len(TABLE) and stats.counts["ok"] == n_ok
    d = stats.as_dict()
    assert d["rrm/n"] == len(TABLE)
    assert d["rrm/frac/ok"] == pytest.approx(n_ok / len(TABLE))
    assert sum(d[f"rrm/count/{s.value}"] for s in S) == len(TABLE)
    assert d["rrm/mean_score"] == pytest.approx(sum(sc for _, _, sc, *_ in TABLE) / len(TABLE))
    other = rrm.JudgementStats().update(rrm.parse_judgement(""))
    stats.merge(other)
    assert stats.total == len(TABLE) + 1 and stats.fraction(S.MISSING_SCORE) == pytest.approx(
        (sum(s is S.MISSING_SCORE for _, s, *_ in TABLE) + 1) / (len(TABLE) + 1)
    )
