"""LLM-as-judge answer grading against a fake grader on loopback, and its rule-based fallback."""


import pytest

from reagent_jax.endpoints import EndpointConfig
from reagent_jax.eval.llm_judge import (
    GRADER_SYSTEM_PROMPT,
    GradeItem,
    LLMAnswerJudge,
    grade_summary,
    grader_messages,
    parse_grade,
)
from reagent_jax.rewards import score_answer
from tests.fake_openai_server import FakeOpenAIServer, grader_reply


@pytest.fixture
def grader():
    with FakeOpenAIServer(reply=grader_reply) as server:
        yield server


def cfg(server):
    return EndpointConfig(base_urls=(server.base_url,), model="grader", max_retries=1, backoff_base_s=0.01,
                          backoff_max_s=0.02, timeout_s=5.0)


def test_grading_with_llm_and_rule_fallback(grader):
    items = [
        GradeItem("Who was US president in 2010?", ["Obama"], "<think>long</think>It was \\boxed{Barack Obama}.",
                  "gaia"),
        {"question": "Capital of France?", "answers": ["Paris"], "response": "\\boxed{Lyon}"},
        {"question": "Capital of France? [unparseable]", "answer": "Paris", "response": "\\boxed{Paris}"},
        {"question": "Capital of Spain? [down]", "ground_truths": ["Madrid"], "response": "\\boxed{Seville}"},
        GradeItem("2+2?", ["4"], "no final answer here, just rambling\nover lines", "gsm8k"),
    ]
    with LLMAnswerJudge(cfg(grader)) as judge:
        grades = judge.grade_many(items)
    obama, lyon, unparseable, down, none = grades
    assert (obama.correct, obama.method, obama.status, obama.extracted) == (True, "llm", "ok", "Barack Obama")
    assert score_answer(items[0].response, ["Obama"], "gaia") < 1.0  # the rule alone would have said no
    assert (lyon.correct, lyon.method, lyon.extracted) == (False, "llm", "Lyon")
    assert (unparseable.correct, unparseable.method, unparseable.status) == (True, "rule_fallback", "missing_label")
    assert unparseable.extracted == "Paris" and unparseable.judge_text == "Looks plausible to me."
    assert (down.correct, down.method, down.status, down.judge_text) == (False, "rule_fallback", "endpoint_error", "")
    assert (none.correct, none.method, none.extracted) == (False, "llm", None)
    summary = grade_summary(grades)
    assert summary["judge/n"] == 5 and summary["judge/accuracy"] == pytest.approx(2 / 5)
    assert summary["judge/method/llm"] == 3 and summary["judge/method/rule_fallback"] == 2
    assert summary["judge/status/endpoint_error"] == 1
    # what the grader saw: the project's prompt, the references, the response without its <think> block
    sent = next(r["body"]["messages"] for r in grader.requests if "2010" in r["body"]["messages"][1]["content"])
    assert sent[0]["content"] == GRADER_SYSTEM_PROMPT
    assert "- Obama" in sent[1]["content"] and "long" not in sent[1]["content"]
    assert sent == grader_messages(GradeItem(*[items[0].question, ("Obama",), items[0].response]))


def test_no_fallback_leaves_undecided(grader):
    with LLMAnswerJudge(cfg(grader), fallback="none") as judge:
        g = judge.grade("Capital of France? [unparseable]", "Paris", "\\boxed{Paris}")
        down = judge.grade("Capital? [down]", ["Madrid"], "\\boxed{Madrid}")
    assert (g.correct, g.method, g.status) == (None, "none", "missing_label")
    assert (down.correct, down.method, down.status) == (None, "none", "endpoint_error")
    assert "HTTP 503" in down.reasoning


def test_bad_items_raise_before_any_request(grader):
    with LLMAnswerJudge(cfg(grader)) as judge:
        with pytest.raises(ValueError, match="grade item 1: no reference answer"):
            judge.grade_many([GradeItem("q?", ["a"], "a"), GradeItem("q?", [" "], "a")])
        with pytest.raises(ValueError, match="grade item 0: response must be a string"):
            judge.grade_many([{"question": "q?", "answers": ["a"], "response": None}])
        with pytest.raises(ValueError, match="fallback"):
            LLMAnswerJudge(cfg(grader), fallback="maybe")
    assert grader.count == 0


def test_long_responses_are_cut_in_the_middle():
    item = GradeItem("q?", ["a"], "x" * 10_000 + " \\boxed{a}")
    user = grader_messages(item, max_response_chars=1000)[1]["content"]
    assert "\\boxed{a}" in user and "characters omitted" in user and len(user) < 1500


@pytest.mark.parametrize("text, correct, extracted, status", [
    ("<reasoning>same</reasoning><extracted_answer>Paris</extracted_answer><correct>yes</correct>", True, "Paris",
     "ok"),
    ("<REASONING>diff</REASONING>\n< extracted_answer >Lyon</ extracted_answer >\n<Correct> No. </Correct>",
     False, "Lyon", "ok"),
    ("<think><correct>yes</correct></think><extracted_answer>1</extracted_answer><correct>no</correct>", False, "1",
     "ok"),
    ("<extracted_answer>NONE</extracted_answer><correct>no", False, None, "ok"),  # cut off before the closing tag
    ("<correct>yes or no</correct>", None, None, "bad_label"),
    ("<correct>yes</correct> wait <correct>no</correct>", None, None, "conflicting_labels"),
    ("The answers match.\n**Correct:** yes", True, None, "loose_format"),
    ("<correct>not correct</correct>", False, None, "ok"),
    ("no verdict at all", None, None, "missing_label"),
    (None, None, None, "missing_label"),
])
def test_parse_grade(text, correct, extracted, status):
    g = parse_grade(text)
    assert (g.correct, g.extracted, g.status) == (correct, extracted, status)
