"""The OpenAI-compatible server on loopback, driven by the official `openai` client and raw HTTP.

A tiny random Qwen3 with a compact tokenizer serves real generations (one engine, one kernel shape
for the file); a scripted engine serves fixed replies where a random model cannot produce the
text under test (tool calls). Oracles: the engine's own offline generation, `chat.render`, and
OpenAI's documented response shapes.
"""
import concurrent.futures
import json
import os
import time

import httpx
import jax
import openai
import pytest

from reagent_jax import chat, models
from reagent_jax.endpoints import Completion, EndpointError
from reagent_jax.rollout import Engine, SamplingParams
from reagent_jax.serve import (APIError, EngineChatClient, ModelService, ScriptedEngine, ServerLimits, ServerThread,
                               make_app, responses)

MAX_LEN, MAX_PROMPT = 1024, 1000
USER = [{"role": "user", "content": "What is the capital of France?"}]
TOOLS = [{"type": "function", "function": {"name": "search", "description": "Search the web.",
                                           "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                                                          "required": ["query"]}}}]


@pytest.fixture(scope="module")
def tok():
    texts = ["What is the capital of France? Paris is the capital.", "search the web for facts \\boxed{}"] * 3
    return chat.build_compact_tokenizer(texts, vocab_size=320)


@pytest.fixture(scope="module")
def live(tok):
    cfg = models.preset("tiny", compute_dtype="float32", vocab_size=320)
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    engine = Engine(cfg, params, num_slots=8, max_len=MAX_LEN, prefill_chunk=128, length_buckets=(128,),
                    row_buckets=(8,), window_buckets=(MAX_LEN,), decode_steps=8, tokenizer=tok)
    svc = ModelService(engine, tok, "tiny-agent", aliases=("tiny",),
                       limits=ServerLimits(max_tokens=64, max_prompt_tokens=MAX_PROMPT, max_n=4, max_concurrent=64))
    with ServerThread(make_app(svc)) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
        yield dict(engine=engine, svc=svc, server=server, client=client, tok=tok)
    engine.stop_background()


def post(server, path, body=None, content=None, **kw):
    return httpx.post(server.base_url + path, json=body, content=content, timeout=60, **kw)


def offline_greedy(live, messages, max_tokens, tools=None):
    ids = chat.render(live["tok"], messages, tools=tools, add_generation_prompt=True).ids
    out = live["engine"].generate([ids], SamplingParams(temperature=0.0, max_new_tokens=max_tokens,
                                                        stop_token_ids=live["svc"].eos_ids))[0]
    return ids, out


def test_models_and_a_chat_completion_equal_to_offline_generation(live):
    client = live["client"]
    assert [m.id for m in client.models.list().data] == ["tiny-agent", "tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    r = client.chat.completions.create(model="tiny-agent", messages=USER, max_tokens=24, temperature=0)
    ids, out = offline_greedy(live, USER, 24)
    text = live["tok"].decode(out.tokens, skip_special_tokens=True)
    expected = responses.parse_output(text, tools_enabled=False)
    assert r.choices[0].message.content == expected.content
    assert r.choices[0].finish_reason == ("length" if out.finish_reason == "length" else "stop")
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == len(out.tokens)
    assert r.object == "chat.completion" and r.model == "tiny-agent" and r.id.startswith("chatcmpl-")
    # n choices and seeds: a seed reproduces its choices, choices differ from each other
    a = client.chat.completions.create(model="tiny", messages=USER, max_tokens=16, temperature=1.0, n=2, seed=5,
                                       logprobs=True)
    b = client.chat.completions.create(model="tiny", messages=USER, max_tokens=16, temperature=1.0, n=2, seed=5)
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert [c.index for c in a.choices] == [0, 1] and a.choices[0].message.content != a.choices[1].message.content
    assert a.usage.completion_tokens == sum(len(c.logprobs.content) + (c.finish_reason == "stop") for c in a.choices)
    assert all(t.logprob <= 0 for t in a.choices[0].logprobs.content)


def test_top_logprobs_rank_the_alternatives_of_each_token(live):
    """OpenAI's top_logprobs: per generated token, the k most likely tokens from the same
    distribution (greedy: the chosen token first, with its own logprob); streamed, the final chunk
    carries the same list."""
    client = live["client"]
    kw = dict(model="tiny", messages=USER, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3)
    r = client.chat.completions.create(**kw)
    content = r.choices[0].logprobs.content
    assert content and all(len(t.top_logprobs) == 3 for t in content)
    for t in content:
        assert t.top_logprobs[0].token == t.token and abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4
        assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)
        assert all(a.bytes == list(a.token.encode("utf-8")) for a in t.top_logprobs)
    chunks = list(client.chat.completions.create(**kw, stream=True))
    streamed = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert len(streamed) == 1 and streamed[0].content == content


def test_streaming_adds_up_to_the_non_streamed_reply(live):
    client = live["client"]
    kw = dict(model="tiny", messages=USER, max_tokens=48, temperature=1.0, seed=11)
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    msg = full.choices[0].message
    assert content == (msg.content or "") and reasoning == (getattr(msg, "reasoning_content", None) or "")
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_completions_endpoint(live):
    client = live["client"]
    r = client.completions.create(model="tiny", prompt=[5, 6, 7, 8], max_tokens=20, extra_body={"ignore_eos": True},
                                  seed=3)
    assert r.usage.prompt_tokens == 4 and r.usage.completion_tokens == 20 and r.choices[0].finish_reason == "length"
    e = client.completions.create(model="tiny", prompt=["Paris is", "The web"], max_tokens=5, n=2, echo=True, seed=1)
    assert [c.index for c in e.choices] == [0, 1, 2, 3]
    assert e.choices[0].text.startswith("Paris is") and e.choices[3].text.startswith("The web")
    streamed = list(client.completions.create(model="tiny", prompt="Paris is", max_tokens=12, seed=9, stream=True))
    plain = client.completions.create(model="tiny", prompt="Paris is", max_tokens=12, seed=9)
    assert "".join(c.choices[0].text for c in streamed) == plain.choices[0].text


def test_tool_call_round_trip_with_the_openai_client(tok):
    replies = ['<think>\nI need to look this up.\n</think>\n\nLet me search.\n<tool_call>\n'
               '{"name": "search", "arguments": {"query": "capital of France"}}\n</tool_call>',
               "The capital is \\boxed{Paris}.",
               '<tool_call>\n{"name": "search", "arguments": {"query": "Paris"}}\n</tool_call>'
               '<tool_call>\n{"name": "search", "arguments": {"query": "France" </tool_call>']
    replies.append(replies[-1])
    engine = ScriptedEngine(tok, replies, max_len=1024)
    with ServerThread(make_app(ModelService(engine, tok, "scripted"))) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        r = client.chat.completions.create(model="scripted", messages=USER, tools=TOOLS)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me search."
        assert choice.message.reasoning_content == "I need to look this up."
        call = choice.message.tool_calls[0]
        assert call.type == "function" and call.function.name == "search" and call.id.startswith("call_")
        assert json.loads(call.function.arguments) == {"query": "capital of France"}
        # The client sends the call back with its result; the server renders both into the prompt.
        messages = USER + [choice.message.model_dump(exclude_none=True),
                           {"role": "tool", "tool_call_id": call.id, "content": "Paris is the capital of France."}]
        r2 = client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS)
        assert r2.choices[0].message.content == "The capital is \\boxed{Paris}." and r2.choices[0].finish_reason == "stop"
        prompt = tok.decode(engine.prompts[-1])
        assert '<tool_call>\n{"name": "search", "arguments": {"query": "capital of France"}}\n</tool_call>' in prompt
        assert "<tool_response>\nParis is the capital of France.\n</tool_response>" in prompt
        assert engine.prompts[-1] == chat.render(tok, [USER[0], {"role": "assistant", "content": "Let me search.",
                                                                  "reasoning_content": "I need to look this up.",
                                                                  "tool_calls": [{"type": "function", "function": {
                                                                      "name": "search", "arguments": {"query": "capital of France"}}}]},
                                                    {"role": "tool", "content": "Paris is the capital of France."}],
                                                 tools=TOOLS, add_generation_prompt=True).ids
        # Streamed: the well-formed call arrives whole in the final chunk; the malformed one stays text.
        chunks = list(client.chat.completions.create(model="scripted", messages=USER, tools=TOOLS, stream=True))
        calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        assert [(tc.index, tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == [
            (0, "search", {"query": "Paris"})]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        r3 = client.chat.completions.create(model="scripted", messages=USER, tools=TOOLS)  # the same reply
        assert text == r3.choices[0].message.content and text.startswith('<tool_call>\n{"name": "search", "arguments": {"query": "France"')
        assert [tc.function.name for tc in r3.choices[0].message.tool_calls] == ["search"]


def test_stop_strings_end_the_reply_before_them(tok):
    engine = ScriptedEngine(tok, ["The answer is 42. END of story", "plain"])
    with ServerThread(make_app(ModelService(engine, tok, "scripted"))) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        r = client.chat.completions.create(model="scripted", messages=USER, stop=["END", "never"])
        assert r.choices[0].message.content == "The answer is 42." and r.choices[0].finish_reason == "stop"
        c = client.completions.create(model="scripted", prompt="x", stop="ai", max_tokens=50)
        assert c.choices[0].text == "pl" and c.choices[0].finish_reason == "stop"


def test_real_model_serves_a_tool_conversation(live):
    messages = USER + [{"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "search", "arguments": '{"query": "capital of France"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Paris."}]
    r = live["client"].chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=8)
    rendered = chat.render(live["tok"], [USER[0], {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "search", "arguments": {"query": "capital of France"}}}]},
        {"role": "tool", "content": "Paris."}], tools=TOOLS, add_generation_prompt=True)
    assert r.usage.prompt_tokens == len(rendered.ids)


