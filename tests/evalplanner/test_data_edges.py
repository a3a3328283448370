"""EvalPlanner data edges against plain-Python references: pair construction per group shape, the
A/B mapping of swapped orders (exhaustive), never-identical pairs, unique ids, seeding, the accuracy metrics, the pairwise
reward, prompts and triples with unusual text, and the pipeline's split files."""
import collections
import importlib.util
import itertools
import json
import os
import random

import pytest

from reagent_jax.pipelines import evalplanner as pipeline
from reagent_jax.evalplanner import prompts as P
from reagent_jax.evalplanner.evaluate import evaluate_pairs, random_orders, report_from_records
from reagent_jax.evalplanner.judge import Chain, PairItem
from reagent_jax.evalplanner.pairs import (LabelledChain, Triple, build_preference_data, correct_verdict,
                                           load_triples, read_jsonl, sample_chains, write_jsonl)
from reagent_jax.evalplanner.reward import PairwiseJudgeReward

VERDICTS = ("A", "B", None)


def chain(tid, plan, swapped, k, verdict, output=None):
    output = output if output is not None else f"{tid}/{plan}/{swapped}/{k} [[{verdict}]]"
    return LabelledChain(tid, plan, swapped, k, f"plan {plan}", output, verdict, "ok",
                         verdict == correct_verdict(swapped))


# ---- pairs per group shape -------------------------------------------------------------------------
GROUPS = {  # verdicts of one (plan, order) group, chosen shown first (correct "A")
    "all_correct": ["A", "A", "A"],
    "all_wrong": ["B", "B", "B"],
    "ties": [None, None],
    "ties_and_right": [None, "A", None],
    "one_chain_right": ["A"],
    "one_chain_wrong": ["B"],
    "mixed": ["A", "B", "A", None, "B"],
}


@pytest.mark.parametrize("pairing", ["one_to_one", "all"])
@pytest.mark.parametrize("shape", sorted(GROUPS))
@pytest.mark.parametrize("swapped", [False, True])
def test_pairs_per_group_shape_match_a_plain_reference(shape, pairing, swapped):
    flip = {"A": "B", "B": "A", None: None}  # the same judgements, with the chosen response shown second
    verdicts = [flip[v] if swapped else v for v in GROUPS[shape]]
    t = Triple("t", "instr", "good", "bad")
    chains = [chain("t", 0, swapped, k, v) for k, v in enumerate(verdicts)]
    data = build_preference_data([t], chains, pairing=pairing, seed=3)
    c = sum(v == correct_verdict(swapped) for v in verdicts)
    w = len(verdicts) - c
    assert len(data.pairs) == (min(c, w) if pairing == "one_to_one" else c * w)
    assert data.kept_ids == (["t"] if c else []) and data.dropped_ids == ([] if c else ["t"])
    assert len(data.sft) == (1 if c else 0)
    for p in data.pairs:
        assert p["chosen"] != p["rejected"]
        assert p["chosen_verdict"] == correct_verdict(swapped) and p["rejected_verdict"] != correct_verdict(swapped)
        assert (p["response_a"], p["response_b"]) == (("bad", "good") if swapped else ("good", "bad"))


def test_chosen_and_rejected_are_never_the_same_text_and_duplicate_triples_are_refused():
    t = Triple("t", "instr", "good", "bad")
    # equal texts with disagreeing labels (e.g. an edited chains file): never a pair, but counted
    chains = [chain("t", 0, False, 0, "A", "X [[A]]"), chain("t", 0, False, 1, "B", "X [[A]]"),
              chain("t", 0, False, 2, "B", "Y [[B]]")]
    for pairing, want in (("all", [("X [[A]]", "Y [[B]]")]), ("one_to_one", None)):
        data = build_preference_data([t], chains, pairing=pairing, seed=0)
        got = [(p["chosen"], p["rejected"]) for p in data.pairs]
        assert all(a != b for a, b in got)
        assert data.stats["identical_pairs"] + len(got) == (2 if pairing == "all" else 1)
        if want is not None:
            assert got == want and data.stats["identical_pairs"] == 1
    with pytest.raises(ValueError, match="duplicate pair ids"):
        build_preference_data([t, t], chains)  # would double the instruction's pairs and SFT rows


