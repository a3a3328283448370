"""EvalPlanner parser: a fuzz table with expected status/verdict, scores and accuracy helpers."""

import pytest

from reagent_jax import evalplanner as ep
from reagent_jax.evalplanner import VerdictStatus as V

FULL = ep.format_judge_output("the plan", "the execution", "A")

# (text, status, verdict, plan, execution)
TABLE = [
    (FULL, V.OK, "A", "the plan", "the execution"),
    (FULL.replace("[[A]]", "[[B]]"), V.OK, "B", "the plan", "the execution"),
    (FULL.lower(), V.OK, "A", "the plan", "the execution"),
    ("[start of the  evaluation plan] p [end of evaluation plan] [ Start of Plan Execution ] e "
     "[End of the Plan Execution]\n[Final Verdict]: [[ b ]]", V.OK, "B", "p", "e"),
    ("<think>draft says [[B]]</think>\n" + FULL, V.OK, "A", "the plan", "the execution"),
    ("draft says [[B]]</think>\n" + FULL, V.OK, "A", "the plan", "the execution"),
    ("[Start of Plan Execution] B beats [[A]] here [End of Plan Execution]\n[Final Verdict] [[B]]", V.MALFORMED, "B", "", "B beats [[A]] here"),
    ("[Start of Evaluation Plan] p [Start of Plan Execution] e [End of Plan Execution] [Final Verdict] [[B]]", V.MALFORMED, "B", "p", "e"),
    ("[Start of Evaluation Plan] p [End of Evaluation Plan] [Start of Plan Execution] e [Final Verdict] [[A]]", V.MALFORMED, "A", "p", "e"),
    ("Response A is clearly better. [[A]]", V.MALFORMED, "A", "", ""),
    (FULL.replace("[[A]]", "A"), V.MALFORMED, "A", "the plan", "the execution"),
    (FULL.replace("[[A]]", "[B]"), V.MALFORMED, "B", "the plan", "the execution"),
    (FULL.replace("[[A]]", "Response B is better."), V.MALFORMED, "B", "the plan", "the execution"),
    ("no verdict at all", V.NO_VERDICT, None, "", ""),
    ("", V.NO_VERDICT, None, "", ""),
    (None, V.NO_VERDICT, None, "", ""),
    (FULL.replace("[[A]]", ""), V.NO_VERDICT, None, "the plan", "the execution"),
    ("[[A]]</think> thinking ended, nothing after", V.NO_VERDICT, None, "", ""),
    (FULL.replace("[[A]]", "[[A]] or [[B]]"), V.BOTH_VERDICTS, None, "the plan", "the execution"),
    ("first [[A]] then [[B]]", V.BOTH_VERDICTS, None, "", ""),
]


@pytest.mark.parametrize("text,status,verdict,plan,execution", TABLE)
def test_fuzz_table(text, status, verdict, plan, execution):
    e = ep.parse_evaluation(text)
    assert (e.status, e.verdict) == (status, verdict), (text, e)
    assert (e.plan, e.execution) == (plan, execution)


@pytest.mark.parametrize("status,verdict,correct,score", [
    (V.OK, "A", "A", 1.0), (V.OK, "B", "A", 0.0), (V.MALFORMED, "B", "B", 1.0),
    (V.NO_VERDICT, None, "A", 0.5), (V.BOTH_VERDICTS, None, "B", 0.5),
])
def test_verdict_score(status, verdict, correct, score):
    parsed = ep.Evaluation("", "", verdict, status)
    assert ep.verdict_score(parsed, correct) == score
    assert ep.verdict_score({"verdict": verdict}, correct) == score
    assert ep.verdict_score(verdict, correct) == score


def test_verdict_score_rejects_bad_label():
    with pytest.raises(ValueError, match="correct"):
        ep.verdict_score("A", "C")


def test_parse_plan():
    assert ep.parse_plan("<think>hmm</think>\n1. check math\n2. check format") == "1. check math\n2. check format"
    assert ep.parse_plan("[Start of Evaluation Plan]\nP\n[End of Evaluation Plan] trailing") == "P"


# Hand-made example: three pairs, each judged in both orders. In the original order the better
# response is A; swapped, it is B.
#   p1: right both times                         -> position-consistent
#   p2: always answers "A" (position bias)       -> right once, wrong once
#   p3: right once, no verdict once               -> not consistent (a tie is not right)
RESULTS = [
    {"id": "p1", "swapped": False, "verdict": "A", "correct": "A"},
    {"id": "p1", "swapped": True, "verdict": "B", "correct": "B"},
    {"id": "p2", "swapped": False, "verdict": "A", "correct": "A"},
    {"id": "p2", "swapped": True, "verdict": "A", "correct": "B"},
    {"id": "p3", "swapped": False, "verdict": "A", "correct": "A"},
    {"id": "p3", "swapped": True, "verdict": None, "correct": "B"},
]


def test_pairwise_and_position_consistent_accuracy():
    assert ep.pairwise_accuracy(RESULTS) == pytest.approx((1 + 1 + 1 + 0 + 1 + 0.5) / 6)
    assert ep.position_consistent_accuracy(RESULTS) == pytest.approx(1 / 3)
    assert ep.position_consistent_accuracy(RESULTS[:2]) == 1.0
    assert ep.pairwise_accuracy(RESULTS[2:4]) == 0.5


def test_accuracy_helpers_reject_bad_records():
    with pytest.raises(ValueError, match="both orders"):
        ep.position_consistent_accuracy(RESULTS[:3])
    with pytest.raises(ValueError, match="two records"):
        ep.position_consistent_accuracy(RESULTS[:2] + [RESULTS[0]])
    with pytest.raises(ValueError, match="lacks"):
        ep.pairwise_accuracy([{"verdict": "A"}])
    with pytest.raises(ValueError, match="at least one"):
        ep.pairwise_accuracy([])
