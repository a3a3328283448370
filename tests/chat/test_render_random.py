"""Randomized conversations against the original Qwen3 template (via transformers): text, exact
loss masks from the template's own assistant spans, and the train-mode prefix property."""

import json
import random

import pytest
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.utils.chat_template_utils import render_jinja_template

from reagent_jax import chat
from tests.chat.test_render import ORIGINAL, TRAINING, oracle_text, turn_starts

BYTES = {c: b for b, c in bytes_to_unicode().items()}  # byte-level alphabet -> byte


@pytest.fixture(scope="module")
def tok():
    return chat.load_tokenizer(None)


PIECES = ["hi", "Café ☕ 東京", "مرحبا", "👩\u200d👩\u200d👧", "\u202eRTL", "\x00\x07", " \n", "\n\n",
          "  ", "\r\n", "<tool_response>", "</tool_response>", "<|im_end|>", "<|im_start|>assistant\n",
          "<think>", "</think>", "<tool_call>", '{"name": "x"}', "{{ x }}", "\\boxed{4}", "x" * 30]


def random_text(rng, n=4):
    return "".join(rng.choice(PIECES) + rng.choice(["", " ", "\n"]) for _ in range(rng.randint(0, n)))


def random_schema(rng, depth=0):
    kind = rng.choice(["string", "object", "array"] if depth < 2 else ["string"])
    schema = {"type": kind, "description": random_text(rng, 2)}
    if kind == "object":
        schema["properties"] = {f"p{i}ü": random_schema(rng, depth + 1) for i in range(2)}
    elif kind == "array":
        schema["items"] = random_schema(rng, depth + 1)
    return schema


def random_call(rng):
    args = {f"a{i}": rng.choice([random_text(rng, 2), 1, 1e20, None, [True, {"k": "東"}]])
            for i in range(rng.randint(0, 3))}
    if rng.random() < 0.4:
        args = json.dumps(args, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 2]))
    fn = {"name": rng.choice(["search", "python", "名前"]), "arguments": args}
    return {"type": "function", "function": fn} if rng.random() < 0.7 else fn


def random_assistant(rng, calls):
    msg, content, k = {"role": "assistant"}, random_text(rng), rng.random()
    if k < 0.3:
        msg[rng.choice(["reasoning_content", "reasoning_content", "reasoning"])] = random_text(rng, 2)
    elif k < 0.6:
        content = rng.choice(["<think>", ""]) + random_text(rng, 2) + "</think>" + content
    msg["content"] = rng.choice([content, content, "", None] if calls else [content, ""])
    if calls:
        msg["tool_calls"] = [random_call(rng) for _ in range(rng.randint(1, 3))]
    return msg


def random_conversation(rng):
    messages = [{"role": "system", "content": random_text(rng, 2)}] if rng.random() < 0.5 else []
    for _ in range(rng.randint(1, 3)):
        text = random_text(rng)
        messages.append({"role": "user", "content": text if rng.random() < 0.9
                         else "<tool_response>" + text + "</tool_response>"})
        for _ in range(rng.randint(0, 3)):
            calls = rng.random() < 0.6
            messages.append(random_assistant(rng, calls))
            if not calls:
                break
            messages += [{"role": "tool", "content": rng.choice([random_text(rng), None])}
                         for _ in range(rng.randint(1, len(messages[-1]["tool_calls"])))]
    tools = None if rng.random() < 0.4 else [
        {"type": "function", "function": {"name": f"t{i}", "description": random_text(rng, 2),
                                          "parameters": random_schema(rng)}} for i in range(2)]
    return tools, messages


# The mask oracle: qwen3.jinja with {% generation %} from after "<|im_start|>assistant\n" through
# <|im_end|> (rendering it must still give the original text, checked in oracle_mask).
TAGGED = ORIGINAL.replace(
    "        {%- if loop.index0 > ns.last_query_index %}\n            {%- if loop.last or",
    "        {{- '<|im_start|>' + message.role + '\\n' }}\n        {%- generation %}\n"
    "        {%- if loop.index0 > ns.last_query_index %}\n            {%- if loop.last or").replace(
    "{{- '<|im_start|>' + message.role + '\\n<think>\\n' +", "{{- '<think>\\n' +").replace(
    "{{- '<|im_start|>' + message.role + '\\n' + content }}", "{{- content }}").replace(
    "        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}",
    "        {{- '<|im_end|>' }}\n        {%- endgeneration %}\n        {{- '\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}")


def oracle_mask(tok, template, messages, tools, r, agp, thinking, cut_newline=False):
    """1 on tokens inside the template's generation spans (minus a prompted empty think)."""
    plain = [{k: v for k, v in m.items() if v is not None} for m in messages]  # as transformers
    kwargs = {} if thinking else {"enable_thinking": False}
    (text,), (spans,) = render_jinja_template(
        conversations=[plain], tools=tools, chat_template=template, add_generation_prompt=agp,
        return_assistant_tokens_mask=True, **kwargs)
    assert text == r.text
    byte = lambda i: len(text[:i].encode())  # noqa: E731
    cuts = []
    for s, e in spans:
        if not thinking and text.startswith("<think>\n\n</think>\n\n", s):
            s += len("<think>\n\n</think>\n\n")
        cuts.append((byte(s), byte(e - (cut_newline and text[e - 1] == "\n"))))
    mask, pos = [], 0
    for token in tok.convert_ids_to_tokens(r.ids):
        n = len(token.encode() if token in tok.get_added_vocab() else bytes(map(BYTES.get, token)))
        assert not any(s < pos + n and pos < e and not s <= pos <= pos + n <= e for s, e in cuts)
        mask.append(int(any(s <= pos and pos + n <= e for s, e in cuts)))
        pos += n
    return mask


@pytest.mark.parametrize("seed", range(8))
def test_random_conversations_match_the_template(tok, seed):
    for k in range(25):
        rng = random.Random(1000 * seed + k)
        tools, messages = random_conversation(rng)
        agp, thinking = rng.random() < 0.5, rng.random() < 0.6
        r = chat.render(tok, messages, tools=tools, add_generation_prompt=agp, enable_thinking=thinking)
        assert r.text == oracle_text(tok, ORIGINAL, tools, messages, agp, thinking)
        assert r.loss_mask == oracle_mask(tok, TAGGED, messages, tools, r, agp, thinking)
        t = chat.render(tok, messages, tools=tools, add_generation_prompt=agp,
                        enable_thinking=thinking, mode="train")
        assert t.loss_mask == oracle_mask(tok, TRAINING, messages, tools, t, agp, thinking, True)
        for j in turn_starts(messages)[:-1]:
            prev = chat.render(tok, messages[:j], tools=tools, enable_thinking=thinking, mode="train")
            suffix = chat.render_suffix(tok, messages[j:], agp, enable_thinking=thinking)
            assert (prev.ids + suffix.ids, prev.loss_mask + suffix.loss_mask) == (t.ids, t.loss_mask)
