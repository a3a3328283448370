"""EvalPlanner preference data: pair construction on a scripted chain source (hand-computed counts),
the synthetic task and its scripted teacher, math / JSONL triples, training rows, and chain
sampling through the real rollout engine."""
import json

import jax
import pytest

from reagent_jax import chat, models, rollout, worlds
from reagent_jax.evalplanner import prompts as P
from reagent_jax.evalplanner.judge import EngineJudge, JudgeConfig, parse_output
from reagent_jax.pipelines.evalplanner import build_judge_tokenizer
from reagent_jax.evalplanner.pairs import (Triple, build_preference_data, chain_records, load_triples,
                                           math_triples, sample_chains)
from reagent_jax.worlds.pairwise import SyntheticTeacher, synthetic_triples
from reagent_jax.evalplanner.training import dpo_rows, sft_rows
from reagent_jax.rewards import score_answer

TRIPLES = [Triple(f"t{i}", f"instruction {i}", f"good {i}", f"bad {i}") for i in (1, 2, 3)]
# Verdicts per (triple, plan, chosen shown first?) for executions 0, 1, 2 (None: no verdict).
# Correct verdict: "A" when the chosen response is shown first, else "B".
SCRIPT = {
    ("t1", 0, True): ["B", "B", None], ("t1", 0, False): ["A", "A", "A"],     # never right -> dropped
    ("t1", 1, True): ["B", None, "B"], ("t1", 1, False): [None, "A", "A"],
    ("t2", 0, True): ["A", "B", None], ("t2", 0, False): ["B", "B", "A"],     # c/w = 1/2 and 2/1
    ("t2", 1, True): ["A", "A", "A"], ("t2", 1, False): ["A", "A", "A"],      # all right / all wrong
    ("t3", 0, True): ["B", "A", "B"], ("t3", 0, False): ["B", "A", "A"],      # 1/2 and 1/2
    ("t3", 1, True): ["A", "B", "A"], ("t3", 1, False): [None, None, "B"],    # 2/1 and 1/2
}
# one_to_one: min(c, w) per group; all: c * w.   t2: 1 + 1, t3: 1 + 1 + 1 + 1  |  t2: 2 + 2, t3: 2 + 2 + 2 + 2
EXPECTED_PAIRS = {"one_to_one": 6, "all": 12}


class ScriptedSource:
    """Deterministic chain source: plans "plan k of <instruction>", verdicts from SCRIPT."""

    def plans(self, items, n, seed=0):
        return [[f"plan {k} of {it.instruction}" for k in range(n)] for it in items]

    def executions(self, requests, n, seed=0):
        out = []
        for item, plan in requests:
            t = next(t for t in TRIPLES if t.instruction == item.instruction)
            k = int(plan.split()[1])
            verdicts = SCRIPT[(t.id, k, item.response_a == t.chosen)]
            texts = [f"{P.EXEC_START}\nchecked\n{P.EXEC_END}\n\n{P.FINAL_VERDICT} [[{v}]]" if v else "no idea"
                     for v in verdicts[:n]]
            out.append([parse_output("plan_execute", x, plan) for x in texts])
        return out


