"""Row schemas: the documented examples validate, normalisation, and precise rejections."""
import json
import re

import pytest

from reagent_jax.data import schemas
from reagent_jax.data.schemas import (
    AGENT_RL,
    AGENT_SFT,
    BENCHMARK,
    EVALPLANNER_PAIR,
    RRM_RL,
    RRM_SFT,
    SCHEMAS,
    RowError,
    get_schema,
)


def documented_examples():
    """{schema constant name: example row} parsed from the module docstring (the README links it)."""
    pattern = re.compile(r"`(\w+)` \([^)]*\)::\n\n((?:    .*\n|\n(?=    ))+)")
    return {name: json.loads(block) for name, block in pattern.findall(schemas.__doc__)}


def test_every_schema_has_a_valid_documented_example():
    examples = documented_examples()
    assert set(examples) == {"BENCHMARK", "AGENT_RL", "AGENT_SFT", "RRM_SFT", "RRM_RL", "EVALPLANNER_PAIR"}
    for name, row in examples.items():
        schema = getattr(schemas, name)
        assert SCHEMAS[schema.name] is schema
        out = schema.validate(row)
        for key, value in row.items():  # already-normal rows pass through unchanged
            assert out[key] == value, (name, key)
    assert examples["AGENT_SFT"]["messages"][-1]["content"] == "\\boxed{Paris}"


def test_answers_normalised_and_extra_fields_kept():
    row = AGENT_RL.validate({"question": "2+3?", "answer": 5, "source": "gsm8k", "idx": 7})
    assert row == {"question": "2+3?", "answer": ["5"], "data_source": "gsm8k", "idx": 7}
    row = AGENT_RL.validate({"question": "q", "answer": ["a", "", "b"], "data_source": "hotpotqa"})
    assert row["answer"] == ["a", "b"]
    assert BENCHMARK.validate({"id": 3, "question": "q", "answer": "a", "source": "x"})["meta"] == {}


@pytest.mark.parametrize("row, message", [
    ({"answer": ["a"], "data_source": "s"}, "missing field 'question'"),
    ({"question": 123, "answer": ["a"], "data_source": "s"}, "field 'question' expected a string, got int"),
    ({"question": "  ", "answer": ["a"], "data_source": "s"}, "field 'question' is empty"),
    ({"question": "q", "answer": [], "data_source": "s"}, "field 'answer' has no non-empty answer"),
    ({"question": "q", "answer": [""], "data_source": "s"}, "field 'answer' has no non-empty answer"),
    ({"question": "q", "answer": ["a", {"x": 1}], "data_source": "s"}, "field 'answer' [1] expected a string"),
    ({"question": "q", "answer": True, "data_source": "s"}, "expected a string or list of strings, got bool"),
    ({"question": "q", "answer": "a"}, "missing field 'data_source'"),
    (["q", "a"], "expected a JSON object, got list"),
])
def test_agent_rl_rejections(row, message):
    with pytest.raises(RowError) as e:
        AGENT_RL.validate(row)
    assert message in str(e.value)


def test_messages_normalisation_and_errors():
    row = AGENT_SFT.validate({"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "python", "arguments": '{"code": "print(1)"}'}}]},
        {"role": "tool", "content": "1", "tool_call_id": "c1"},
        {"role": "assistant", "content": "\\boxed{1}", "reasoning_content": "easy"}]})
    call = row["messages"][1]
    assert call["content"] == "" and call["tool_calls"][0]["function"]["arguments"] == {"code": "print(1)"}
    assert row["messages"][2]["tool_call_id"] == "c1" and "tools" not in row
    bad = [
        ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant message"),
        ({"messages": []}, "non-empty list of messages"),
        ({"messages": [{"role": "bot", "content": "x"}]}, "[0] role must be one of"),
        ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": 3}]},
         "[1].content expected a string, got int"),
        ({"messages": [{"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "search", "arguments": "{not json"}}]}]}, "[0].tool_calls arguments are not valid JSON"),
        ({"messages": [{"role": "assistant", "content": "x"}], "tools": [{"function": "search"}]},
         "field 'tools' [0] expected a tool schema"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x", "weight": 0}]},
         "no assistant message to train on"),
        ({"messages": [{"role": "user", "content": "q", "weight": 0}, {"role": "assistant", "content": "x"}]},
         "[0].weight must be 0 or 1 on an assistant message"),
        ({"messages": [{"role": "assistant", "content": "x", "weight": 0.5}]}, "[0].weight must be 0 or 1"),
    ]
    kept = AGENT_SFT.validate({"messages": [{"role": "user", "content": "q"},
                                            {"role": "assistant", "content": "x", "weight": 0},
                                            {"role": "user", "content": "again"},
                                            {"role": "assistant", "content": "y", "weight": 1}]})
    assert [m.get("weight") for m in kept["messages"]] == [None, 0, None, 1]  # reaches the renderer
    for row, message in bad:
        with pytest.raises(RowError) as e:
            AGENT_SFT.validate(row)
        assert message in str(e.value), (message, str(e.value))


def test_rrm_scores_and_pairs():
    trajectory = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    row = RRM_RL.validate({"question": "q", "trajectory": trajectory, "label": True})
    assert row["target"] == 1.0 and "label" not in row
    assert RRM_RL.validate({"question": "q", "trajectory": trajectory, "outcome": 0})["target"] == 0.0
    for score, message in [(1.5, "got 1.5"), (float("nan"), "got nan"), ("0.5", "got str")]:
        with pytest.raises(RowError, match=re.escape(message)):
            RRM_SFT.validate({"question": "q", "trajectory": trajectory, "think": "t", "critique": "",
                              "score": score})
    ok = RRM_SFT.validate({"question": "q", "trajectory": trajectory, "think": "t", "critique": "", "score": 1})
    assert ok["score"] == 1.0 and isinstance(ok["score"], float)
    pair = EVALPLANNER_PAIR.validate({"instruction": "i", "chosen": "a", "rejected": "b", "id": 4})
    assert pair["id"] == "4" and "category" not in pair
    with pytest.raises(RowError, match="identical"):
        EVALPLANNER_PAIR.validate({"instruction": "i", "chosen": "a", "rejected": "a"})


def test_get_schema():
    assert get_schema("agent_rl") is AGENT_RL and get_schema(RRM_RL) is RRM_RL
    with pytest.raises(ValueError, match="unknown schema 'nope'"):
        get_schema("nope")
