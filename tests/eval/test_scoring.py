"""Evaluation scoring: real benchmark rows through the rule path, pass@k / avg@k against hand
computations and brute force, the LLM-judge path against a grader on loopback with its fallback,
and the results file's resume bookkeeping."""
import itertools
import json

import numpy as np
import pytest

from reagent_jax.data import load_benchmark
from reagent_jax.endpoints import EndpointConfig
from reagent_jax.eval import passk
from reagent_jax.eval.llm_judge import LLMAnswerJudge
from reagent_jax.eval.report import benchmark_summary
from reagent_jax.eval.results import ResultStore
from reagent_jax.eval.scoring import AnswerScorer, ScoreItem
from tests.fake_openai_server import FakeOpenAIServer, grader_reply


def row(name, qid):
    return next(r for r in load_benchmark(name) if r["id"] == qid)


# (benchmark, id, a right response, a wrong response); answers come from the real files.
CASES = [
    ("gsm8k_full", "gsm8k/0", "She sells 16 - 3 - 4 = 9 eggs for $2 each: \\boxed{18}", "\\boxed{16}"),
    ("gsm8k_full", "gsm8k/0", "<think>9 eggs * $2</think>So the answer is \\boxed{\\$18.00}.", "\\boxed{9}"),
    ("aime24", "aime24/67", "The product is \\boxed{025}.", "\\boxed{24}"),
    ("aime25", "aime25/0", "Bases 21 and 49 sum to \\boxed{70}", "\\boxed{7}"),
    ("bamboogle", "bamboogle/0", "Citibank was founded in 1812, so \\boxed{James Madison}.",
     "\\boxed{Thomas Jefferson}"),
    ("hotpotqa", "hotpotqa/0", "The bid was presented by \\boxed{Frank Lowy}.", "\\boxed{Frank Sinatra Lowe}"),
    ("hotpotqa", "hotpotqa/1", "He is \\boxed{1.95 m} tall.", "\\boxed{2.05 m}"),
]


@pytest.mark.parametrize("bench,qid,right,wrong", CASES)
def test_rule_scoring_of_real_rows(bench, qid, right, wrong):
    r = row(bench, qid)
    scorer = AnswerScorer()
    good, bad = scorer.score_many([ScoreItem(r["question"], r["answer"], right, r["source"]),
                                   ScoreItem(r["question"], r["answer"], wrong, r["source"])])
    assert good.correct and good.rule_correct and good.score == 1.0 and good.method == "rule"
    assert not bad.correct and not bad.rule_correct and bad.score < 1.0


def test_partial_f1_scores_but_does_not_count_as_correct():
    r = row("hotpotqa", "hotpotqa/0")  # "Frank Lowy"
    s = AnswerScorer().score_many([ScoreItem(r["question"], r["answer"], "\\boxed{Lowy}", r["source"])])[0]
    assert 0.3 <= s.score < 1.0 and not s.correct
    lenient = AnswerScorer(correct_threshold=0.5).score_many([ScoreItem(r["question"], r["answer"], "\\boxed{Lowy}",
                                                                        r["source"])])[0]
    assert lenient.correct and lenient.score == s.score
    with pytest.raises(ValueError, match="correct_threshold"):
        AnswerScorer(correct_threshold=0.0)


