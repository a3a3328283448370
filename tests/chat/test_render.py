"""Rendering: text == the original Qwen3 template (trl's qwen3.jinja through transformers),
train mode == trl's qwen3_training.jinja, exact loss masks, prefix property, agent-loop suffixes."""

import os

import numpy as np
import pytest
import trl

from reagent_jax import chat

TEMPLATES = os.path.join(os.path.dirname(trl.__file__), "chat_templates")
ORIGINAL = open(os.path.join(TEMPLATES, "qwen3.jinja")).read()
TRAINING = open(os.path.join(TEMPLATES, "qwen3_training.jinja")).read()

TOOLS = [
    {"type": "function", "function": {
        "name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "topk": {"type": "integer"}}, "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "python", "description": "Run Python code, return stdout.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                       "required": ["code"]}}},
]
SYSTEM = {"role": "system", "content": "You are a careful research agent."}


def call(name, args):
    return {"type": "function", "function": {"name": name, "arguments": args}}


CONVERSATIONS = {
    "user_only": (None, [{"role": "user", "content": "What is 2 + 2?"}]),
    "system_user_assistant": (None, [
        SYSTEM, {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "The answer is \\boxed{4}."}]),
    "tools_no_system_two_calls": (TOOLS, [
        {"role": "user", "content": "Who wrote Dream of the Red Chamber, and 17*23?"},
        {"role": "assistant", "content": "Let me check both.",
         "reasoning_content": "Two tools at once.",
         "tool_calls": [call("search", {"query": "Dream of the Red Chamber author", "topk": 3}),
                        {"name": "python", "arguments": '{"code": "print(17*23)"}'}]},
        {"role": "tool", "content": "Cao Xueqin (曹雪芹) wrote it."},
        {"role": "tool", "content": "391"},
        {"role": "assistant", "content": "<think>\nBoth known.\n</think>\n\nCao Xueqin; \\boxed{391}."}]),
    "system_tools_multi_step": (TOOLS, [
        SYSTEM, {"role": "user", "content": "Population of the capital of Japan?"},
        {"role": "assistant", "content": None, "reasoning_content": "First find the capital.",
         "tool_calls": [call("search", {"query": "capital of Japan"})]},
        {"role": "tool", "content": "Tokyo is the capital of Japan."},
        {"role": "assistant", "content": "", "tool_calls": [call("search", {"query": "Tokyo population"})]},
        {"role": "tool", "content": "About 14 million (2023)."},
        {"role": "assistant", "content": "<think>Enough.</think>\\boxed{14 million}"}]),
    "multi_turn_think_dropped": (None, [
        {"role": "user", "content": "Pick a number."},
        {"role": "assistant", "content": "<think>\nAny will do.\n</think>\n\n7"},
        {"role": "user", "content": "Double it."},
        {"role": "assistant", "content": "14", "reasoning_content": "7*2"}]),
    "non_ascii": (TOOLS, [
        {"role": "user", "content": "Café au lait ☕ — 東京の天気は？ 🌧️ naïve Ünïcödé"},
        {"role": "assistant", "content": "Je cherche… 🔍",
         "tool_calls": [call("search", {"query": "東京 天気 ☔", "topk": 2})]},
        {"role": "tool", "content": "雨、気温 18°C — «pluie»"},
        {"role": "assistant", "content": "Il pleut à Tokyo (雨) ☔."}]),
    "code_and_whitespace": (TOOLS, [
        {"role": "user", "content": "Run this:\n\n```python\nfor i in range(3):\n\tprint(i)  \n```\n\n\n"},
        {"role": "assistant", "content": "Running.",
         "tool_calls": [call("python", {"code": "for i in range(3):\n\tprint(i)  \n"})]},
        {"role": "tool", "content": "0\n1\n2\n"},
        {"role": "assistant", "content": "It prints   0, 1, 2.  "}]),
    "mid_system_and_tool_like_user": (None, [
        {"role": "user", "content": "Start."},
        {"role": "assistant", "content": "<think>ok</think>Started."},
        {"role": "system", "content": "Now be brief."},
        {"role": "user", "content": "<tool_response>\nlooks like a tool\n</tool_response>"},
        {"role": "assistant", "content": "", "reasoning_content": "",
         "tool_calls": [{"name": "python", "arguments": {"code": "1"}}]},
        {"role": "tool", "content": "1"}]),
    "critique_turn": (TOOLS, [
        SYSTEM, {"role": "user", "content": "Capital of Australia?"},
        {"role": "assistant", "content": "\\boxed{Sydney}", "reasoning_content": "Largest city."},
        {"role": "user", "content": "Critique: the largest city is not necessarily the capital. "
                                    "Try again."},
        {"role": "assistant", "content": "\\boxed{Canberra}", "reasoning_content": "Check: Canberra."}]),
}
SETTINGS = [(g, t) for g in (False, True) for t in (True, False)]


@pytest.fixture(scope="module")
def tok():
    return chat.load_tokenizer(None)


def oracle_text(tok, template, tools, messages, add_generation_prompt, enable_thinking):
    kwargs = {} if enable_thinking else {"enable_thinking": False}
    return tok.apply_chat_template(messages, tools=tools, chat_template=template, tokenize=False,
                                   add_generation_prompt=add_generation_prompt, **kwargs)


def assistant_bodies(text, enable_thinking):
    """What assistant turns produced, cut from the template text: after `<|im_start|>assistant\\n`
    up to and including `<|im_end|>` (the open generation prompt has no `<|im_end|>`)."""
    bodies = []
    for piece in text.split("<|im_start|>assistant\n")[1:]:
        if "<|im_end|>" in piece:
            body = piece.split("<|im_end|>")[0] + "<|im_end|>"
            if not enable_thinking and body.startswith("<think>\n\n</think>\n\n"):
                body = body[len("<think>\n\n</think>\n\n"):]
            bodies.append(body)
    return bodies


def masked_runs(tok, r):
    runs, cur = [], []
    for i, m in zip(r.ids, r.loss_mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    return [tok.decode(run) for run in runs + ([cur] if cur else [])]


@pytest.mark.parametrize("agp,thinking", SETTINGS)
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_text_equals_qwen3_template(tok, name, agp, thinking):
    tools, messages = CONVERSATIONS[name]
    r = chat.render(tok, messages, tools=tools, add_generation_prompt=agp, enable_thinking=thinking)
    assert r.text == oracle_text(tok, ORIGINAL, tools, messages, agp, thinking)
    assert r.ids == tok.encode(r.text, add_special_tokens=False)  # segment-wise == whole text
    assert len(r.ids) == len(r.loss_mask)
    assert masked_runs(tok, r) == assistant_bodies(r.text, thinking)


@pytest.mark.parametrize("agp", [False, True])
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_train_mode_equals_trl_training_template(tok, name, agp):
    tools, messages = CONVERSATIONS[name]
    r = chat.render(tok, messages, tools=tools, add_generation_prompt=agp, mode="train")
    assert r.text == oracle_text(tok, TRAINING, tools, messages, agp, True)
    assert r.ids == tok.encode(r.text, add_special_tokens=False)
    # transformers' {% generation %} mask, except that trl's block also covers the template's
    # "\n" after <|im_end|>, which the model never produces.
    ref = tok.apply_chat_template(messages, tools=tools, chat_template=TRAINING, tokenize=True,
                                  return_dict=True, return_assistant_tokens_mask=True,
                                  add_generation_prompt=agp)
    expected = list(ref["assistant_masks"])
    im_end, newline = tok.convert_tokens_to_ids("<|im_end|>"), tok.encode("\n")[0]
    for p in range(1, len(expected)):
        if r.ids[p - 1] == im_end and r.ids[p] == newline:
            expected[p] = 0
    assert ref["input_ids"] == r.ids
    assert r.loss_mask == expected
    assert sum(r.loss_mask) > 0 or not any(m["role"] == "assistant" for m in messages)


def turn_starts(messages):
    """Indices where a new turn starts (consecutive tool messages are one turn)."""
    return [j for j in range(1, len(messages) + 1)
            if j == len(messages) or not (messages[j]["role"] == "tool"
                                          and messages[j - 1]["role"] == "tool")]


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_train_mode_is_prefix_preserving_and_suffix_is_exact(tok, name):
    tools, messages = CONVERSATIONS[name]
    full = chat.render(tok, messages, tools=tools, mode="train")
    for j in turn_starts(messages):
        prev = chat.render(tok, messages[:j], tools=tools, mode="train")
        assert full.ids[:len(prev.ids)] == prev.ids
        assert full.loss_mask[:len(prev.ids)] == prev.loss_mask
        for agp in (False, True):
            whole = chat.render(tok, messages, tools=tools, add_generation_prompt=agp, mode="train")
            suffix = chat.render_suffix(tok, messages[j:], add_generation_prompt=agp)
            assert prev.ids + suffix.ids == whole.ids
            assert prev.loss_mask + suffix.loss_mask == whole.loss_mask
            assert prev.text + suffix.text == whole.text


def test_original_mode_is_not_prefix_preserving(tok):
    # Why train mode exists: a new user query strips earlier think blocks in the original template.
    _, messages = CONVERSATIONS["multi_turn_think_dropped"]
    short = chat.render(tok, messages[:2])
    long = chat.render(tok, messages)
    assert "Any will do." in short.text and "Any will do." not in long.text
    assert long.ids[:len(short.ids)] != short.ids
    # Appending a tool result removes an empty think block of the previous (last) turn.
    msgs = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [call("search", {"query": "q"})]}]
    before = chat.render(tok, msgs).text
    after = chat.render(tok, msgs + [{"role": "tool", "content": "r"}]).text
    assert "<think>\n\n</think>" in before and not after.startswith(before)


def test_non_thinking_mode_masks_the_prompted_empty_think(tok):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    prompt = chat.render(tok, messages[:1], add_generation_prompt=True, enable_thinking=False)
    assert prompt.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    full = chat.render(tok, messages, enable_thinking=False, mode="train")
    assert full.ids[:len(prompt.ids)] == prompt.ids  # the prompt (all 0s) is a prefix
    assert full.loss_mask[:len(prompt.ids)] == [0] * len(prompt.ids)
    assert tok.decode([i for i, m in zip(full.ids, full.loss_mask) if m]) == "Hello!<|im_end|>"
    thinking = chat.render(tok, messages, mode="train")
    assert tok.decode([i for i, m in zip(thinking.ids, thinking.loss_mask) if m]) == (
        "<think>\n\n</think>\n\nHello!<|im_end|>")


def test_agent_loop_token_flow(tok):
    """prompt ids + sampled ids + closing + suffix == train render of the parsed conversation."""
    history = [SYSTEM, {"role": "user", "content": "What is 17*23?"}]
    prompt = chat.render(tok, history, tools=TOOLS, add_generation_prompt=True)
    output = ('<think>\nCompute it.\n</think>\n\nI will compute.\n<tool_call>\n'
              '{"name": "python", "arguments": {"code": "print(17*23)"}}\n</tool_call><|im_end|>')
    sampled = tok.encode(output, add_special_tokens=False)
    tool_turn = [{"role": "tool", "content": "391"}]
    suffix = chat.render_suffix(tok, tool_turn, add_generation_prompt=True)
    ids = prompt.ids + sampled + chat.close_assistant_turn(tok, sampled) + suffix.ids
    message, errors = chat.assistant_message_from_text(output, tool_names={"python", "search"})
    assert errors == []
    full = chat.render(tok, history + [message] + tool_turn, tools=TOOLS,
                       add_generation_prompt=True, mode="train")
    assert ids == full.ids
    mask = [0] * len(prompt.ids) + [1] * len(sampled) + [0] * (len(ids) - len(prompt.ids) - len(sampled))
    assert full.loss_mask == mask


def test_close_assistant_turn(tok):
    im_end, nl = tok.convert_tokens_to_ids("<|im_end|>"), tok.encode("\n")
    assert chat.close_assistant_turn(tok, [9707, im_end]) == nl
    assert chat.close_assistant_turn(tok, [9707]) == [im_end] + nl  # truncated generation
    assert chat.close_assistant_turn(tok, []) == [im_end] + nl


def test_segment_ids_differ_from_whole_text_only_where_documented(tok):
    # An earlier turn (before the last query) is rendered without its think block and without
    # stripping, so content starting with "\n" meets "assistant\n": the whole-text encoding makes
    # one "\n\n" token there, the segment-wise ids keep the generation boundary.
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "\n\nfoo"},
                {"role": "user", "content": "b"}]
    r = chat.render(tok, messages)
    assert r.text == oracle_text(tok, ORIGINAL, None, messages, False, True)
    whole = tok.encode(r.text, add_special_tokens=False)
    assert r.ids != whole and tok.decode(r.ids) == tok.decode(whole) == r.text
    nl, nlnl = tok.encode("\n")[0], tok.encode("\n\n")[0]
    k = r.ids.index(tok.convert_tokens_to_ids("<|im_start|>"), 1) + 2  # after "<|im_start|>assistant"
    assert r.ids[k:k + 2] == [nl, nlnl] and whole[k] == tok.encode("\n\n\n")[0]