@pytest.mark.parametrize("pairing", ["one_to_one", "all"])
def test_pairs_share_plan_and_order_and_counts_match_hand_computed(pairing):
    chains = sample_chains(TRIPLES, ScriptedSource(), num_plans=2, num_executions=3, seed=0)
    assert len(chains) == 3 * 2 * 2 * 3
    assert sum(c.correct for c in chains) == 11  # t2: 1+2+3+0, t3: 1+1+2+1
    data = build_preference_data(TRIPLES, chains, pairing=pairing, seed=0)
    assert data.dropped_ids == ["t1"] and data.kept_ids == ["t2", "t3"]
    assert len(data.pairs) == EXPECTED_PAIRS[pairing]
    assert data.stats["pairs"] == EXPECTED_PAIRS[pairing] and data.stats["chains"] == 36
    per_group = {}
    for p in data.pairs:
        correct = "B" if p["swapped"] else "A"
        assert p["chosen_verdict"] == correct and p["rejected_verdict"] != correct
        assert p["plan"] == f"plan {p['plan_index']} of {p['instruction']}"  # one plan for both chains
        t = next(t for t in TRIPLES if t.id == p["triple_id"])
        shown = (t.rejected, t.chosen) if p["swapped"] else (t.chosen, t.rejected)
        assert (p["response_a"], p["response_b"]) == shown
        assert p["chosen"] != p["rejected"]
        per_group[(p["triple_id"], p["plan_index"], p["swapped"])] = per_group.get(
            (p["triple_id"], p["plan_index"], p["swapped"]), 0) + 1
    assert ("t2", 1, False) not in per_group and ("t2", 1, True) not in per_group  # all-right / all-wrong groups
    # SFT: exactly one correct chain per kept instruction.
    assert [s["triple_id"] for s in data.sft] == ["t2", "t3"]
    for k, s in enumerate(data.sft):
        assert s["verdict"] == ("B" if s["swapped"] else "A")
        assert s["swapped"] == (k % 2 == 1)  # orders alternate where a correct chain allows it
    again = build_preference_data(TRIPLES, chains, pairing=pairing, seed=0)
    assert again.pairs == data.pairs and again.sft == data.sft  # seeded


def test_pairing_rejects_unknown_mode():
    with pytest.raises(ValueError, match="pairing"):
        build_preference_data(TRIPLES, [], pairing="random")


@pytest.fixture(scope="module")
def world():
    return worlds.make_world(worlds.WorldConfig(seed=0, n_entities=20, n_questions=60, level_weights=(0.4, 0.4, 0.2)))


def test_synthetic_triples_chosen_is_right_and_teacher_is_exact_without_errors(world):
    triples = synthetic_triples(world, world.train[:30], seed=1)
    assert {t.category for t in triples} >= {"misread_value", "wrong_arithmetic"}
    for t in triples:
        q = world.question(t.meta["question_id"])
        assert score_answer(t.chosen, [q.answer], "synthetic") == 1.0
        assert t.chosen != t.rejected
        if t.category != "no_boxed":
            assert score_answer(t.rejected, [q.answer], "synthetic") < 1.0
        assert all(f"is {term.value}." in t.instruction for term in q.terms)
    perfect = SyntheticTeacher(world, triples, fmt="plan_execute", error_rate=0.0)
    chains = sample_chains(triples, perfect, num_plans=1, num_executions=2, seed=0)
    assert all(c.correct for c in chains)
    always_wrong = SyntheticTeacher(world, triples, fmt="single_pass", error_rate=1.0)
    chains = sample_chains(triples, always_wrong, num_plans=1, num_executions=2, seed=0)
    assert not any(c.correct for c in chains) and all(c.status == "ok" for c in chains)
    data = build_preference_data(triples, chains)
    assert data.kept_ids == [] and len(data.dropped_ids) == len(triples)


def test_trajectory_triples_render_whole_trajectories(world):
    triples = synthetic_triples(world, world.train[:5], seed=0, response_kind="trajectory")
    assert len(triples) == 5
    for t in triples:
        assert "Tool response (search)" in t.chosen and t.category in worlds.FLAWS
        assert t.instruction == world.question(t.meta["question_id"]).question


