"""Any model's own chat template: ids == transformers' apply_chat_template, assistant masks,
the prefix property the agent loop relies on, the <tool_call> text convention, end-of-turn tokens.
Oracles: SmolLM2-135M-Instruct's own tokenizer + ChatML template, a Llama-3-style template, and a
template with native tool support (both on SmolLM2's vocabulary)."""

import copy

import pytest
from tokenizers import AddedToken

from reagent_jax import chat

TOOLS = [{"type": "function", "function": {
    "name": "python", "description": "Run Python code, return stdout.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}]

LLAMA3_STYLE = (
    "{{- bos_token }}{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")

NATIVE_TOOLS = (  # a small Hermes-style template that renders tools and tool_calls itself
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- if m.tool_calls %}{%- for c in m.tool_calls %}\n<tool_call>{{ c.function | tojson }}</tool_call>"
    "{%- endfor %}{%- endif %}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")

LLAMA31_TOOLS = (  # Llama 3.x's way: tools in the system turn, calls as bare {"name", "parameters"} JSON
    "{{- bos_token }}{%- if tools %}<|start_header_id|>system<|end_header_id|>\n\nTools: {{ tools | tojson }}"
    "<|eot_id|>{%- endif %}{%- for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{%- if m.tool_calls %}{%- for c in m.tool_calls %}"
    "{{- '{\"name\": \"' + c.function.name + '\", \"parameters\": ' + (c.function.arguments | tojson) + '}' }}"
    "{%- endfor %}{%- else %}{{ m.content }}{%- endif %}<|eot_id|>{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{%- endif %}")


def call(code):
    return {"type": "function", "function": {"name": "python", "arguments": {"code": code}}}


CONVERSATIONS = {
    "system_multi_turn": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"}],
    "default_system_prompt": [
        {"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": " 7 "},
        {"role": "user", "content": "Another one, in words?"}, {"role": "assistant", "content": "Eleven."}],
    "unicode_and_newlines": [
        {"role": "user", "content": "Écris « bonjour »\n\nen chinois"},
        {"role": "assistant", "content": "\n你好\n"}],
}


@pytest.fixture(scope="module")
def smol_tok(smollm2_dir):
    return chat.load_tokenizer(smollm2_dir)


def _variant(tok, template, extra_tokens=()):
    tok = copy.deepcopy(tok)
    if extra_tokens:
        tok.add_special_tokens({"additional_special_tokens": [AddedToken(t, special=True) for t in extra_tokens]})
    tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def llama3_tok(smol_tok):
    return _variant(smol_tok, LLAMA3_STYLE, ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"))


@pytest.fixture(scope="module")
def tools_tok(smol_tok):
    return _variant(smol_tok, NATIVE_TOOLS)


def _reference_ids(tok, messages, **kw):
    return list(tok.apply_chat_template(messages, tokenize=True, return_dict=False, **kw))


def _assistant_texts(tok, rendered):
    """The decoded runs of trainable tokens, one per assistant turn."""
    runs, cur = [], []
    for i, m in zip(rendered.ids, rendered.loss_mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    return runs + ([tok.decode(cur)] if cur else [])


def test_smollm2_takes_the_jinja_path_and_stops_at_im_end(smol_tok):
    assert not chat.uses_qwen3_template(smol_tok)
    assert chat.end_of_turn_token(smol_tok) == "<|im_end|>"
    assert chat.stop_token_ids(smol_tok) == (smol_tok.convert_tokens_to_ids("<|im_end|>"),)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("mode", ["original", "train"])
def test_smollm2_ids_equal_apply_chat_template_with_assistant_masks(smol_tok, name, mode):
    conv = CONVERSATIONS[name]
    r = chat.render(smol_tok, conv, mode=mode)
    assert r.ids == _reference_ids(smol_tok, conv)
    assert r.text == smol_tok.apply_chat_template(conv, tokenize=False)
    expected = [m["content"] + "<|im_end|>" for m in conv if m["role"] == "assistant"]
    assert _assistant_texts(smol_tok, r) == expected
    prompt = chat.render(smol_tok, conv[:2], add_generation_prompt=True)
    assert prompt.ids == _reference_ids(smol_tok, conv[:2], add_generation_prompt=True)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_appending_turns_keeps_earlier_ids_a_prefix(smol_tok, llama3_tok, name):
    conv = CONVERSATIONS[name]
    for tok in (smol_tok, llama3_tok):
        full = chat.render(tok, conv, mode="train")
        for k in range(1, len(conv)):
            head = chat.render(tok, conv[:k], mode="train")
            assert full.ids[:len(head.ids)] == head.ids
            assert full.loss_mask[:len(head.ids)] == head.loss_mask


def test_llama3_style_template_masks_up_to_eot(llama3_tok):
    conv = CONVERSATIONS["system_multi_turn"]
    r = chat.render(llama3_tok, conv, mode="train")
    assert r.ids == _reference_ids(llama3_tok, conv)
    assert chat.end_of_turn_token(llama3_tok) == "<|eot_id|>"
    eot = llama3_tok.convert_tokens_to_ids("<|eot_id|>")
    assert eot in chat.stop_token_ids(llama3_tok)
    assert _assistant_texts(llama3_tok, r) == ["Hello! How can I help?<|eot_id|>", "4<|eot_id|>"]
    assert chat.close_assistant_turn(llama3_tok, [5, eot]) == []  # nothing between turns
    assert chat.close_assistant_turn(llama3_tok, [5]) == [eot]  # a truncated turn is closed


def test_tool_text_convention_round_trips_through_the_parser(smol_tok):
    msgs = [{"role": "user", "content": "What is 17*23?"},
            {"role": "assistant", "content": "", "tool_calls": [call("print(17*23)")]},
            {"role": "tool", "content": "391"}, {"role": "tool", "content": "again 391"},
            {"role": "assistant", "content": "\\boxed{391}"}]
    r = chat.render(smol_tok, msgs, tools=TOOLS, mode="train")
    assert r.ids == smol_tok(r.text, add_special_tokens=False)["input_ids"]
    system = r.text.split("<|im_end|>")[0]
    assert '"name": "python"' in system and "<tool_call></tool_call>" in system
    assert "You are a helpful AI assistant named SmolLM" not in r.text  # the tools' system turn replaces it
    turns = _assistant_texts(smol_tok, r)
    assert turns == ['<tool_call>\n{"name": "python", "arguments": {"code": "print(17*23)"}}\n</tool_call><|im_end|>',
                     "\\boxed{391}<|im_end|>"]
    calls = chat.parse_tool_calls(turns[0])
    assert [(c.name, c.arguments) for c in calls] == [("python", {"code": "print(17*23)"})]
    assert "<|im_start|>user\n<tool_response>\n391\n</tool_response>\n<tool_response>\nagain 391\n" \
           "</tool_response><|im_end|>" in r.text  # a run of tool results is one user turn


def test_suffix_after_a_sampled_turn_equals_the_full_rendering(smol_tok, llama3_tok):
    prev = [{"role": "user", "content": "Compute 2**10."},
            {"role": "assistant", "content": "", "tool_calls": [call("print(2**10)")]}]
    new = [{"role": "tool", "content": "1024"}]
    for tok in (smol_tok, llama3_tok):
        full = chat.render(tok, prev + new, tools=TOOLS, add_generation_prompt=True, mode="train")
        head = chat.render(tok, prev, tools=TOOLS, mode="train")
        end = tok.convert_tokens_to_ids(chat.end_of_turn_token(tok))
        sampled_end = head.ids.index(end, len(head.ids) - 3) + 1  # the engine's tokens stop at the end token
        close = chat.close_assistant_turn(tok, head.ids[:sampled_end])
        assert head.ids[:sampled_end] + close == head.ids
        suffix = chat.render_suffix(tok, new, add_generation_prompt=True)
        assert head.ids + suffix.ids == full.ids
        assert head.loss_mask + suffix.loss_mask == full.loss_mask


def test_native_tool_template_gets_tools_and_calls_as_they_are(tools_tok):
    msgs = [{"role": "user", "content": "17*23?"},
            {"role": "assistant", "content": None, "tool_calls": [call("print(17*23)")]},
            {"role": "tool", "content": "391"}]
    r = chat.render(tools_tok, msgs, tools=TOOLS, add_generation_prompt=True, mode="train")
    reference = [dict(m, content=m["content"] or "") for m in msgs]
    assert r.ids == _reference_ids(tools_tok, reference, tools=TOOLS, add_generation_prompt=True)
    assert "<|im_start|>tool\n391" in r.text
    assert _assistant_texts(tools_tok, r) == [
        '\n<tool_call>{"name": "python", "arguments": {"code": "print(17*23)"}}</tool_call><|im_end|>']


def test_a_template_whose_calls_the_parser_cannot_read_gets_the_text_convention(smol_tok):
    """Llama 3.x templates take `tools` but write calls as bare JSON: rendering them natively would
    train the model on a format the agent loop never parses, so they get the text convention."""
    llama31 = _variant(smol_tok, LLAMA31_TOOLS, ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"))
    direct = llama31.apply_chat_template([{"role": "assistant", "content": "", "tool_calls": [call("1")]}],
                                         tools=TOOLS, tokenize=False)
    assert '"parameters": {"code": "1"}' in direct and "<tool_call>" not in direct  # the template's own format
    msgs = [{"role": "user", "content": "17*23?"},
            {"role": "assistant", "content": "", "tool_calls": [call("print(17*23)")]},
            {"role": "tool", "content": "391"}]
    r = chat.render(llama31, msgs, tools=TOOLS, add_generation_prompt=True, mode="train")
    assert "Tools: [" not in r.text and '"parameters": {"code"' not in r.text  # not the template's tools or calls
    (turn,) = _assistant_texts(llama31, r)
    assert turn.endswith("<|eot_id|>")
    assert [(c.name, c.arguments) for c in chat.parse_tool_calls(turn)] == [("python", {"code": "print(17*23)"})]
    assert chat.jinja_render.native_tool_calls(_variant(smol_tok, NATIVE_TOOLS))  # Hermes-style stays native


def test_a_template_that_rewrites_earlier_turns_is_refused_for_training(smol_tok):
    last_only = _variant(smol_tok, (  # shows only the last assistant turn's content
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
        "{%- if m.role != 'assistant' or loop.last %}{{ m.content }}{%- endif %}<|im_end|>\n{%- endfor %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"))
    conv = CONVERSATIONS["system_multi_turn"]
    with pytest.raises(ValueError, match="not prefix-preserving"):
        chat.render(last_only, conv, mode="train")
    r = chat.render(last_only, conv, mode="original")  # inference: the template's exact ids
    assert r.ids == _reference_ids(last_only, conv)


def test_a_template_without_an_end_token_is_named(smol_tok):
    plain = _variant(smol_tok, "{%- for m in messages %}{{ m.role }}: {{ m.content }}\n{%- endfor %}"
                               "{%- if add_generation_prompt %}assistant: {%- endif %}")
    with pytest.raises(ValueError, match="no special token"):
        chat.render(plain, CONVERSATIONS["system_multi_turn"], mode="train")


def test_load_tokenizer_takes_a_model_tokenizer_and_refuses_one_without_template(smollm2_dir, tmp_path):
    tok = chat.load_tokenizer(smollm2_dir)
    tok.chat_template = None
    tok.save_pretrained(tmp_path)
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(ValueError, match="no chat template"):
        chat.load_tokenizer(tmp_path)


# ---- per-turn loss control: "weight": 0 (the OpenAI fine-tuning convention) ----------------------

CRITIQUED = [  # a first attempt (weight 0), a critique, the retry: what Reagent-C SFT demonstrations look like
    {"role": "system", "content": "Use the tools."}, {"role": "user", "content": "What is 17*23?"},
    {"role": "assistant", "content": "Let me compute.", "tool_calls": [call("print(17+23)")], "weight": 0},
    {"role": "tool", "content": "40"},
    {"role": "assistant", "content": "The answer is \\boxed{40}.", "weight": 0},
    {"role": "user", "content": "A reviewer says: your code adds instead of multiplying. Try again."},
    {"role": "assistant", "content": "Let me multiply.", "tool_calls": [call("print(17*23)")], "weight": 1},
    {"role": "tool", "content": "391"},
    {"role": "assistant", "content": "The answer is \\boxed{391}."}]


@pytest.fixture(scope="module", params=["qwen3", "smollm2", "llama3", "native_tools"])
def any_tok(request, smol_tok, llama3_tok, tools_tok):
    return {"qwen3": chat.load_tokenizer(None), "smollm2": smol_tok, "llama3": llama3_tok,
            "native_tools": tools_tok}[request.param]


@pytest.mark.parametrize("mode", ["original", "train"])
def test_weight_zero_turns_render_the_same_text_and_are_out_of_every_loss(any_tok, mode):
    plain = [{k: v for k, v in m.items() if k != "weight"} for m in CRITIQUED]
    full, weighted = chat.render(any_tok, plain, mode=mode), chat.render(any_tok, CRITIQUED, mode=mode)
    assert weighted.ids == full.ids and weighted.text == full.text  # the model sees the same conversation
    assert full.context_mask == [1 - m for m in full.loss_mask]  # without weights: every other token
    trained = _assistant_texts(any_tok, weighted)
    assert trained == _assistant_texts(any_tok, full)[2:]  # the two weight-0 turns lost their mask, nothing else
    hidden = [i for i, (m, c) in enumerate(zip(weighted.loss_mask, weighted.context_mask)) if not (m or c)]
    assert not any(m and c for m, c in zip(weighted.loss_mask, weighted.context_mask))
    text = any_tok.decode([weighted.ids[i] for i in hidden])
    assert "17+23" in text and "\\boxed{40}" in text  # the first attempt is hidden ...
    assert "17*23)" not in text and "391" not in text and "reviewer" not in text  # ... and only it


def test_weight_zero_turns_stay_out_of_the_loss_through_render_suffix(any_tok):
    """The train-mode rendering is prefix-preserving with weights too (the agent loop's suffixes)."""
    whole = chat.render(any_tok, CRITIQUED, mode="train")
    head = chat.render(any_tok, CRITIQUED[:5], mode="train")
    assert whole.ids[:len(head.ids)] == head.ids
    assert whole.loss_mask[:len(head.ids)] == head.loss_mask == [0] * len(head.ids)
    assert whole.context_mask[:len(head.ids)] == head.context_mask


@pytest.mark.parametrize("weight,match", [(2, "weight must be 0"), (True, "weight must be 0"), ("0", "weight must be 0"),
                                          (0.5, "weight must be 0")])
def test_bad_weights_are_named(any_tok, weight, match):
    with pytest.raises(ValueError, match=match):
        chat.render(any_tok, [CRITIQUED[1], {"role": "assistant", "content": "x", "weight": weight}])


def test_weight_on_a_non_assistant_turn_is_refused(any_tok):
    with pytest.raises(ValueError, match=r"messages\[0\] \(role 'user'\): weight applies to assistant turns only"):
        chat.render(any_tok, [{**CRITIQUED[1], "weight": 0}])
