"""Hostile and unusual requests to the OpenAI-compatible server, as a fuzzer or an OpenAI client sends them.

A scripted engine answers (no model to compile), so every case runs the real HTTP, parsing and
response code in milliseconds. Oracles: OpenAI's error object shape, the non-streamed reply for
the streamed one, and the tokenizer's own encoding of the scripted reply.
"""
import json
import socket
import threading
import time
import types

import httpx
import openai
import pytest

from reagent_jax.rollout import Result
from reagent_jax.serve import ModelService, ScriptedEngine, ServerLimits, ServerThread, make_app
from reagent_jax.benchmarks import loadgen
from tests.serve.test_serve import tok  # noqa: F401 - the same compact tokenizer fixture

USER = [{"role": "user", "content": "What is the capital of France?"}]
REPLY = "<think>\nweigh it\n</think>\n\nParis é 🙂 is the capital."


@pytest.fixture(scope="module")
def server(tok):
    svc = ModelService(ScriptedEngine(tok, [REPLY], max_len=512), tok, "scripted",
                       limits=ServerLimits(max_tokens=64, max_n=4))
    with ServerThread(make_app(svc)) as srv:
        srv.svc = svc
        yield srv


def post(server, path, body=None, content=None, **kw):
    return httpx.post(server.base_url + path, json=body, content=content, timeout=30, **kw)


def error_of(resp, status):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def still_serving(server):
    r = post(server, "/chat/completions", {"messages": USER})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Paris é 🙂 is the capital."


@pytest.mark.parametrize("raw, says", [
    (b"[" * 100_000, "not valid JSON"),  # nested past the decoder's recursion limit (was a 500)
    (b'{"messages": [{"role": "user", "content": "hi"}], "seed": ' + b"7" * 5000 + b"}", "not valid JSON"),  # (was a 500)
    (b"", "not valid JSON"), (b"\xff\xfe\x00", "not valid JSON"), (b"messages=hi", "not valid JSON"),
    (b'"just a string"', "must be a JSON object"), (b"null", "must be a JSON object"),
], ids=["deep", "huge-int", "empty", "utf16", "form", "string", "null"])
def test_unparseable_bodies_get_a_400_in_openai_format(server, raw, says):
    err = error_of(post(server, "/chat/completions", content=raw), 400)
    assert says in err["message"] and err["type"] == "invalid_request_error" and len(err["message"]) < 400
    still_serving(server)


def test_lone_surrogates_get_a_400_naming_where(server):
    """"\\ud800" is valid JSON but not text: the tokenizer would fail with an opaque TypeError."""
    for path, body, where in [
            ("/completions", '{"prompt": "a\\ud800b"}', "prompt 0"),  # was a 500
            ("/completions", '{"prompt": ["fine", "x\\udfff"], "echo": true, "stream": true}', "prompt 1"),  # was a 500
            ("/chat/completions", '{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages[0]")]:
        err = error_of(post(server, path, content=body.encode()), 400)
        assert where in err["message"] and "surrogate" in err["message"], err
    still_serving(server)


def test_streamed_logprobs_add_up_to_the_non_streamed_ones(server, tok):
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    full = client.chat.completions.create(model="scripted", messages=USER, logprobs=True, n=2)
    chunks = list(client.chat.completions.create(model="scripted", messages=USER, logprobs=True, n=2, stream=True))
    expected = [(t.token, t.logprob) for t in full.choices[0].logprobs.content]
    # oracle: one entry per drawn token of the reply, the stop token (<|im_end|>) left out
    assert [t for t, _ in expected] == [tok.decode([i]) for i in tok.encode(REPLY, add_special_tokens=False)]
    for index in (0, 1):
        streamed = [(t.token, t.logprob) for c in chunks for ch in c.choices if ch.index == index and ch.logprobs
                    for t in ch.logprobs.content]
        assert streamed == expected  # was: no logprobs at all in a stream
    plain = list(client.chat.completions.create(model="scripted", messages=USER, stream=True))
    assert all(ch.logprobs is None for c in plain for ch in c.choices)


def test_sse_framing_usage_chunk_and_done(server):
    body = {"messages": USER, "stream": True, "n": 2, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.base_url + "/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""] and all(e.startswith("data: ") for e in events[:-1])
    chunks = [json.loads(e[6:]) for e in events[:-2]]
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == sum(usage["usage"][k] for k in (
        "prompt_tokens", "completion_tokens"))
    full = post(server, "/chat/completions", {"messages": USER, "n": 2}).json()
    assert usage["usage"] == full["usage"]
    for i in (0, 1):
        text = "".join(ch["delta"].get("content", "") for c in chunks[:-1] for ch in c["choices"] if ch["index"] == i)
        assert text == full["choices"][i]["message"]["content"]


def test_a_stream_that_fails_counts_as_failed_in_the_load_generator(server, monkeypatch):
    """loadgen (the server benchmark's clients) used to count a stream ending in an error event as ok."""
    bodies = [{"prompt": "Paris", "max_tokens": 8}] * 2
    good = loadgen.run_load(server.base_url, bodies, clients=2, endpoint="completions", stream=True)
    assert [r["ok"] for r in good["results"]] == [True, True]
    assert all(r["completion_tokens"] > 0 for r in good["results"])
    monkeypatch.setattr(server.svc, "_decode", lambda tokens: (_ for _ in ()).throw(RuntimeError("detokenizer broke")))
    bad = loadgen.run_load(server.base_url, bodies, clients=2, endpoint="completions", stream=True)
    assert [(r["ok"], r["status"], r["completion_tokens"]) for r in bad["results"]] == [(False, 200, 0)] * 2


@pytest.mark.parametrize("patch, status, param, says", [
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]},
     400, "messages", "image_url"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, 400, "messages", "only text parts"),
    ({"messages": [{"role": "function", "name": "f", "content": "x"}]}, 400, "messages", "role must be one of"),
    ({"messages": [{"role": "user"}]}, 400, "messages", "needs a content"),
    ({"messages": "hi"}, 400, "messages", "non-empty list"),
    ({"messages": None}, 400, "messages", "non-empty list"),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, 400, "tool_choice", "forcing a tool"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, 400, "tools", "JSON-schema"),
    ({"tools": "search"}, 400, "tools", "must be a list"),
    ({"n": 10 ** 20}, 400, "n", "[1, 4]"), ({"max_tokens": 0}, 400, "max_tokens", ">= 1"),
    ({"max_completion_tokens": -1}, 400, "max_completion_tokens", ">= 1"),
    ({"max_tokens": 10 ** 20}, 400, "max_tokens", "limit of 64"), ({"top_p": 1.5}, 400, "top_p", "(0, 1]"),
    ({"temperature": 2.5}, 400, "temperature", "[0, 2]"), ({"top_logprobs": 3}, 400, "top_logprobs", "needs 'logprobs'"),
    ({"top_logprobs": 21, "logprobs": True}, 400, "top_logprobs", "[0, 20]"),
    ({"stop": [""]}, 400, "stop", "non-empty"), ({"stop": 5}, 400, "stop", "string or a list"),
    ({"response_format": {"type": "json_object"}}, 400, "response_format", "not supported"),
    ({"model": "gpt-9"}, 404, "model", "does not exist"),
])
def test_bad_fields_get_clear_errors(server, patch, status, param, says):
    err = error_of(post(server, "/chat/completions", {"messages": USER, **patch}), status)
    assert err["param"] == param and says in err["message"]


