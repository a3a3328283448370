"""Synthetic quickstart world: determinism, splits, corpus, expert and flawed trajectories."""

import contextlib
import io
import json
import re

import pytest

from reagent_jax import worlds
from reagent_jax.worlds import synthetic


@pytest.fixture(scope="module")
def world():
    return worlds.make_world(worlds.WorldConfig(seed=3, n_entities=40, n_questions=160))


def _exec_stdout(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})  # plain exec: the oracle for the expert's python code
    return out.getvalue().strip()


def test_same_seed_same_world_different_seed_different_world():
    a = worlds.make_world(seed=7, n_entities=30, n_questions=80)
    b = worlds.make_world(seed=7, n_entities=30, n_questions=80)
    c = worlds.make_world(seed=8, n_entities=30, n_questions=80)
    assert a.corpus() == b.corpus() and a.questions == b.questions
    assert worlds.world_texts(a) == worlds.world_texts(b)
    assert a.corpus() != c.corpus()
    assert [q.question for q in a.questions] != [q.question for q in c.questions]


def test_sizes_and_disjoint_split(world):
    assert len(world.entities) == 40 and len(world.corpus()) == 40
    assert len(world.questions) == 160
    assert len(world.heldout) == 32 and len(world.train) == 128
    train_q = {q.question for q in world.train}
    held_q = {q.question for q in world.heldout}
    assert not train_q & held_q, "held-out questions must not appear in train"
    assert len(train_q) == 128 and len(held_q) == 32, "questions are unique"
    train_entities = {t.entity for q in world.train for t in q.terms}
    held_entities = {t.entity for q in world.heldout for t in q.terms}
    assert train_entities & held_entities, "held-out may (and here does) reuse entities"
    assert len({q.id for q in world.questions}) == len(world.questions)


def test_questions_need_lookups_and_answers_match_corpus(world):
    levels = {q.level for q in world.questions}
    assert levels == {1, 2, 3}
    for q in world.questions:
        assert len(q.terms) == q.level and len(q.ops) == q.level - 1
        values = []
        for t in q.terms:
            e = world.entity(t.entity)
            assert e.value(t.attribute) == t.value
            assert synthetic.fact_sentence(e.name, t.attribute, t.value) in world.search(t.query)[0]["contents"]
            assert t.entity in q.question and t.attribute in q.question
            values.append(t.value)
        assert q.answer == str(eval(q.expression()))  # Python precedence agrees with left-to-right
        assert q.answer == str(synthetic.apply_ops(values, q.ops))
        assert abs(int(q.answer)) < 10_000, "numbers stay short"
        if q.level > 1:
            assert not re.search(rf"\b{re.escape(q.answer)}\b", q.question)
        rec = q.to_record()
        assert rec["data_source"] == "synthetic" and rec["answer"] == [q.answer]
        assert worlds.Question.from_record(json.loads(json.dumps(rec))) == q


def test_corpus_jsonl_round_trip(world, tmp_path):
    path = world.write_corpus_jsonl(tmp_path / "sub" / "corpus.jsonl")
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    assert rows == world.corpus()
    assert all(set(r) == {"id", "title", "contents"} for r in rows)
    assert len({r["id"] for r in rows}) == len(rows)


def test_search_ranks_named_entity_first(world):
    for e in world.entities[:10]:
        hits = world.search(f"age of {e.name}", topk=3)
        assert hits[0]["title"] == e.name and len(hits) == 3
    assert world.search("zzzz qqqq") == []
    with pytest.raises(ValueError, match="topk"):
        world.search("x", topk=0)


