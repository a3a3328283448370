"""Tool-call parsing: well-formed calls, a table of malformed ones with their error kinds,
content extraction, and round trips with the renderer's own tool-call text."""

import json

import pytest

from reagent_jax import chat
from reagent_jax.chat import tool_calls as tc

HINT = 'Write {"name": ..., "arguments": {...}} inside <tool_call></tool_call>'


@pytest.fixture(scope="module")
def compact_tok():
    return chat.build_compact_tokenizer(["search python browse"], vocab_size=300)


def assistant_body(tok, message):
    """What the assistant turn says, as the renderer writes it (text of its masked tokens)."""
    r = chat.render(tok, [{"role": "user", "content": "q"}, message], mode="train")
    return tok.decode([i for i, m in zip(r.ids, r.loss_mask) if m]).removesuffix("<|im_end|>")


def block(body):
    return f"<tool_call>\n{body}\n</tool_call>"


def test_several_well_formed_calls_with_offsets():
    text = ("I'll look both up.\n" + block('{"name": "search", "arguments": {"query": "東京", "topk": 2}}')
            + "\n" + block('{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}')
            + "\n" + "<tool_call>{\"arguments\":{},\"name\":\"browse\"}</tool_call>")
    calls = chat.parse_tool_calls(text)
    assert [(c.ok, c.name, c.arguments, c.index) for c in calls] == [
        (True, "search", {"query": "東京", "topk": 2}, 1),
        (True, "python", {"code": "print(1)"}, 2),  # arguments as a JSON string holding an object
        (True, "browse", {}, 3)]
    for c in calls:
        assert text[c.start:c.end] == c.raw and c.raw.startswith("<tool_call>")
        assert c.raw.endswith("</tool_call>")
    assert calls[0].as_message_tool_call() == {
        "type": "function", "function": {"name": "search", "arguments": {"query": "東京", "topk": 2}}}


def test_literal_newlines_inside_strings_are_accepted():
    text = block('{"name": "python", "arguments": {"code": "for i in range(2):\n    print(i)"}}')
    [c] = chat.parse_tool_calls(text)
    assert c.ok and c.arguments["code"] == "for i in range(2):\n    print(i)"


def test_no_calls():
    assert chat.parse_tool_calls("The answer is \\boxed{4}.") == []