@pytest.mark.parametrize("patch", [
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is the capital"},
                                               {"type": "text", "text": " of France?"}]}]},
    {"tool_choice": "none", "tools": [{"type": "function", "function": {"name": "search"}}]},
    {"stop": "never there"}, {"seed": -5}, {"seed": 2 ** 80}, {"user": "u1", "metadata": {"k": "v"}},
    {"stream_options": {"include_usage": True}}, {"logprobs": False, "top_logprobs": 0},
])
def test_accepted_variants_reply_like_the_plain_request(server, patch):
    r = post(server, "/chat/completions", {"messages": USER, **patch})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "Paris é 🙂 is the capital."


def test_text_parts_render_like_the_joined_string(server):
    engine = server.svc.engine
    post(server, "/chat/completions", {"messages": USER})
    joined = engine.prompts[-1]
    post(server, "/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is the capital"}, {"type": "text", "text": " of France?"}]}]})
    assert engine.prompts[-1] == joined


def test_wrong_content_type_and_unknown_routes(server):
    r = post(server, "/chat/completions", content=json.dumps({"messages": USER}).encode(),
             headers={"content-type": "text/plain"})
    assert r.status_code == 200  # the body is JSON whatever the header says (curl -d sends form type)
    for method, path, status in [("POST", "/embeddings", 404), ("GET", "/nothing", 404), ("DELETE", "/models", 405),
                                 ("GET", "/models/gpt-9", 404)]:
        err = error_of(httpx.request(method, server.base_url + path, timeout=30), status)
        assert path.split("/")[-1] in err["message"]
    with pytest.raises(openai.NotFoundError, match="embeddings"):
        openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0).embeddings.create(model="scripted", input="x")


class HangingEngine:
    """An engine whose sessions only end when released (as a long generation would, much later)."""

    def __init__(self, vocab_size: int):
        self.max_len, self.cfg = 512, types.SimpleNamespace(vocab_size=vocab_size)
        self.started, self.released, self._cond = [], set(), threading.Condition()

    def start(self, prompt_ids, sampling=None, *, multi_turn=False, where="engine.start") -> int:
        with self._cond:
            self.started.append(len(self.started))
            return self.started[-1]

    def wait(self, sid, timeout=None):
        with self._cond:
            if not self._cond.wait_for(lambda: sid in self.released, timeout):
                raise TimeoutError(f"session {sid} still running")
        return Result(sid, [], [], "cancelled")

    def release(self, sid) -> None:
        with self._cond:
            self.released.add(sid)
            self._cond.notify_all()

    def tokens(self, sid):
        return []

    def start_background(self) -> None:
        pass

    def stats(self) -> dict:
        return {}


def test_a_client_leaving_a_blocking_request_frees_its_sessions(tok):
    """Before, a non-streamed request went on generating (holding engine slots) for a client that
    had timed out and gone; a retrying client then paid twice."""
    engine = HangingEngine(len(tok))
    with ServerThread(make_app(ModelService(engine, tok, "hang"))) as srv:
        body = json.dumps({"messages": USER, "n": 2}).encode()
        with socket.create_connection(("127.0.0.1", srv.port)) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            wait_for(lambda: len(engine.started) == 2, "both choices to start")
        wait_for(lambda: engine.released == {0, 1}, "the sessions of the gone client to be released")
        wait_for(lambda: srv.app.state.inflight.count == 0, "the request slot to be freed")


def wait_for(condition, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