def test_32_concurrent_requests_are_all_answered(live):
    client, before = live["client"], live["engine"].stats().get("requests", 0)
    ask = lambda i: client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"Q{i}?"}],
                                                   max_tokens=32, temperature=1.0, seed=i)
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        out = list(pool.map(ask, range(32)))
    assert all(r.usage.completion_tokens >= 1 and r.choices[0].finish_reason in ("stop", "length") for r in out)
    assert live["engine"].stats()["requests"] - before == 32
    assert live["server"].app.state.inflight.peak > 4  # served together (peak > 8: they queued for slots)



def test_a_bf16_server_answers_4_concurrent_long_prompts_on_cpu(tok):
    """bf16 compute (the server's default dtype) on CPU: 4 concurrent ~400-token prompts were
    answered 500 (XLA:CPU had no bf16 x bf16 -> f32 batched product); each now gets its tokens."""
    cfg = models.preset("tiny", compute_dtype="bfloat16", vocab_size=320)
    engine = Engine(cfg, models.init_params(cfg, jax.random.PRNGKey(1)), num_slots=4, max_len=MAX_LEN,
                    prefill_chunk=256, length_buckets=(256,), window_buckets=(MAX_LEN,), decode_steps=4, tokenizer=tok)
    svc = ModelService(engine, tok, "tiny-bf16", limits=ServerLimits(max_tokens=8, max_prompt_tokens=MAX_PROMPT))
    question = "What is the capital of France? Search the web for facts. " * 40
    try:
        with ServerThread(make_app(svc)) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)
            ask = lambda i: client.chat.completions.create(
                model="tiny-bf16", messages=[{"role": "user", "content": f"{i}. {question}"}], max_tokens=8,
                temperature=0)
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                out = list(pool.map(ask, range(4)))
    finally:
        engine.stop_background()
    assert all(350 <= r.usage.prompt_tokens <= MAX_PROMPT for r in out), [r.usage.prompt_tokens for r in out]
    assert all(r.usage.completion_tokens >= 1 and r.choices[0].finish_reason in ("stop", "length") for r in out)

