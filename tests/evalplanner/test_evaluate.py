"""EvalPlanner evaluation (RewardBench order protocol, position-consistent accuracy, categories) and
the judge used as a pairwise reward model, on hand-made records and scripted judges."""
import json

import pytest

from reagent_jax.evalplanner.evaluate import (category_table, evaluate_pairs, load_pairwise_set, random_orders,
                                              report_from_records)
from reagent_jax.evalplanner.judge import Chain
from reagent_jax.evalplanner.pairs import Triple
from reagent_jax.evalplanner.reward import PairwiseJudgeReward


def rec(pid, category, swapped, verdict):
    return {"id": pid, "category": category, "swapped": swapped, "verdict": verdict,
            "correct": "B" if swapped else "A"}


# p1: right in both orders; p2: right only as shown first; p3: no verdict, then right; p4: always "A" on a
# pair whose chosen response is... wrong in both orders.
RECORDS = [rec("p1", "chat", False, "A"), rec("p1", "chat", True, "B"),
           rec("p2", "chat", False, "A"), rec("p2", "chat", True, "A"),
           rec("p3", "math", False, None), rec("p3", "math", True, "B"),
           rec("p4", "math", False, "B"), rec("p4", "math", True, "A")]


def test_position_consistent_and_rewardbench_accuracy_on_a_hand_made_example():
    report = report_from_records(RECORDS, seed=7)
    assert report["all"]["position_consistent_accuracy"] == pytest.approx(1 / 4)
    assert report["categories"]["chat"]["position_consistent_accuracy"] == pytest.approx(1 / 2)
    assert report["categories"]["math"]["position_consistent_accuracy"] == 0.0
    # RewardBench: one order per pair, drawn with the seed; a missing verdict scores 0.5.
    orders = random_orders(["p1", "p2", "p3", "p4"], 7)
    per_order = {("p1", False): 1, ("p1", True): 1, ("p2", False): 1, ("p2", True): 0,
                 ("p3", False): 0.5, ("p3", True): 1, ("p4", False): 0, ("p4", True): 0}
    expected = sum(per_order[(p, s)] for p, s in orders.items()) / 4
    assert report["all"]["pairwise_accuracy"] == pytest.approx(expected)
    assert report["all"]["no_verdict"] == pytest.approx(1 / 8)
    assert report["all"]["picks_A"] == pytest.approx(4 / 7)  # of the 7 A/B verdicts (p3 once has none)
    assert report["all"]["n"] == 4 and report["categories"]["chat"]["n"] == 2
    table = category_table(report, "seed")
    assert "| seed" in table and "math" in table and "0.25" in table


def test_random_orders_are_seeded_and_balanced():
    ids = [f"x{i}" for i in range(2000)]
    a, b = random_orders(ids, 3), random_orders(ids, 3)
    assert a == b and random_orders(ids, 4) != a
    assert 0.45 < sum(a.values()) / len(ids) < 0.55


class FirstPositionJudge:
    """Always says A: the purest position bias."""

    def __init__(self):
        self.calls = 0

    def judge(self, items, seed=0, greedy=True):
        self.calls += len(items)
        return [Chain("", "[Final Verdict] [[A]]", "A", "ok") for _ in items]


class KeywordJudge:
    """Prefers the response containing "good" (a stand-in for a judge that reads)."""

    def judge(self, items, seed=0, greedy=True):
        out = []
        for it in items:
            a, b = "good" in it.response_a, "good" in it.response_b
            out.append(Chain("", "", "A" if a and not b else "B" if b and not a else None, "ok"))
        return out


def test_evaluate_pairs_exposes_position_bias():
    triples = [Triple(f"q{i}", f"instruction {i}", f"good answer {i}", f"poor answer {i}", "c") for i in range(40)]
    judge = FirstPositionJudge()
    report, records = evaluate_pairs(judge, triples, seed=1)
    assert judge.calls == 80 and len(records) == 80
    shown_first = sum(not s for s in random_orders([t.id for t in triples], 1).values()) / 40
    assert report["all"]["pairwise_accuracy"] == pytest.approx(shown_first)
    assert report["all"]["position_consistent_accuracy"] == 0.0 and report["all"]["picks_A"] == 1.0
    report, _ = evaluate_pairs(KeywordJudge(), triples, seed=1)
    assert report["all"]["pairwise_accuracy"] == 1.0 and report["all"]["position_consistent_accuracy"] == 1.0
    report, records = evaluate_pairs(FirstPositionJudge(), triples, seed=1, both_orders=False)
    assert len(records) == 40 and report["all"]["position_consistent_accuracy"] is None


