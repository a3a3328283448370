"""The GSM8K rule annotator: it finds the step a trajectory never reaches from the worked
solution, never writes the answer into its critique, and its flawed variants are what they say."""
import random

import pytest

from reagent_jax.rrm.parser import JudgementStatus, parse_judgement
from reagent_jax.worlds import gsm8k_annotator as g
from reagent_jax.worlds.annotated import annotated_trajectory
from reagent_jax.worlds.expert import run_python

RECORD = {"id": "t/0", "question": "Natalia sold clips to 48 friends in April and half as many in May. How many "
                                   "clips did she sell in April and May?", "answer": ["72"],
          "meta": {"solution": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
                               "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"}}


def _numbers(text):
    import re
    return set(re.findall(r"\d+(?:\.\d+)?", text))


def test_solution_steps_name_each_calculation_without_its_numbers():
    steps = g.solution_steps(RECORD["meta"]["solution"])
    assert [(s.code, s.value, s.operation) for s in steps] == [("48/2", 24.0, "a division"), ("48+24", 72.0, "an addition")]
    assert steps[1].words == "Natalia sold clips altogether in April and May"
    assert not any(_numbers(s.words) for s in steps)


def test_expert_trajectory_is_clean_and_scores_high():
    a = g.annotate(RECORD, annotated_trajectory(RECORD, run_python))
    assert a.correct and a.flaws == () and a.step is None and a.score == g.CLEAN_SCORE
    j = parse_judgement(a.text)
    assert j.status == JudgementStatus.OK and j.score == pytest.approx(a.score)


@pytest.mark.parametrize("flaw, correct, flaws, step", [
    ("wrong_step", False, ("missed_step",), 2),
    ("skipped_step", False, ("missed_step",), 2),
    ("wrong_final", False, ("answer_mismatch",), None),
    ("no_boxed", True, ("no_boxed",), None),
    ("malformed_tool_call", True, ("malformed_tool_call",), None),
    ("by_hand", True, (), None),
])
def test_each_flawed_variant_is_annotated_as_that_flaw(flaw, correct, flaws, step):
    msgs = g.flawed_trajectory(RECORD, flaw, run_python, random.Random(0))
    a = g.annotate(RECORD, msgs)
    assert (a.correct, a.flaws, a.step) == (correct, flaws, step)
    assert "72" not in a.critique  # the critique names the step, never the answer
    if step is not None:
        assert f"Step {step} is missing or wrong" in a.critique and "April and May" in a.critique
    if correct:
        assert a.score < g.CLEAN_SCORE or flaw == "by_hand"
        assert a.score > 0.3
    else:
        assert a.score <= 0.3


def test_scores_order_by_how_far_a_wrong_answer_got():
    three = dict(RECORD, answer=["70"], meta={"solution": RECORD["meta"]["solution"].replace("#### 72", "") +
                                              "\nShe gave 72-2 = <<72-2=70>>70 away."})
    half = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "48/2 is 24, so \\boxed{24}."}]
    none = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\\boxed{5}."}]
    a_half, a_none = g.annotate(three, half), g.annotate(three, none)
    assert (a_half.step, a_none.step) == (2, 1)
    assert a_half.score > a_none.score > 0
    silent = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "python", "arguments": {"code": "print(1)"}}}]}]
    assert g.annotate(three, silent).flaws == ("no_answer",) and g.annotate(three, silent).score == 0.0


def test_records_mix_expert_and_flawed_and_skip_rows_without_a_solution():
    rows = [dict(RECORD, id=f"t/{i}") for i in range(40)] + [{"id": "x", "question": "q", "answer": ["1"]}]
    out = g.gsm8k_rrm_records(rows, run_python, seed=0)
    assert len(out) == 40 and {r["flaw"] for r in out} > {None, "wrong_final"}
    assert {r["target"] for r in out} == {0.0, 1.0}
    assert all(parse_judgement(r["text"]).ok for r in out)
    assert [r["id"] for r in g.gsm8k_rrm_records(rows, run_python, seed=0)] == [r["id"] for r in out]  # seeded
    with pytest.raises(ValueError, match="meta.solution"):
        g.annotate({"id": "x", "question": "q", "answer": ["1"]}, [])


def test_rule_judge_needs_records():
    judge = g.GSM8KRuleJudge()
    traj = annotated_trajectory(RECORD, run_python)
    from reagent_jax.rrm.base import JudgeRequest
    [j] = judge.judge_many([JudgeRequest(RECORD["question"], traj, record=RECORD)])
    assert j.ok and j.score == g.CLEAN_SCORE
    with pytest.raises(ValueError, match="record"):
        judge.judge_many([JudgeRequest(RECORD["question"], traj)])