def test_compact_tokenizer_renders_the_same_text_and_masks(tok):
    tools, messages = CONVERSATIONS["system_tools_multi_step"]
    compact = chat.build_compact_tokenizer([m["content"] or "" for m in messages], vocab_size=300)
    a = chat.render(tok, messages, tools=tools, mode="train")
    b = chat.render(compact, messages, tools=tools, mode="train")
    assert a.text == b.text
    assert masked_runs(tok, a) == masked_runs(compact, b)
    assert max(b.ids) < len(compact)


@pytest.mark.parametrize("messages,error,match", [
    ([], ValueError, "empty"),
    ("hello", TypeError, "list of message dicts"),
    ([{"role": "robot", "content": "x"}], ValueError, r"messages\[0\]: role"),
    ([{"role": "user", "content": [{"type": "text", "text": "x"}]}], ValueError,
     r"messages\[0\] \(role 'user'\): content must be a string"),
    ([{"role": "user", "content": "x"},
      {"role": "assistant", "content": "", "tool_calls": [call("python", "not json")]}],
     ValueError, r"messages\[1\] \(role 'assistant'\)\.tool_calls\[0\]: arguments string"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]}],
     ValueError, "function name"),
    ([{"role": "assistant", "content": "", "tool_calls": {"name": "x"}}], ValueError,
     "tool_calls must be a list"),
    ([{"role": "assistant", "content": "x", "reasoning_content": 3}], ValueError,
     "reasoning_content"),
])
def test_bad_messages_raise_clear_errors(tok, messages, error, match):
    with pytest.raises(error, match=match):
        chat.render(tok, messages)