MALFORMED = [
    ("empty", block("   "), [tc.EMPTY]),
    ("missing comma", block('{"name": "search" "arguments": {}}'), [tc.MALFORMED_JSON]),
    ("single quotes", block("{'name': 'search', 'arguments': {}}"), [tc.MALFORMED_JSON]),
    ("truncated json", block('{"name": "search", "arguments": {"query": "x"}'), [tc.MALFORMED_JSON]),
    ("two objects", block('{"name": "a", "arguments": {}} {"name": "b", "arguments": {}}'),
     [tc.MALFORMED_JSON]),
    ("list", block('[{"name": "search", "arguments": {}}]'), [tc.NOT_AN_OBJECT]),
    ("bare string", block('"search"'), [tc.NOT_AN_OBJECT]),
    ("no name", block('{"arguments": {"query": "x"}}'), [tc.MISSING_NAME]),
    ("numeric name", block('{"name": 3, "arguments": {}}'), [tc.INVALID_NAME]),
    ("blank name", block('{"name": " ", "arguments": {}}'), [tc.INVALID_NAME]),
    ("parameters", block('{"name": "search", "parameters": {"query": "x"}}'), [tc.UNKNOWN_FIELDS]),
    ("extra field", block('{"name": "search", "arguments": {}, "id": 1}'), [tc.UNKNOWN_FIELDS]),
    ("no arguments", block('{"name": "search"}'), [tc.MISSING_ARGUMENTS]),
    ("arguments list", block('{"name": "search", "arguments": ["x"]}'), [tc.ARGUMENTS_NOT_OBJECT]),
    ("arguments null", block('{"name": "search", "arguments": null}'), [tc.ARGUMENTS_NOT_OBJECT]),
    ("arguments bad string", block('{"name": "search", "arguments": "query=x"}'),
     [tc.ARGUMENTS_NOT_OBJECT]),
    ("arguments string of list", block('{"name": "search", "arguments": "[1]"}'),
     [tc.ARGUMENTS_NOT_OBJECT]),
    ("unclosed", '<tool_call>\n{"name": "search", "arguments": {}}', [tc.UNCLOSED_TAG]),
    ("unclosed then good", '<tool_call>{"name": "a"\n' + block('{"name": "b", "arguments": {}}'),
     [tc.UNCLOSED_TAG, None]),
    ("stray close", 'done</tool_call>', [tc.UNEXPECTED_CLOSE_TAG]),
    ("good, bad, good", block('{"name": "a", "arguments": {}}') + block('{"name": "b" "arguments": {}}')
     + block('{"name": "c", "arguments": {}}'), [None, tc.MALFORMED_JSON, None]),
    # Hostile input: these once raised RecursionError / ValueError or were silently accepted.
    ("deep nesting", block('{"name": "f", "arguments": {"x": ' + "[" * 100000 + "]" * 100000 + "}}"),
     [tc.MALFORMED_JSON]),
    ("deep unclosed", block("[" * 100000), [tc.MALFORMED_JSON]),
    ("deep in string arguments", block('{"name": "f", "arguments": "' + "[" * 50000 + '"}'),
     [tc.ARGUMENTS_NOT_OBJECT]),
    ("5000-digit int", block('{"name": "f", "arguments": {"x": ' + "9" * 5000 + "}}"),
     [tc.MALFORMED_JSON]),
    ("5000-digit int in string arguments",
     block('{"name": "f", "arguments": "{\\"x\\": ' + "9" * 5000 + '}"}'), [tc.ARGUMENTS_NOT_OBJECT]),
    ("NaN", block('{"name": "f", "arguments": {"x": NaN}}'), [tc.MALFORMED_JSON]),
    ("-Infinity", block('{"name": "f", "arguments": {"x": -Infinity}}'), [tc.MALFORMED_JSON]),
    ("duplicate name", block('{"name": "a", "name": "b", "arguments": {}}'), [tc.MALFORMED_JSON]),
    ("duplicate argument", block('{"name": "a", "arguments": {"x": 1, "x": 2}}'), [tc.MALFORMED_JSON]),
    ("name with quote", block('{"name": "a\\"b", "arguments": {}}'), [tc.INVALID_NAME]),
    ("name with newline", block('{"name": "a\\nb", "arguments": {}}'), [tc.INVALID_NAME]),
    ("padded name", block('{"name": " search", "arguments": {}}'), [tc.INVALID_NAME]),
    ("surrogate name", block('{"name": "\\ud800", "arguments": {}}'), [tc.INVALID_NAME]),
    ("surrogate argument", block('{"name": "f", "arguments": {"x": ["\\udc00"]}}'),
     [tc.INVALID_UNICODE]),
]