def test_expert_trajectories_answer_correctly_with_runnable_code(world):
    for q in world.questions:
        msgs = worlds.expert_trajectory(world, q, system_prompt="You are an agent.")
        assert msgs[0]["role"] == "system" and msgs[1] == {"role": "user", "content": q.question}
        final = msgs[-1]
        assert final["role"] == "assistant" and "tool_calls" not in final
        assert re.findall(r"\\boxed\{([^{}]*)\}", final["content"]) == [q.answer]
        calls = [c["function"] for m in msgs if m["role"] == "assistant" for c in m.get("tool_calls", [])]
        searches = [c for c in calls if c["name"] == "search"]
        codes = [c["arguments"]["code"] for c in calls if c["name"] == "python"]
        assert [c["arguments"]["query"] for c in searches] == [t.query for t in q.terms]
        assert all(c["arguments"]["topk"] == world.config.search_topk for c in searches)
        tool_msgs = [m for m in msgs if m["role"] == "tool"]
        assert len(tool_msgs) == len(calls)
        for t, m in zip(q.terms, tool_msgs):
            assert f"The {t.attribute} of {t.entity} is {t.value}." in m["content"]
        if q.level == 1:
            assert codes == []
        else:
            assert len(codes) == 1 and _exec_stdout(codes[0]) == q.answer
            assert tool_msgs[-1]["content"] == q.answer


def test_by_hand_expert_computes_correctly_in_text_without_python(world):
    for q in world.questions:
        msgs = worlds.expert_trajectory(world, q, by_hand=True)
        calls = [c["function"]["name"] for m in msgs if m["role"] == "assistant" for c in m.get("tool_calls", [])]
        assert calls == ["search"] * len(q.terms)  # same lookups, no python call
        assert re.findall(r"\\boxed\{([^{}]*)\}", msgs[-1]["content"]) == [q.answer]
        if q.level > 1:
            spoken = synthetic.expression([t.value for t in q.terms], q.ops, words=True)
            assert f"{spoken} is {q.answer}." in msgs[-1]["content"]
        else:  # nothing to compute: identical to the python expert
            assert msgs == worlds.expert_trajectory(world, q)


def test_search_formatter_is_pluggable(world):
    q = world.questions[0]
    tools = worlds.WorldTools(world, search_formatter=lambda query, docs: "|".join(d["id"] for d in docs))
    msgs = worlds.expert_trajectory(world, q, tools=tools)
    first_tool = next(m for m in msgs if m["role"] == "tool")
    assert re.fullmatch(r"syn-\d{4}(\|syn-\d{4})*", first_tool["content"])


def test_flawed_trajectories_carry_their_flaw(world):
    for q in world.questions[:40]:
        good = worlds.expert_trajectory(world, q)
        answer = re.findall(r"\\boxed\{([^{}]*)\}", good[-1]["content"])
        for flaw in worlds.applicable_flaws(q):
            bad = worlds.flawed_trajectory(world, q, flaw, seed=1)
            assert bad == worlds.flawed_trajectory(world, q, flaw, seed=1), "deterministic by seed"
            boxed = re.findall(r"\\boxed\{([^{}]*)\}", bad[-1]["content"])
            queries = [c["function"]["arguments"]["query"] for m in bad for c in m.get("tool_calls", [])
                       if c["function"]["name"] == "search"]
            if flaw == "no_boxed":
                assert boxed == [] and q.answer in bad[-1]["content"]
            elif flaw == "malformed_tool_call":
                assert boxed == answer
                broken = [m for m in bad if m["role"] == "assistant" and "<tool_call>" in m["content"]]
                assert len(broken) == 1 and "tool_calls" not in broken[0]
                raw = broken[0]["content"].split("<tool_call>")[1].split("</tool_call>")[0]
                with pytest.raises(json.JSONDecodeError):
                    json.loads(raw)
            else:
                assert boxed and boxed != [q.answer], f"{flaw} must lead to a wrong answer"
            if flaw == "skipped_lookup":
                assert len(queries) == len(q.terms) - 1
    q1 = next(q for q in world.questions if q.level == 1)
    with pytest.raises(ValueError, match="level >= 2"):
        worlds.flawed_trajectory(world, q1, "wrong_arithmetic")
    with pytest.raises(ValueError, match="unknown flaw"):
        worlds.flawed_trajectory(world, q1, "typo")


