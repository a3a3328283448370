"""EvalPlanner parser on adversarial judge output: draft verdicts in thinking or in the plan, cut-off
replies, verdict-only outputs, and replies of 10^6 characters."""
import pytest

from reagent_jax import evalplanner as ep
from reagent_jax.evalplanner import VerdictStatus as V
from reagent_jax.evalplanner.judge import parse_output

FULL = ep.format_judge_output("the plan", "the execution", "A")
EXEC = "[Start of Plan Execution] e [End of Plan Execution]"

# (text, status, verdict)
TABLE = [
    # thinking that never closes (cut off at max tokens): its draft verdict is not a verdict
    ("<think>I would say [[B]] but", V.NO_VERDICT, None),
    ("<think>drafting [Final Verdict] [[B]]", V.NO_VERDICT, None),
    (FULL + "\n<think>on second thought [[B]]", V.OK, "A"),
    ("<think>x</think>" + FULL, V.OK, "A"),
    # a verdict inside the plan section does not count
    ("[Start of Evaluation Plan] prefer [[A]] if shorter [End of Evaluation Plan] " + EXEC, V.NO_VERDICT, None),
    ("[Start of Evaluation Plan] prefer [[A]] if shorter [End of Evaluation Plan] " + EXEC + " [[B]]",
     V.MALFORMED, "B"),
    ("[Start of Evaluation Plan] end with [Final Verdict] [[A]] or [[B]] [End of Evaluation Plan] " + EXEC,
     V.NO_VERDICT, None),
    ("[Start of Evaluation Plan] pick [[B]] when", V.NO_VERDICT, None),  # cut off inside the plan
    ("[Start of Evaluation Plan] p [Final Verdict] [[B]]", V.MALFORMED, "B"),  # unclosed plan ends at the marker
    # both declared winners, repeated verdicts, case, CRLF
    (FULL.replace("[[A]]", "[[A]] [[B]]"), V.BOTH_VERDICTS, None),
    (FULL.replace("[[A]]", "[[A]]\r\n[[a]]"), V.OK, "A"),
    (FULL.replace("\n", "\r\n").upper().replace("THE PLAN", "p"), V.OK, "A"),
    ("[Final Verdict] [[C]]", V.NO_VERDICT, None),
    ("\u00e9\u4e2d [Final Verdict] [[B]]", V.MALFORMED, "B"),
]


@pytest.mark.parametrize("text,status,verdict", TABLE)
def test_edge_table(text, status, verdict):
    e = ep.parse_evaluation(text)
    assert (e.status, e.verdict) == (status, verdict), (text, e)


def test_strip_thinking_drops_unclosed_thinking():
    assert ep.strip_thinking("<think>a</think> out <think> more") == " out "
    assert ep.strip_thinking("ans <think>cut") == "ans "
    assert ep.strip_thinking("plain") == "plain"
    assert ep.parse_plan("<think>plan draft [[A]]") == ""


@pytest.mark.parametrize("fmt,output,status,verdict", [
    ("verdict_only", "[Final Verdict] [[A]]", "ok", "A"),  # was "malformed": it has no sections to miss
    ("verdict_only", "[[B]]", "malformed", "B"),
    ("verdict_only", "", "no_verdict", None),
    ("plan_execute", "[Final Verdict] [[A]]", "malformed", "A"),  # the execution is missing
    ("plan_execute", ep.format_execution_output("e", "B"), "ok", "B"),
    ("single_pass", FULL, "ok", "A"),
])
def test_parse_output_status_per_format(fmt, output, status, verdict):
    ch = parse_output(fmt, output, "p")
    assert (ch.status, ch.verdict) == (status, verdict)


N = 1_000_000


@pytest.mark.parametrize("text,status,verdict", [
    ("<think>" * (N // 7), V.NO_VERDICT, None),
    ("[" * N, V.NO_VERDICT, None),
    ("[Start of the " * (N // 14), V.NO_VERDICT, None),
    ("[[A" * (N // 3), V.NO_VERDICT, None),
    (FULL.replace("the execution", "x " * (N // 2)), V.OK, "A"),
    ("[Start of Evaluation Plan]" + "x " * (N // 2), V.NO_VERDICT, None),
])
def test_very_long_outputs(text, status, verdict):
    e = ep.parse_evaluation(text)
    assert (e.status, e.verdict) == (status, verdict)