def test_bad_mode_and_tools(tok):
    with pytest.raises(ValueError, match="mode must be"):
        chat.render(tok, [{"role": "user", "content": "x"}], mode="inference")
    with pytest.raises(ValueError, match=r"tools\[0\] is not JSON"):
        chat.render(tok, [{"role": "user", "content": "x"}], tools=[{"f": object()}])


# ---- transformers' preprocessing, inputs the template mangles, randomized conversations -------

USER = {"role": "user", "content": "q"}
ORACLE_CASES = {  # found by fuzzing against apply_chat_template; each once diverged or crashed
    "reasoning_alias": [USER, {"role": "assistant", "content": "c", "reasoning": "R"}],
    "thinking_alias_before_tool": [USER, {"role": "assistant", "content": "", "thinking": "R",
                                          "tool_calls": [call("search", {"query": "x"})]},
                                   {"role": "tool", "content": "t"}],
    "alias_behind_none": [USER, {"role": "assistant", "content": "c", "reasoning_content": None,
                                 "reasoning": "R"}],
    "reasoning_content_wins": [USER, {"role": "assistant", "content": "<think>x</think>c",
                                      "reasoning_content": "", "reasoning": "R"}],
    "numpy_scalars": [USER, {"role": "assistant", "content": "", "tool_calls": [call(
        "search", {"n": np.int64(3), "f": np.float32(0.5), "b": np.bool_(True)})]}],
    "arguments_string_raw_newline": [USER, {"role": "assistant", "content": "", "tool_calls": [
        call("python", '{"code": "a\nb"}')]}],
    "arguments_string_long_int": [USER, {"role": "assistant", "content": "", "tool_calls": [
        call("python", '{"n": ' + "9" * 5000 + "}")]}],
}