def test_training_rows_share_prompt_and_train_only_the_answer(world):
    tok = chat.build_compact_tokenizer([t.instruction for t in synthetic_triples(world, world.train[:10])] * 3,
                                       vocab_size=400)
    triples = synthetic_triples(world, world.train[:4], seed=0)
    teacher = SyntheticTeacher(world, triples, fmt="plan_execute", error_rate=0.5)
    chains = sample_chains(triples, teacher, num_plans=1, num_executions=4, seed=3)
    records = chain_records(triples, chains)
    rows = sft_rows(tok, records, "plan_execute")
    assert len(rows) == 2 * len(records)  # plan row + execution row per chain
    data = build_preference_data(triples, chains, seed=0)
    assert data.pairs
    pairs = dpo_rows(tok, data.pairs, "plan_execute")
    for rec, p in zip(data.pairs, pairs):
        c, r = p["chosen"], p["rejected"]
        start = c["loss_mask"].index(1)
        assert c["tokens"][:start] == r["tokens"][:start] and r["loss_mask"].index(1) == start
        assert tok.decode([t for t, m in zip(c["tokens"], c["loss_mask"]) if m]).startswith(rec["chosen"])


def test_math_triples_use_rule_rewards():
    problems = [{"id": "m1", "question": "What is 1 + 1?", "answer": ["2"], "source": "gsm8k"},
                {"id": "m2", "question": "What is 2 + 2?", "answer": "4"},
                {"id": "m3", "question": "What is 3 + 3?", "answer": "6"}]
    sols = {"What is 1 + 1?": ["So \\boxed{3}.", "It is \\boxed{2}."],
            "What is 2 + 2?": ["\\boxed{4}", "\\boxed{4.0}"],   # no incorrect one: skipped
            "What is 3 + 3?": ["\\boxed{5}", "\\boxed{7}"]}      # no correct one: skipped
    triples = math_triples(problems, lambda qs, n: [sols[q][:n] for q in qs], n=2)
    assert [(t.id, t.chosen, t.rejected, t.category) for t in triples] == [
        ("m1", "It is \\boxed{2}.", "So \\boxed{3}.", "math/gsm8k")]


def test_load_triples_skips_bad_rows_and_rejects_duplicate_ids(tmp_path):
    good = {"instruction": "Say hi.", "chosen": "Hi!", "rejected": "No.", "category": "chat", "id": "p1"}
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({"instruction": "x", "chosen": "same", "rejected": "same"})
                    + "\n" + "{broken\n")
    triples = load_triples(str(path))
    assert [(t.id, t.category) for t in triples] == [("p1", "chat")]
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(ValueError, match="duplicate pair ids"):
        load_triples(str(path))


def test_chains_sampled_through_the_engine_are_labelled_and_reproducible(world):
    """|P| x |E| x 2 orders through a real (random, tiny) judge on the rollout engine."""
    triples = synthetic_triples(world, world.train[:2], seed=0)
    tok = build_judge_tokenizer([x for t in triples for x in (t.instruction, t.chosen, t.rejected)], 1024)
    cfg = models.Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                             num_kv_heads=1, head_dim=16, tie_word_embeddings=True, compute_dtype="float32")
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    engine = rollout.Engine(cfg, params, num_slots=8, max_len=640, prefill_chunk=512, length_buckets=(512,),
                            row_buckets=(8,), window_buckets=(640,), decode_steps=8, tokenizer=tok)
    for fmt in ("plan_execute", "single_pass"):
        judge = EngineJudge(engine, tok, JudgeConfig(format=fmt, max_plan_tokens=6, max_execution_tokens=6))
        chains = sample_chains(triples, judge, num_plans=2, num_executions=2, seed=5)
        assert len(chains) == 2 * 2 * 2 * 2
        assert [(c.plan_index, c.swapped, c.exec_index) for c in chains[:8]] == [
            (p, s, e) for p in (0, 1) for s in (False, True) for e in (0, 1)]
        for c in chains:
            assert c.correct == (c.verdict == ("B" if c.swapped else "A"))
            assert c.status != "error"
            if fmt == "single_pass":
                assert c.output.startswith(P.PLAN_START + "\n" + c.plan)
        again = sample_chains(triples, judge, num_plans=2, num_executions=2, seed=5)
        assert [c.output for c in again] == [c.output for c in chains]