def random_chains(triples, rng, plans=2, execs=4):
    out = []
    for t in triples:
        for p, s, k in itertools.product(range(plans), (False, True), range(execs)):
            out.append(chain(t.id, p, s, k, rng.choice(VERDICTS), output=f"{t.id}/{p}/{s}/{rng.randint(0, 2)}"))
    return out


def test_pair_data_is_a_pure_function_of_chains_and_seed_and_balances_orders():
    rng = random.Random(0)
    triples = [Triple(f"t{i}", f"instruction {i}", f"good {i}", f"bad {i}") for i in range(30)]
    chains = random_chains(triples, rng)
    for pairing in ("one_to_one", "all"):
        a = build_preference_data(triples, chains, pairing=pairing, seed=5)
        b = build_preference_data(list(triples), list(chains), pairing=pairing, seed=5)
        assert (a.pairs, a.sft, a.stats) == (b.pairs, b.sft, b.stats)
        assert all(p["chosen"] != p["rejected"] for p in a.pairs)
        # reference: every (correct, incorrect) combination of a (triple, plan, order) group with
        # different texts ("all"); one_to_one uses each chain at most once
        want = collections.Counter()
        for key, group in itertools.groupby(chains, key=lambda c: (c.triple_id, c.plan_index, c.swapped)):
            group = list(group)
            want.update(key + (g.output, r.output) for g in group for r in group
                        if g.correct and not r.correct and g.output != r.output)
        got = collections.Counter((q["triple_id"], q["plan_index"], q["swapped"], q["chosen"], q["rejected"])
                                  for q in a.pairs)
        if pairing == "all":
            assert got == want
        else:
            assert not got - want
            used = collections.Counter()
            for q in a.pairs:
                used[(q["triple_id"], q["plan_index"], q["swapped"], "good", q["chosen"])] += 1
                used[(q["triple_id"], q["plan_index"], q["swapped"], "bad", q["rejected"])] += 1
            have = collections.Counter((c.triple_id, c.plan_index, c.swapped, "good" if c.correct else "bad", c.output)
                                       for c in chains)
            assert not used - have  # no chain used twice
    # SFT alternates the order where a kept instruction allows it
    sft = build_preference_data(triples, chains, seed=5).sft
    for k, row in enumerate(sft):
        options = {c.swapped for c in chains if c.triple_id == row["triple_id"] and c.correct}
        assert row["swapped"] == (k % 2 == 1) or options == {row["swapped"]}


# ---- A/B mapping, exhaustively ----------------------------------------------------------------------
class TableSource:
    """Chain source whose verdict depends on which text is shown as A: table[(A text, B text)]."""

    def __init__(self, table):
        self.table = table

    def plans(self, items, n, seed=0):
        return [["plan"] * n for _ in items]

    def executions(self, requests, n, seed=0):
        return [[Chain(plan, "out", self.table[(it.response_a, it.response_b)], "ok")] * n for it, plan in requests]

    def judge(self, items, seed=0, greedy=True):
        return [Chain("", "out", self.table[(it.response_a, it.response_b)], "ok") for it in items]


def preferred(item, verdict):
    """The text the judge preferred, read off the shown order (the oracle for every mapping)."""
    return {"A": item.response_a, "B": item.response_b}.get(verdict)


