"""EvalPlanner prompts: what each stage shows the judge, and targets that parse back."""

import pytest

from reagent_jax import evalplanner as ep

INSTRUCTION = "Add 17 and 25. Reply with the number only."
A, B = "RESPONSE-ALPHA 42", "RESPONSE-BETA 41"
PLAN = "1. Compute 17 + 25 = 42 step by step. 2. Check the reply is only a number."


def _roles(msgs):
    return [m["role"] for m in msgs]


def test_plan_prompt_sees_only_the_instruction():
    msgs = ep.plan_messages(INSTRUCTION)
    assert _roles(msgs) == ["system", "user"]
    user = msgs[1]["content"]
    assert INSTRUCTION in user
    assert "reference answer" in user and "step by step" in user
    assert "Response A" not in user and "[[A]]" not in user


def test_execution_prompt_has_everything_and_bias_guards():
    msgs = ep.execution_messages(INSTRUCTION, A, B, PLAN)
    system, user = msgs[0]["content"], msgs[1]["content"]
    positions = [user.index(x) for x in (INSTRUCTION, "[Start of Response A]", A, "[End of Response A]",
                                         "[Start of Response B]", B, "[End of Response B]", PLAN)]
    assert positions == sorted(positions)
    for word in ("order", "length", "names"):
        assert word in system
    assert "step by step" in user and "[Final Verdict] [[A]]" in user and "[Final Verdict] [[B]]" in user
    assert ep.EXEC_START in user and ep.EXEC_END in user and ep.PLAN_START not in user


def test_single_pass_judge_prompt_shows_the_format():
    user = ep.judge_messages(INSTRUCTION, A, B)[1]["content"]
    order = [ep.PLAN_START, ep.PLAN_END, ep.EXEC_START, ep.EXEC_END, ep.FINAL_VERDICT]
    positions = [user.index(m) for m in order]
    assert positions == sorted(positions)
    assert A in user and B in user and INSTRUCTION in user


def test_verdict_only_ablation_has_no_planning():
    msgs = ep.verdict_only_messages(INSTRUCTION, A, B)
    user = msgs[1]["content"]
    assert A in user and B in user
    assert ep.PLAN_START not in user and ep.EXEC_START not in user and "plan" not in user.lower()
    assert "[[A]]" in user and "[[B]]" in user


def test_targets_parse_back():
    text = ep.format_judge_output(PLAN, "A gives 42, B gives 41; A is right.", "A")
    e = ep.parse_evaluation(text)
    assert (e.plan, e.execution, e.verdict, e.status) == (PLAN, "A gives 42, B gives 41; A is right.", "A", ep.VerdictStatus.OK)
    e = ep.parse_evaluation(ep.format_execution_output("B is right.", "B"), expect_plan=False)
    assert (e.execution, e.verdict, e.status) == ("B is right.", "B", ep.VerdictStatus.OK)
    with pytest.raises(ValueError, match="verdict"):
        ep.format_judge_output(PLAN, "x", "C")


def test_bad_inputs():
    with pytest.raises(ValueError, match="instruction"):
        ep.plan_messages("   ")
    with pytest.raises(TypeError, match="response_b"):
        ep.judge_messages(INSTRUCTION, A, None)