def error_of(resp, status):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


@pytest.mark.parametrize("patch,param", [
    ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"n": 0}, "n"), ({"n": 9}, "n"),
    ({"max_tokens": "ten"}, "max_tokens"), ({"max_tokens": 65}, "max_tokens"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"seed": 1.5}, "seed"), ({"stream": "yes"}, "stream"), ({"tool_choice": "required"}, "tool_choice"),
    ({"presence_penalty": 0.5}, "presence_penalty"), ({"logit_bias": {"5": 1}}, "logit_bias"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages"), ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    ({"tools": [{"type": "function"}]}, "tools"), ({"model": 7}, "model"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {
        "name": "f", "arguments": "{not json"}}]}]}, "messages"),
])
def test_bad_parameters_get_400(live, patch, param):
    err = error_of(post(live["server"], "/chat/completions", {"model": "tiny", "messages": USER, **patch}), 400)
    assert err["param"] == param and err["type"] == "invalid_request_error"


def test_malformed_requests_long_prompts_and_unknown_models(live):
    server = live["server"]
    assert "not valid JSON" in error_of(post(server, "/chat/completions", content=b'{"model": "tiny", "messages": ['), 400)["message"]
    error_of(post(server, "/chat/completions", content=b"[1, 2]"), 400)
    error_of(post(server, "/completions", {"model": "tiny", "prompt": [1, 99999]}), 400)
    length = lambda m: len(chat.render(live["tok"], m, add_generation_prompt=True).ids)
    long = [{"role": "user", "content": "capital of France " * 400}]
    assert length(long) > MAX_PROMPT
    err = error_of(post(server, "/chat/completions", {"model": "tiny", "messages": long}), 400)
    assert err["code"] == "context_length_exceeded" and str(MAX_PROMPT) in err["message"]
    # a prompt that fits, but not with 64 more tokens
    fits = next(m for m in ([{"role": "user", "content": "capital of France " * r}] for r in range(400, 0, -1))
                if length(m) <= MAX_PROMPT)
    n = length(fits)
    assert MAX_LEN - 64 < n <= MAX_PROMPT
    err = error_of(post(server, "/chat/completions", {"model": "tiny", "messages": fits, "max_tokens": 64}), 400)
    assert err["code"] == "context_length_exceeded" and err["param"] == "max_tokens"
    ok = post(server, "/chat/completions", {"model": "tiny", "messages": fits, "max_tokens": MAX_LEN - n})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= MAX_LEN - n
    err = error_of(post(server, "/chat/completions", {"model": "gpt-9", "messages": USER}), 404)
    assert err["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        live["client"].chat.completions.create(model="gpt-9", messages=USER)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        live["client"].chat.completions.create(model="tiny", messages=USER, temperature=5)
    error_of(httpx.get(server.base_url + "/nothing/here"), 404)
    error_of(httpx.get(server.base_url + "/chat/completions"), 405)
    # still serving
    assert live["client"].chat.completions.create(model="tiny", messages=USER, max_tokens=4).usage.completion_tokens >= 1


def test_auth_and_body_size_limit(tok):
    svc = ModelService(ScriptedEngine(tok, ["Hi."]), tok, "scripted", limits=ServerLimits(max_body_bytes=4000))
    with ServerThread(make_app(svc, api_key="sekret")) as server:
        error_of(post(server, "/chat/completions", {"messages": USER}), 401)
        error_of(post(server, "/chat/completions", {"messages": USER}, headers={"Authorization": "Bearer nope"}), 401)
        good = post(server, "/chat/completions", {"messages": USER}, headers={"Authorization": "Bearer sekret"})
        assert good.status_code == 200 and good.json()["choices"][0]["message"]["content"] == "Hi."
        big = {"messages": [{"role": "user", "content": "x" * 5000}]}
        error_of(post(server, "/chat/completions", big, headers={"Authorization": "Bearer sekret"}), 413)
        assert httpx.get(server.base_url.replace("/v1", "/health")).json()["status"] == "ok"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.base_url, api_key="wrong", max_retries=0).models.list()
        assert openai.OpenAI(base_url=server.base_url, api_key="sekret").models.list().data[0].id == "scripted"