def brute_pass_at_k(row_correct, k):
    """Fraction of all k-subsets of the samples that hold a correct one."""
    subsets = list(itertools.combinations(row_correct, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_against_hand_computation_and_brute_force():
    # n=5, c=2: pass@1 = 2/5; pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10; pass@3 = 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert passk.pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert passk.pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert passk.pass_at_k(5, 2, 3) == pytest.approx(0.9)
    assert passk.pass_at_k(5, 2, 4) == 1.0 and passk.pass_at_k(4, 0, 4) == 0.0 and passk.pass_at_k(3, 3, 1) == 1.0
    rng = np.random.default_rng(0)
    table = [list(rng.random(6) < p) for p in (0.0, 0.2, 0.5, 0.9, 1.0)]
    for k in range(1, 7):
        assert passk.mean_pass_at_k(table, k) == pytest.approx(np.mean([brute_pass_at_k(r, k) for r in table]))
    # avg@k by hand: (1/4 + 2/4) / 2; pass@2 by hand: ((1 - 3/6) + (1 - 1/6)) / 2
    two = [[True, False, False, False], [True, True, False, False]]
    assert passk.avg_at_k(two) == pytest.approx(0.375)
    assert passk.mean_pass_at_k(two, 2) == pytest.approx((0.5 + 5 / 6) / 2)
    assert passk.pass_curve(two)[1] == pytest.approx(0.375) and passk.pass_curve(two)[4] == 1.0
    for bad in ((3, 4, 1), (3, 1, 0), (3, 1, 4), (0, 0, 1)):
        with pytest.raises(ValueError):
            passk.pass_at_k(*bad)
    with pytest.raises(ValueError, match="needs >= 3 samples"):
        passk.mean_pass_at_k([[True, False]], 3)


def test_llm_judge_path_with_rule_fallback():
    bam = row("bamboogle", "bamboogle/0")  # "james madison"
    with FakeOpenAIServer(reply=grader_reply) as server:
        cfg = EndpointConfig(base_urls=(server.base_url,), model="grader", max_retries=0, timeout_s=5.0)
        scorer = AnswerScorer(LLMAnswerJudge(cfg))
        items = [
            ScoreItem(bam["question"], bam["answer"], "It was \\boxed{President James Madison}.", "bamboogle"),
            ScoreItem(bam["question"], bam["answer"], "\\boxed{John Adams}", "bamboogle"),
            ScoreItem(bam["question"] + " [unparseable]", bam["answer"], "\\boxed{James Madison}", "bamboogle"),
            ScoreItem(bam["question"] + " [down]", bam["answer"], "\\boxed{John Adams}", "bamboogle"),
        ]
        judged, wrong, garbled, down = scorer.score_many(items)
        assert server.count == 4
    # The judge accepts a wording the rule rejects (EM fails, F1 = 0.8 < 1).
    assert judged.correct and judged.method == "llm" and not judged.rule_correct
    assert judged.extracted == "President James Madison" and judged.judge["status"] == "ok"
    assert not wrong.correct and wrong.method == "llm"
    # Unreadable reply and failed request: the rule decides.
    assert garbled.correct and garbled.method == "rule_fallback" and garbled.judge["status"] == "missing_label"
    assert not down.correct and down.method == "rule_fallback" and down.judge["status"] == "endpoint_error"
    assert scorer.mode == "llm" and AnswerScorer().mode == "rule"


def test_results_store_resume_and_cut_off_line(tmp_path):
    path = tmp_path / "results.jsonl"
    store = ResultStore(path)
    sample = lambda c, refined=None: {"correct": c, "score": float(c), **({"refined": refined} if refined else {})}
    store.append({"benchmark": "b", "id": "q1", "samples": [sample(True), sample(False)]})
    store.append({"benchmark": "b", "id": "q2", "samples": [sample(False)]})
    with open(path, "a") as f:  # a crash in the middle of writing the third line
        f.write('{"benchmark": "b", "id": "q3", "samp')
    again = ResultStore(path)
    assert len(again) == 2 and open(path).read().endswith("}\n")
    assert again.done("b", "q1", k=2) and not again.done("b", "q2", k=2) and again.done("b", "q2", k=1)
    assert not again.done("b", "q3", k=1) and not again.done("other", "q1", k=1)
    assert not again.done("b", "q1", k=2, refine=True)
    again.append({"benchmark": "b", "id": "q2", "samples": [sample(True, sample(True)), sample(False, sample(True))]})
    third = ResultStore(path)
    assert third.done("b", "q2", k=2, refine=True) and len(third.records("b")) == 2
    summary = benchmark_summary(third.records("b"), k=2, refine=False)
    assert summary["questions"] == 2 and summary["avg@k"] == pytest.approx(0.5)
    assert summary["pass@k"] == pytest.approx(1.0)
    assert [json.loads(line)["id"] for line in open(path)] == ["q1", "q2", "q2"]


def test_a_judge_returning_too_few_grades_leaves_no_answer_unscored():
    """A custom judge that answers short: every answer still gets a score, from the rule."""
    bam = row("bamboogle", "bamboogle/0")

    class ShortJudge:
        def grade_many(self, items):
            return []

    items = [ScoreItem(bam["question"], bam["answer"], "\\boxed{James Madison}", "bamboogle"),
             ScoreItem(bam["question"], bam["answer"], "\\boxed{John Adams}", "bamboogle")]
    right, wrong = AnswerScorer(ShortJudge()).score_many(items)
    assert right.correct and right.method == "rule_fallback" and "0 grades for 2" in right.judge["reasoning"]
    assert not wrong.correct and wrong.method == "rule_fallback"