@pytest.mark.parametrize("v_first,v_second", list(itertools.product(VERDICTS, VERDICTS)))
def test_swapped_verdicts_map_back_to_the_right_response(v_first, v_second):
    t = Triple("t", "instr", "GOOD", "BAD")
    table = {("GOOD", "BAD"): v_first, ("BAD", "GOOD"): v_second}
    src = TableSource(table)
    chains = sample_chains([t], src, num_plans=1, num_executions=1)
    for c in chains:
        item = t.item(c.swapped)
        assert (item.response_a, item.response_b) == (("BAD", "GOOD") if c.swapped else ("GOOD", "BAD"))
        assert c.correct == (preferred(item, c.verdict) == "GOOD")
    report, records = evaluate_pairs(src, [t], seed=0)
    per_order = {r["swapped"]: r for r in records}
    score = {s: (1.0 if preferred(t.item(s), per_order[s]["verdict"]) == "GOOD"
                 else 0.5 if per_order[s]["verdict"] is None else 0.0) for s in (False, True)}
    assert report["all"]["pairwise_accuracy"] == score[random_orders(["t"], 0)["t"]]
    assert report["all"]["position_consistent_accuracy"] == float(score[False] == score[True] == 1.0)
    # the pairwise reward: x's win rate over both orders, from the preferred text
    rm = PairwiseJudgeReward(TableSource(table), mode="round_robin")
    wins = [1.0 if preferred(it, table[(it.response_a, it.response_b)]) == "GOOD"
            else 0.5 if table[(it.response_a, it.response_b)] is None else 0.0
            for it in (PairItem("q", "GOOD", "BAD"), PairItem("q", "BAD", "GOOD"))]
    assert rm.score_group("q", ["GOOD", "BAD"]) == pytest.approx([sum(wins) / 2, 1 - sum(wins) / 2])


def test_a_judge_that_returns_fewer_judgements_is_an_error_not_a_tie():
    class Short(TableSource):
        def judge(self, items, seed=0, greedy=True):
            return [Chain("", "", "A", "ok") for _ in items][:-1]

    triples = [Triple(f"t{i}", "i", f"g{i}", f"b{i}") for i in range(3)]
    with pytest.raises(ValueError, match="returned 5 judgements for 6"):
        evaluate_pairs(Short({}), triples)
    with pytest.raises(ValueError, match="returned 5 judgements for 6"):
        PairwiseJudgeReward(Short({})).score_group("q", ["x", "y", "z"])
    with pytest.raises(ValueError, match="duplicate pair ids"):
        evaluate_pairs(TableSource({}), [triples[0], triples[0]])


# ---- metrics against a plain-Python reference -----------------------------------------------------------
def test_report_matches_a_plain_python_reference():
    rng = random.Random(1)
    ids = [f"p{i}" for i in range(60)]
    cats = {i: rng.choice(["chat", "math", "code"]) for i in ids}
    records = [{"id": i, "category": cats[i], "swapped": s, "verdict": rng.choice(VERDICTS),
                "correct": "B" if s else "A"} for i in ids for s in (False, True)]
    rng.shuffle(records)
    report = report_from_records(records, seed=9)
    orders = random_orders(list(dict.fromkeys(r["id"] for r in records)), 9)

    def reference(rs):
        by = {(r["id"], r["swapped"]): r["verdict"] for r in rs}
        pids = sorted({r["id"] for r in rs})
        right = lambda pid, s: by[(pid, s)] == ("B" if s else "A")
        pair = [1.0 if right(p, orders[p]) else 0.5 if by[(p, orders[p])] is None else 0.0 for p in pids]
        vs = [r["verdict"] for r in rs]
        return {"n": len(pids), "pairwise_accuracy": sum(pair) / len(pids),
                "position_consistent_accuracy": sum(right(p, False) and right(p, True) for p in pids) / len(pids),
                "no_verdict": vs.count(None) / len(vs),
                "picks_A": vs.count("A") / (len(vs) - vs.count(None)) if len(vs) > vs.count(None) else None}

    assert report["all"] == pytest.approx(reference(records))
    for c in ("chat", "math", "code"):
        assert report["categories"][c] == pytest.approx(reference([r for r in records if r["category"] == c]))


# ---- prompts and triples with unusual text ------------------------------------------------------------------
@pytest.mark.parametrize("instruction", ["", "   ", "\n\t"])
def test_empty_instruction_is_refused_by_every_prompt(instruction):
    for build in (lambda: P.plan_messages(instruction), lambda: P.judge_messages(instruction, "a", "b"),
                  lambda: P.execution_messages(instruction, "a", "b", "plan"),
                  lambda: P.verdict_only_messages(instruction, "a", "b")):
        with pytest.raises(ValueError, match="instruction"):
            build()