def test_a_crash_in_one_request_leaves_the_server_running(live, monkeypatch):
    svc, client = live["svc"], live["client"]
    run, decode = svc.run, svc._decode

    def flaky_run(prep):
        if prep.prompts[0] == chat.render(live["tok"], [{"role": "user", "content": "boom"}], add_generation_prompt=True).ids:
            raise RuntimeError("kaboom")
        return run(prep)
    monkeypatch.setattr(svc, "run", flaky_run)
    err = error_of(post(live["server"], "/chat/completions", {"messages": [{"role": "user", "content": "boom"}]}), 500)
    assert err["type"] == "server_error" and "kaboom" in err["message"]
    monkeypatch.setattr(svc, "_decode", lambda tokens: (_ for _ in ()).throw(RuntimeError("detokenizer broke")))
    with pytest.raises(openai.APIError, match="detokenizer broke"):
        list(client.chat.completions.create(model="tiny", messages=USER, max_tokens=8, stream=True))
    monkeypatch.setattr(svc, "_decode", decode)
    assert client.chat.completions.create(model="tiny", messages=USER, max_tokens=4).choices[0].finish_reason
    wait_idle(live)


def wait_idle(live, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = live["engine"].stats()
        if st["waiting"] + st["prefill"] + st["decode"] == 0 and st["free_slots"] == 8:
            return
        time.sleep(0.05)
    raise AssertionError(f"engine not idle: {live['engine'].stats()}")


def test_too_many_in_flight_gets_429_and_a_client_leaving_frees_its_sessions(live):
    svc = ModelService(live["engine"], live["tok"], "tiny-limited", limits=ServerLimits(max_tokens=900, max_concurrent=1))
    with ServerThread(make_app(svc)) as server:  # a long stream (900 tokens), so it is surely still running
        body = {"messages": USER, "max_tokens": 900, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", server.base_url + "/chat/completions", json=body, timeout=60) as stream:
            first = next(stream.iter_lines())
            assert first.startswith("data: ") and json.loads(first[6:])["choices"][0]["delta"]["role"] == "assistant"
            resp = post(server, "/chat/completions", {"messages": USER, "max_tokens": 4})
            assert error_of(resp, 429)["code"] == "too_many_requests" and resp.headers["retry-after"] == "1"
        wait_idle(live)  # the stream was closed early: its session was released
        assert post(server, "/chat/completions", {"messages": USER, "max_tokens": 4}).status_code == 200
        assert server.app.state.inflight.count == 0


def test_in_process_client_for_judges(live):
    client = EngineChatClient(live["svc"], temperature=0.0, max_tokens=8)
    ok, bad = client.complete_many([USER, [{"role": "user", "content": "x " * 2000}]])
    assert isinstance(ok, Completion) and ok.finish_reason in ("stop", "length") and ok.usage["completion_tokens"] <= 8
    assert isinstance(bad, EndpointError) and bad.status == 400 and "prompt" in str(bad)
    assert client.stats()["succeeded"] == 1 and client.stats()["failed"] == 1
    slow = ModelService(live["engine"], live["tok"], "tiny-slow", limits=ServerLimits(max_tokens=64, request_timeout_s=0.01))
    with pytest.raises(APIError) as e:
        slow.chat_body({"messages": USER, "max_tokens": 64, "ignore_eos": True})
    assert e.value.status == 504
    wait_idle(live)  # the timed-out request's session was released


def test_response_building_and_stream_deltas(tok):
    text = ('<think>\nweigh it\n</think>\n\nAnswer first. <tool_call>\n{"name": "search", "arguments": {"query": "a"}}'
            '\n</tool_call>\n<tool_call>\n{"name": "x", "arguments": [1]}\n</tool_call>')
    p = responses.parse_output(text, tools_enabled=True)
    assert p.reasoning == "weigh it" and [c.name for c in p.tool_calls] == ["search"]
    assert p.content.startswith("Answer first.") and '"arguments": [1]' in p.content  # a bad call stays visible
    assert responses.parse_output(text, tools_enabled=False).tool_calls == ()
    assert responses.parse_output("<think>\ncut off", tools_enabled=False) == responses.ParsedOutput("cut off", "")
    # Token-by-token streaming adds up to the final reply; a stop string is never shown.
    for source, stops in ((text, ()), ("<think>\nhmm\n</think>\n\nThe answer is 42 END and more", ("END",))):
        ids = tok.encode(source, add_special_tokens=False)
        for tools_enabled in (True, False):
            s = responses.ChoiceStream(stops=stops, tools_enabled=tools_enabled)
            pieces = [s.update(tok.decode(ids[:i]), final=False) for i in range(1, len(ids))]
            pieces.append(s.update(tok.decode(ids), final=True))
            final = responses.parse_output(responses.cut_at_stop(source, stops), tools_enabled=tools_enabled)
            assert "".join(d.get("content", "") for d in pieces) == final.content
            assert "".join(d.get("reasoning_content", "") for d in pieces) == (final.reasoning or "")
            assert not any("END" in d.get("content", "") for d in pieces)
    raw = responses.ChoiceStream(stops=("END",), raw=True)
    assert raw.update(" a b E") == {"content": " a b "} and raw.update(" a b END c", final=True) == {}


def test_launch_serve_script(tok, tmp_path):
    """launch/serve.py in its own process (scripted replies: no model to load), then SIGTERM."""
    import signal
    import socket
    import subprocess
    import sys
    tok.save_pretrained(str(tmp_path / "tok"))
    (tmp_path / "replies.jsonl").write_text(json.dumps({"text": "Hello from the script."}) + "\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, os.path.join(root, "launch", "serve.py"), f"--port={port}",
                             f"--tokenizer={tmp_path / 'tok'}", f"--scripted_replies={tmp_path / 'replies.jsonl'}",
                             "--name=echo", "--api_key=k"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.time() < deadline, "server did not start"
            time.sleep(0.2)
        client = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0)
        r = client.chat.completions.create(model="echo", messages=USER)
        assert r.choices[0].message.content == "Hello from the script." and r.usage.prompt_tokens > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises the signal (the conventional exit status for it)
    assert proc.returncode in (0, -signal.SIGTERM) and "Finished server process" in out, out[-2000:]


def test_load_policy_from_an_hf_dir(tok, tmp_path, hf_qwen3):
    """(The training-workdir layout, tokenizer two levels up, is exercised by test_eval_harness.)"""
    from reagent_jax.serve import load_policy
    hf_dir, _ = hf_qwen3(vocab_size=320)
    with pytest.raises(ValueError, match="151669 tokens but the model .* only 320"):
        load_policy(hf_dir)  # no tokenizer inside: the real Qwen3 one does not fit a 320-row embedding
    tok.save_pretrained(str(tmp_path / "tok"))
    assert load_policy(hf_dir, tokenizer_path=str(tmp_path / "tok")).tokenizer_path == str(tmp_path / "tok")
    tok.save_pretrained(hf_dir)
    p = load_policy(hf_dir)
    assert p.kind == "hf" and p.tokenizer_path == os.path.abspath(hf_dir) and p.cfg.vocab_size == 320
    assert p.tokenizer.encode("Paris") == tok.encode("Paris")
    with pytest.raises(FileNotFoundError, match="neither"):
        load_policy(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_policy(str(tmp_path / "nowhere"))


def _samples(text, name):
    """{labels-string: value} of one metric in Prometheus text format."""
    from prometheus_client.parser import text_string_to_metric_families
    return {tuple(sorted(s.labels.items())): s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == name}


def test_prometheus_metrics_count_requests_tokens_and_latency(live):
    base = live["server"].base_url.replace("/v1", "")
    before = httpx.get(base + "/metrics").text
    prompt_before = sum(_samples(before, "reagent_engine_prompt_tokens_total").values())
    r = live["client"].chat.completions.create(model="tiny", messages=USER, max_tokens=5, temperature=0.0)
    chunks = list(live["client"].chat.completions.create(model="tiny", messages=USER, max_tokens=3, stream=True))
    assert chunks and post(live["server"], "/chat/completions", {"messages": "nope"}).status_code == 400
    resp = httpx.get(base + "/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = resp.text
    ok = ("endpoint", "/v1/chat/completions"), ("status", "200")
    bad = ("endpoint", "/v1/chat/completions"), ("status", "400")
    requests = _samples(text, "reagent_http_requests_total")
    assert requests[ok] - _samples(before, "reagent_http_requests_total").get(ok, 0) == 2
    assert requests[bad] >= 1
    latency = _samples(text, "reagent_http_request_duration_seconds_count")
    assert latency[(("endpoint", "/v1/chat/completions"),)] >= 3
    prompt = sum(_samples(text, "reagent_engine_prompt_tokens_total").values())
    assert prompt - prompt_before >= r.usage.prompt_tokens
    assert _samples(text, "reagent_engine_free_slots")[(("model", "tiny-agent"),)] == 8  # all done
    assert _samples(text, "reagent_http_requests_in_flight")[()] == 0
