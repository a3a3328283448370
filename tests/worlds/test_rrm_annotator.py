"""Rule-based RRM annotator: finds each injected flaw, rates expert trajectories high, never leaks."""

import re

import pytest

from reagent_jax import rrm, worlds
from reagent_jax.worlds import rrm_annotator
from reagent_jax.worlds.rrm_annotator import evaluate_printed


@pytest.fixture(scope="module")
def world():
    return worlds.make_world(seed=5, n_entities=30, n_questions=90)


def _call(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _assert_no_leak(question, annotation):
    # The critique is shown to the agent: no numbers at all, so neither the answer nor a value.
    assert not re.search(r"\d", annotation.critique), annotation.critique
    assert not re.search(rf"(?<!\d){re.escape(question.answer)}(?!\d)", annotation.critique)


def test_expert_trajectories_are_clean_and_score_high(world):
    for q in world.questions:
        a = rrm_annotator.annotate(q, worlds.expert_trajectory(world, q))
        assert a.flaws == () and a.score >= 0.9, a.text
        _assert_no_leak(q, a)
        j = rrm.parse_judgement(a.text)
        assert j.status is rrm.JudgementStatus.OK and j.score == a.score
        assert j.think == a.think and j.critique == a.critique


def test_each_injected_flaw_is_found(world):
    seen = set()
    for q in world.questions:
        expert_score = rrm_annotator.annotate(q, worlds.expert_trajectory(world, q)).score
        for flaw in worlds.applicable_flaws(q):
            a = rrm_annotator.annotate(q.to_record(), worlds.flawed_trajectory(world, q, flaw, seed=4))
            assert a.flaws == (flaw,), (flaw, a.text)
            assert a.score < expert_score and a.score <= 0.7, (flaw, a.score)
            _assert_no_leak(q, a)
            assert rrm.parse_judgement(a.text).status is rrm.JudgementStatus.OK
            seen.add(flaw)
    assert seen == set(worlds.FLAWS)


def test_think_for_skipped_lookup_does_not_invent_the_hidden_value(world):
    for q in world.questions:
        if q.level < 2:
            continue
        traj = worlds.flawed_trajectory(world, q, "skipped_lookup")
        a = rrm_annotator.annotate(q, traj)
        shown = set(re.findall(r"\d+", " ".join(m.get("content") or "" for m in traj)))
        queries = [c["function"]["arguments"]["query"] for m in traj for c in m.get("tool_calls", [])
                   if c["function"]["name"] == "search"]
        skipped = [t for t in q.terms if t.query not in queries]
        assert len(skipped) == 1
        for number in re.findall(r"\d+", a.think):
            # step numbers and counts are small; every other number must be visible in the trajectory
            assert number in shown or int(number) <= 4, f"{number} not visible in trajectory"
        assert not re.search(rf"(?<!\d){skipped[0].value}(?!\d)", a.think) or str(skipped[0].value) in shown


def test_hand_made_trajectories(world):
    q = next(q for q in world.questions if q.level == 2 and q.ops == ("plus",))
    t1, t2 = q.terms
    doc = lambda t: world.search(t.query, 1)[0]["contents"]  # noqa: E731
    searches = [
        {"role": "user", "content": q.question},
        {"role": "assistant", "content": "", "tool_calls": [_call("search", f'{{"query": "{t1.query}"}}')]},  # JSON-string args
        {"role": "tool", "content": doc(t1)},
        {"role": "assistant", "content": "", "tool_calls": [_call("search", {"query": t2.query})]},
        {"role": "tool", "content": doc(t2)},
    ]
    # Correct by hand: no flaw, slightly lower score than the expert.
    by_hand = searches + [{"role": "assistant", "content": f"{t1.value} + {t2.value} = {q.answer}. \\boxed{{{q.answer}}}"}]
    a = rrm_annotator.annotate(q, by_hand)
    assert a.flaws == () and a.score == pytest.approx(0.9)
    # Python output ignored: the final answer is not what the code printed.
    wrong = int(q.answer) + 3
    ignored = searches + [
        {"role": "assistant", "content": "", "tool_calls": [_call("python", {"code": f"a = {t1.value}\nb = {t2.value}\nprint(a + b)"})]},
        {"role": "tool", "content": q.answer},
        {"role": "assistant", "content": f"\\boxed{{{wrong}}}"},
    ]
    a = rrm_annotator.annotate(q, ignored)
    assert a.flaws == ("wrong_arithmetic",) and "does not match your computation" in a.critique
    # Unknown tool and a trajectory that stops after a tool response.
    stopped = searches[:3] + [{"role": "assistant", "content": "", "tool_calls": [_call("calculator", {"x": 1})]},
                              {"role": "tool", "content": "Error: unknown tool"}]
    a = rrm_annotator.annotate(q, stopped)
    assert set(a.flaws) == {"malformed_tool_call", "no_answer", "skipped_lookup"} and a.score == 0.0
    # A lucky guess without any lookup is still unsupported.
    guess = [{"role": "user", "content": q.question}, {"role": "assistant", "content": f"\\boxed{{{q.answer}}}"}]
    a = rrm_annotator.annotate(q, guess)
    assert a.flaws == ("skipped_lookup",) and a.score < 0.5


def test_multi_dim_annotation_parses_back(world):
    q = next(q for q in world.questions if q.level == 2)
    a = rrm_annotator.annotate(q, worlds.flawed_trajectory(world, q, "misread_value"), multi_dim=True)
    j = rrm.parse_judgement(a.text)
    assert set(j.sub_scores) == set(rrm.SUB_SCORE_NAMES)
    assert j.sub_scores["information_use"] < j.sub_scores["reasoning"]


def test_evaluate_printed_is_safe_and_exact():
    assert evaluate_printed("print(452 + 1310)") == 1762
    assert evaluate_printed("a = 7\nb = a * 6\nprint(b - 2)") == 40
    assert evaluate_printed("import os\nprint(1)") is None
    assert evaluate_printed("print(__import__('os').getcwd())") is None
    assert evaluate_printed("print(1/0)") is None
    assert evaluate_printed("print(") is None


def test_bad_record_is_rejected(world):
    with pytest.raises(ValueError, match="not a synthetic-world question record"):
        rrm_annotator.annotate({"question": "x"}, [])