def test_non_ascii_and_braces_survive_prompts_and_files(tmp_path):
    instruction, a, b = "Übersetze {x} ins 日本語 🙂", "Antwort {0} — ja", "回答 }{"
    for msgs in (P.plan_messages(instruction), P.judge_messages(instruction, a, b),
                 P.execution_messages(instruction, a, b, "Plan: {y} prüfen")):
        user = msgs[1]["content"]
        assert instruction in user
        if "Response A" in user:
            assert f"[Start of Response A]\n{a}\n[End of Response A]" in user and b in user
    t = Triple("ü-1", instruction, a, b, "sprache", {"note": "é"})
    path = write_jsonl(str(tmp_path / "t.jsonl"), [t.to_json()])
    assert Triple.from_json(read_jsonl(path)[0]) == t
    rows = [{"id": "ü-1", "instruction": instruction, "chosen": a, "rejected": b}]
    (tmp_path / "set.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    (loaded,) = load_triples(str(tmp_path / "set.jsonl"))
    assert (loaded.id, loaded.instruction, loaded.chosen, loaded.rejected) == ("ü-1", instruction, a, b)


def test_synthetic_triples_edge_cases():
    from reagent_jax import worlds
    from reagent_jax.worlds.pairwise import SyntheticTeacher, synthetic_triples

    world = worlds.make_world(seed=0, n_entities=12, n_questions=30)
    assert synthetic_triples(world, []) == []
    level1 = [q for q in world.train if q.level == 1]
    assert level1 and synthetic_triples(world, level1, flaws=["wrong_arithmetic"]) == []  # no flaw applies
    with pytest.raises(ValueError, match="unknown flaws"):
        synthetic_triples(world, level1, flaws=["typo"])
    triples = synthetic_triples(world, list(world.train)[:12], seed=2)
    assert all(t.chosen != t.rejected and t.instruction.strip() for t in triples)
    with pytest.raises(ValueError, match="not one"):
        SyntheticTeacher(world, [Triple("x", "Übersetze das", "a", "b")])


# ---- pipeline split files -----------------------------------------------------------------------------
def quickstart_config():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location("ep_qs", os.path.join(root, "configs", "evalplanner_quickstart.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config()


def jsonl_config(tmp_path, n_train):
    rows = [{"id": f"r{i}", "instruction": f"Frage {i}?", "chosen": f"gut {i}", "rejected": f"schlecht {i}"}
            for i in range(n_train)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r | {"id": f"e{r['id']}"}) + "\n" for r in rows[:2]))
    c = quickstart_config()
    c.data.update(dict(source="jsonl", train_paths=str(tmp_path / "train.jsonl"),
                       eval_paths=str(tmp_path / "eval.jsonl"), num_per_round=3, num_eval=2))
    c.dpo.rounds = 2
    return c


def test_too_few_train_triples_for_the_rounds_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="has 3"):
        pipeline.load_splits(jsonl_config(tmp_path, 3), str(tmp_path / "run"), None)  # round 2 would be empty
    splits = pipeline.load_splits(jsonl_config(tmp_path, 4), str(tmp_path / "run"), None)
    assert [len(splits[k]) for k in ("round1", "round2", "eval")] == [3, 1, 2]


def test_a_crash_while_writing_splits_does_not_leave_a_half_set(tmp_path, monkeypatch):
    config, workdir = jsonl_config(tmp_path, 6), str(tmp_path / "run")
    real, calls = pipeline.write_jsonl, []

    def crash_on_second(path, rows):
        calls.append(os.path.basename(path))
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process dies between two split files
        return real(path, rows)

    monkeypatch.setattr(pipeline, "write_jsonl", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        pipeline.load_splits(config, workdir, None)
    monkeypatch.setattr(pipeline, "write_jsonl", real)
    splits = pipeline.load_splits(config, workdir, None)  # the rerun
    assert sorted(splits) == ["eval", "round1", "round2"]
    assert [t.id for t in splits["round2"]] == ["r3", "r4", "r5"]