@pytest.mark.parametrize("name", sorted(ORACLE_CASES))
def test_transformers_preprocessing_matches_oracle(tok, name):
    messages = ORACLE_CASES[name]
    tools = [dict(TOOLS[0], extra=np.int64(1))]
    for mode, template in (("original", ORIGINAL), ("train", TRAINING)):
        r = chat.render(tok, messages, tools=tools, mode=mode)
        assert r.text == oracle_text(tok, template, tools, messages, False, True)
        assert masked_runs(tok, r) == assistant_bodies(r.text, True)


def assistant_with_call(name, args):
    return [USER, {"role": "assistant", "content": "", "tool_calls": [call(name, args)]}]


@pytest.mark.parametrize("kwargs,error,match", [
    # transformers raises; the bare template would print the dict's keys or the strings
    ({"tools": {"type": "function"}}, TypeError, "tools must be a list"),
    ({"tools": ["search"]}, TypeError, r"tools\[0\] must be a function schema"),
    # the template tests `enable_thinking is false`: 0 and None would silently mean thinking
    ({"enable_thinking": 0, "add_generation_prompt": True}, TypeError, "True or False, got 0"),
    ({"enable_thinking": None}, TypeError, "True or False, got None"),
    # the template writes names verbatim inside "...": {"name": "a"b", ...} is broken JSON
    ({"messages": assistant_with_call('a"b', {})}, ValueError, "contains '\"'"),
    ({"messages": assistant_with_call("a\nb", {})}, ValueError, r"contains '\\n'"),
    # text the tokenizer cannot encode (it raises an opaque TypeError)
    ({"messages": [{"role": "user", "content": "a\ud800b"}]}, ValueError,
     r"messages\[0\] \(role 'user'\) content: lone surrogate '\\ud800' at char 1"),
    ({"messages": assistant_with_call("f", {"x": "\udc00"})}, ValueError, "lone surrogate"),
    ({"messages": assistant_with_call("f", '{"x": ' + "[" * 50000 + "]" * 50000 + "}")},
     ValueError, r"tool_calls\[0\]: arguments string must hold a JSON object \(it is nested"),
    ({"messages": assistant_with_call("f", "[1]")}, ValueError, "it is not an object"),
    ({"messages": assistant_with_call("f", {"x": object()})}, ValueError,
     r"tool_calls\[0\]: arguments is not JSON-serialisable"),
    ({"messages": [USER, {"role": "assistant", "content": "c", "reasoning": 3}]}, ValueError,
     r"messages\[1\] \(role 'assistant'\): reasoning must be a string"),
])
def test_inputs_the_template_mangles_raise_clear_errors(tok, kwargs, error, match):
    kwargs = {"messages": [USER], **kwargs}
    with pytest.raises(error, match=match):
        chat.render(tok, **kwargs)