def test_load_pairwise_set_documented_schema(tmp_path):
    rows = [{"id": "rb-1", "instruction": "2+2?", "chosen": "4", "rejected": "5", "category": "math"},
            {"id": "rb-2", "instruction": "Greet.", "chosen": "Hello!", "rejected": "Go away."},
            {"id": "rb-3", "instruction": "", "chosen": "a", "rejected": "b"}]  # empty instruction: skipped
    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    triples = load_pairwise_set(str(path))
    assert [(t.id, t.category) for t in triples] == [("rb-1", "math"), ("rb-2", "default")]
    report, _ = evaluate_pairs(KeywordJudge(), triples)
    assert set(report["categories"]) == {"math", "default"}


def test_reward_round_robin_win_rates():
    rm = PairwiseJudgeReward(KeywordJudge(), mode="round_robin")
    scores = rm.score_group("q", ["good one", "bad one", "good two"])
    # good one: beats "bad one", ties "good two" (no single verdict) -> (1 + 0.5) / 2
    assert scores == pytest.approx([0.75, 0.0, 0.75])
    # chat trajectories are rendered like the Agent-RRM sees them.
    traj = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a good answer"}]
    bad = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "nope"}]
    assert rm.score_group("q", [traj, bad]) == pytest.approx([1.0, 0.0])


def test_reward_both_orders_cancel_position_bias_and_reference_mode():
    judge = FirstPositionJudge()
    scores = PairwiseJudgeReward(judge).score_group("q", ["x", "y", "z"])
    assert scores == pytest.approx([0.5, 0.5, 0.5]) and judge.calls == 6
    judge = FirstPositionJudge()
    assert PairwiseJudgeReward(judge).score_group("q", ["same", "same"]) == [0.5, 0.5] and judge.calls == 0
    rm = PairwiseJudgeReward(KeywordJudge(), mode="reference")
    assert rm.score_group("q", ["good", "bad"], reference="good reference") == pytest.approx([0.5, 0.0])
    with pytest.raises(ValueError, match="reference"):
        rm.score_group("q", ["good", "bad"])
    groups = rm.score_groups([("q1", ["bad", "good"], "ref"), ("q2", [], "ref")])
    assert groups == [pytest.approx([0.5, 1.0]), []]  # "bad" vs "ref": neither reads good -> tie


def test_pairwise_rrm_scores_each_question_group_for_reagent_r():
    """PairwiseRRM: the Agent-RRM interface over a pairwise judge; items sharing a question form a
    group (interleaved is fine), a group's scores equal PairwiseJudgeReward's, and an item with no
    verdict at all is a counted failure, not a silent tie."""
    from reagent_jax.evalplanner.reward import PairwiseRRM
    from reagent_jax.rrm.base import Judge, JudgeFailure, JudgeRequest
    from reagent_jax.rrm.parser import JudgementStatus

    def traj(text):
        return [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}]

    rm = PairwiseRRM(PairwiseJudgeReward(KeywordJudge()))
    assert isinstance(rm, Judge)
    items = [JudgeRequest("q1", traj("a good answer")), JudgeRequest("q2", traj("nope")),
             JudgeRequest("q1", traj("wrong")), JudgeRequest("q2", traj("good")), JudgeRequest("q3", traj("alone"))]
    out = rm.judge_many(items)
    expected = PairwiseJudgeReward(KeywordJudge()).score_groups(
        [("q1", [traj("a good answer"), traj("wrong")], None), ("q2", [traj("nope"), traj("good")], None)])
    assert [j.score for j in out[:4]] == pytest.approx([expected[0][0], expected[1][0], expected[0][1], expected[1][1]])
    assert [j.score for j in out[:4]] == pytest.approx([1.0, 0.0, 0.0, 1.0])
    assert out[4].score == 0.5 and out[4].status == JudgementStatus.OK  # nothing to compare a lone answer with
    assert all(j.critique == "" for j in out)

    judge = PairwiseRRM(PairwiseJudgeReward(KeywordJudge()))
    mixed = judge.judge_many([JudgeRequest("q", traj("x")), JudgeRequest("q", traj("y")),
                              JudgeRequest("q", traj("a good one"))])
    assert [j.score for j in mixed] == pytest.approx([0.25, 0.25, 1.0]) and all(j.ok for j in mixed)
    undecided = judge.judge_many([JudgeRequest("q", traj("x")), JudgeRequest("q", traj("y"))])  # no verdict at all
    assert [(j.status, j.score) for j in undecided] == [(JudgeFailure.NO_REPLY, 0.5)] * 2
    assert judge.stats.total == 5 and judge.stats.fraction(JudgeFailure.NO_REPLY.value) == 2 / 5
    same = judge.judge_many([JudgeRequest("q", traj("x")), JudgeRequest("q", traj("x"))])  # a tie, never asked
    assert [(j.status, j.score) for j in same] == [(JudgementStatus.OK, 0.5)] * 2
    with pytest.raises(ValueError, match="judge item 0"):
        rm.judge_many([("", traj("x"))])