@pytest.mark.parametrize("label,text,kinds", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_calls_table(label, text, kinds):
    items = chat.parse_tool_calls(text)
    assert [None if it.ok else it.kind for it in items] == kinds
    for n, it in enumerate(items, 1):
        assert it.index == n and text[it.start:it.end] == it.raw
        if not it.ok:
            assert it.message.startswith(f"tool call {n}")
            assert isinstance(it, chat.ToolCallError)


def test_json_error_message_is_actionable():
    body = '{"name": "search" "arguments": {}}'
    text = block('{"name": "a", "arguments": {}}') + "\n" + block(body)
    _, err = chat.parse_tool_calls(text)
    try:
        json.loads(body)
    except json.JSONDecodeError as e:
        pos, msg = e.pos, e.msg
    assert err.message.startswith(f"tool call 2: invalid JSON at char {pos} (near ")
    assert f"): {msg}. {HINT}" in err.message


@pytest.mark.parametrize("body,expected", [
    ('{"name": "f", "arguments": {"x": NaN}}',
     "invalid JSON at char 33 (near '{\"x\": NaN}}'): NaN is not valid JSON; use a number"),
    ('{"name": "f", "arguments": {"x": ' + "9" * 5000 + "}}",
     "invalid JSON at char 33 (near '{\"x\": 999999999999'): a number with 5000 digits is too long"),
    ('{"name": "f", "arguments": {"x": 1, "x": 2}}', 'invalid JSON: duplicate key "x"'),
    ('{"name": "f", "arguments": ' + "[" * 100000 + "}", "invalid JSON: nested too deeply"),
    ('{"name": "a\\"b", "arguments": {}}', 'got "a\\"b", which contains \'"\''),
    ('{"name": "f", "arguments": {"k": [1, "\\udc00"]}}',
     "arguments[\"k\"][1] holds a lone surrogate '\\udc00' at char 0"),
])
def test_hostile_input_messages_say_what_and_where(body, expected):
    [e] = chat.parse_tool_calls(block(body))
    assert e.message.startswith("tool call 1") and expected in e.message
    e.message.encode("utf-8")  # the message goes back to the model: it must tokenize


@pytest.mark.parametrize("text", ["</tool_call>" * 100000, "<tool_call>" * 100000,
                                  "<tool_call>" * 50000 + "</tool_call>",
                                  "<tool_call></tool_call>" * 50000])
def test_many_tags_are_each_reported(text):
    # Tags are found in one pass: the old per-tag rescans took ~35 s here (not timed: no timed tests).
    items = chat.parse_tool_calls(text)
    assert len(items) in (50000, 100000) and items[-1].end <= len(text)


def test_messages_name_the_fix():
    [e] = chat.parse_tool_calls(block('{"name": "search", "parameters": {"query": "x"}}'))
    assert '"parameters"' in e.message and 'under "arguments"' in e.message
    [e] = chat.parse_tool_calls(block('{"name": "search"}'))
    assert 'missing "arguments"' in e.message and "{}" in e.message
    [e] = chat.parse_tool_calls("<tool_call>{}")
    assert "never closed" in e.message and "</tool_call>" in e.message


def test_unknown_tool_when_names_given():
    text = block('{"name": "serach", "arguments": {"query": "x"}}')
    assert chat.parse_tool_calls(text)[0].ok
    [e] = chat.parse_tool_calls(text, tool_names={"search", "python"})
    assert e.kind == tc.UNKNOWN_TOOL and "available tools: python, search" in e.message


def test_reasoning_is_not_searched():
    text = ("<think>\nMaybe <tool_call>{bad}</tool_call> like this?\n</think>\n\n"
            + block('{"name": "search", "arguments": {"query": "x"}}'))
    [c] = chat.parse_tool_calls(text)
    assert c.ok and text[c.start:c.end] == c.raw
    kinds = [it.ok for it in chat.parse_tool_calls(text, skip_reasoning=False)]
    assert kinds == [False, True]


def test_content_without_tool_calls():
    text = ("<think>\nplan\n</think>\n\nLet me search.\n"
            + block('{"name": "search", "arguments": {"query": "x"}}') + "\n"
            + block("not json") + "\nthen answer<|im_end|>")
    assert chat.content_without_tool_calls(text) == "Let me search.\n\n\nthen answer"
    assert chat.content_without_tool_calls("just text") == "just text"
    assert chat.split_reasoning(text)[0] == "plan"
    assert chat.split_reasoning("no think") == ("", "no think")


def test_assistant_message_from_text():
    text = ("<think>\nplan\n</think>\n\nLet me search.\n"
            + block('{"name": "search", "arguments": {"query": "x"}}')
            + block('{"name": "python"}') + "<|im_end|>")
    message, errors = chat.assistant_message_from_text(text)
    assert message == {"role": "assistant", "content": "Let me search.", "reasoning_content": "plan",
                       "tool_calls": [{"type": "function", "function": {
                           "name": "search", "arguments": {"query": "x"}}}]}
    assert [e.kind for e in errors] == [tc.MISSING_ARGUMENTS]
    assert text[errors[0].start:errors[0].end] == errors[0].raw


@pytest.mark.parametrize("content,calls", [
    ("", [{"name": "search", "arguments": {"query": "東京 ☔", "topk": 3}}]),
    ("Two calls:", [{"name": "python", "arguments": {"code": "print('a\\tb')\nx = {'k': [1, 2]}"}},
                    {"name": "browse", "arguments": {"url": "https://a.b/?q=1&r=2", "query": "x"}}]),
])
def test_parses_what_the_renderer_writes(compact_tok, content, calls):
    message = {"role": "assistant", "content": content, "reasoning_content": "why",
               "tool_calls": [{"type": "function", "function": c} for c in calls]}
    body = assistant_body(compact_tok, message)
    parsed = chat.parse_tool_calls(body)
    assert [(p.name, p.arguments) for p in parsed] == [(c["name"], c["arguments"]) for c in calls]
    again, errors = chat.assistant_message_from_text(body)
    assert errors == [] and again == message  # text -> message -> text is exact
    assert assistant_body(compact_tok, again) == body


def test_rejects_non_string():
    with pytest.raises(TypeError, match="must be a string"):
        chat.parse_tool_calls(None)
    with pytest.raises(TypeError, match="not a string"):
        chat.parse_tool_calls(block('{"name": "sea", "arguments": {}}'), tool_names="search")