def test_labelled_trajectories_mix_and_determinism(world):
    a = worlds.labelled_trajectories(world, "heldout", flaw_fraction=0.5, seed=2)
    b = worlds.labelled_trajectories(world, "heldout", flaw_fraction=0.5, seed=2)
    assert [(x.question.id, x.flaw, x.messages) for x in a] == [(x.question.id, x.flaw, x.messages) for x in b]
    flaws = [x.flaw for x in a]
    assert flaws.count(None) == len(world.heldout)
    assert 0 < len(flaws) - flaws.count(None) < len(world.heldout)
    assert {x.question.split for x in a} == {"heldout"}


def test_all_texts_small_vocabulary(world):
    texts = worlds.world_texts(world)
    words = set(re.findall(r"[A-Za-z_]+", " ".join(texts)))
    names = {e.name for e in world.entities}
    assert names <= words
    assert len(words - names) < 80, sorted(words - names)
    assert all(q.question in texts for q in world.questions)


def test_bad_config_is_rejected_clearly():
    with pytest.raises(ValueError, match="n_entities"):
        worlds.make_world(n_entities=2)
    with pytest.raises(ValueError, match="heldout_fraction"):
        worlds.make_world(heldout_fraction=1.5)
    with pytest.raises(ValueError, match="distinct questions"):
        worlds.make_world(n_entities=3, n_questions=50, level_weights=(1.0, 0.0, 0.0))
    with pytest.raises(ValueError, match="not a synthetic-world question record"):
        worlds.Question.from_record({"id": "x", "question": "q"})
    for ops in ((), ("plus", "plus"), ("divide",)):
        with pytest.raises(ValueError, match="operators"):
            worlds.make_world(operators=ops)
    with pytest.raises(ValueError, match="level-3"):
        worlds.make_world(operators=("times",), level_weights=(0.3, 0.4, 0.3))


@pytest.mark.parametrize("operators", [("plus",), ("times",), ("minus", "times")])
def test_questions_use_only_the_allowed_operators(operators):
    """A world restricted to some operators (the quickstart's plus-only world) words and computes
    every question with them; times still only on small attributes."""
    w = worlds.make_world(seed=1, n_entities=20, n_questions=150, level_weights=(0.2, 0.8, 0.0), operators=operators)
    used = {op for q in w.questions for op in q.ops}
    assert used == set(operators)
    for q in w.questions:
        if q.level == 2:
            assert f" {q.ops[0]} " in q.question
            assert int(q.answer) == worlds.apply_ops([t.value for t in q.terms], q.ops)
        if "times" in q.ops:
            assert all(synthetic._small(t.attribute) for t in q.terms)



class _CountingRegistry:
    """A python tool that answers like the sandbox (or wrongly), counting its calls."""

    def __init__(self, wrong: bool = False):
        self.calls, self.wrong = 0, wrong

    def call(self, name, args):
        self.calls += 1
        text = worlds.run_python(args["code"]) + ("0" if self.wrong else "")
        return type("Result", (), {"text": text})()


def test_registry_tools_verify_python_then_take_the_fast_path():
    reg = _CountingRegistry()
    tools = worlds.RegistryTools(reg, verify_python=3)
    assert [tools.python(f"print({i} + 1)") for i in range(6)] == [str(i + 1) for i in range(6)]
    assert reg.calls == 3  # only the verified calls reached the tool
    always = _CountingRegistry()
    worlds.RegistryTools(always, verify_python=None).python("print(2)")
    worlds.RegistryTools(always, verify_python=None).python("print(3)")
    assert always.calls == 2
    with pytest.raises(RuntimeError, match="verify_python=None"):
        worlds.RegistryTools(_CountingRegistry(wrong=True)).python("print(1 + 1)")
