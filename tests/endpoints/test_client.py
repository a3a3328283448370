"""The chat-completions client against real HTTP servers on loopback (tests/fake_openai_server.py)."""

import pickle
import socket
import threading
import time

import pytest

from reagent_jax.endpoints import ChatClient, Completion, EndpointConfig, EndpointError, EndpointPool
from tests.fake_openai_server import (
    FakeOpenAIServer,
    delayed,
    drop,
    error,
    malformed,
    missing_choices,
    missing_message,
    ok,
)

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def servers():
    """Factory of started fake servers; all are stopped when the test ends."""
    started = []

    def make(**kw) -> FakeOpenAIServer:
        server = FakeOpenAIServer(**kw).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


def config(*servers_or_urls, **kw) -> EndpointConfig:
    urls = [s if isinstance(s, str) else s.base_url for s in servers_or_urls]
    kw = {"model": "fake-model", "backoff_base_s": 0.01, "backoff_max_s": 0.05, "timeout_s": 5.0, **kw}
    return EndpointConfig(base_urls=urls, **kw)


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def test_normal_completion_sends_config_and_reads_reply(servers, monkeypatch):
    server = servers(reply=lambda body: ok("the answer", reasoning_content="because"))
    monkeypatch.setenv("FAKE_KEY_FOR_TEST", "sk-test-123")
    cfg = config(server, api_key_env="FAKE_KEY_FOR_TEST", temperature=0.7, max_tokens=64,
                 extra_body={"top_p": 0.95, "chat_template_kwargs": {"enable_thinking": False}})
    with ChatClient(cfg) as client:
        out = client.complete(USER, max_tokens=None, stop=["</score>"])
    assert isinstance(out, Completion)
    assert (out.text, out.reasoning_content, out.finish_reason, out.attempts) == ("the answer", "because", "stop", 1)
    assert out.url == server.base_url and out.model == "fake-model" and out.texts == ("the answer",)
    (req,) = server.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["authorization"] == "Bearer sk-test-123"
    body = req["body"]
    assert body["model"] == "fake-model" and body["messages"] == USER and body["temperature"] == 0.7
    assert "max_tokens" not in body  # a None override removes the field
    assert body["top_p"] == 0.95 and body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["stop"] == ["</score>"]


def test_no_api_key_means_no_authorization_header(servers, monkeypatch):
    server = servers()
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with ChatClient(config(server)) as client:
        assert client.complete(USER).text == "echo: hi"
    assert "authorization" not in server.requests[0]["headers"]
    with ChatClient(config(server, api_key="explicit")) as client:
        client.complete(USER)
    assert server.requests[1]["headers"]["authorization"] == "Bearer explicit"


def test_retries_after_5xx_and_429_then_succeeds(servers):
    server = servers(script=[error(503), error(429), error(502), ok("finally")])
    with ChatClient(config(server, max_retries=3)) as client:
        out = client.complete(USER)
        stats = client.stats()
    assert out.text == "finally" and out.attempts == 4 and server.count == 4
    assert stats["retries"] == 3 and stats["succeeded"] == 1 and stats["failed"] == 0
    assert stats["urls"][server.base_url] == {"sent": 4, "failed": 3, "in_flight": 0}


def test_retry_after_header_is_honoured(servers):
    server = servers(script=[error(429, retry_after=0.4), ok("ok")])
    start = time.perf_counter()
    with ChatClient(config(server, backoff_max_s=1.0)) as client:
        assert client.complete(USER).attempts == 2
    assert time.perf_counter() - start >= 0.4


def test_other_4xx_fails_at_once_with_body_excerpt(servers):
    server = servers(script=[error(400, '{"error": "context length exceeded"}')])
    with ChatClient(config(server, max_retries=4)) as client, pytest.raises(EndpointError) as info:
        client.complete(USER)
    e = info.value
    assert (e.kind, e.status, e.attempts, e.url, e.retryable) == ("http_status", 400, 1, server.base_url, False)
    assert "context length exceeded" in e.body and "context length exceeded" in str(e)
    assert server.count == 1


def test_persistent_5xx_gives_clear_failure_after_all_retries(servers):
    server = servers(reply=lambda body: error(503))
    with ChatClient(config(server, max_retries=2)) as client, pytest.raises(EndpointError) as info:
        client.complete(USER)
    assert (info.value.kind, info.value.status, info.value.attempts) == ("http_status", 503, 3)
    assert "HTTP 503" in str(info.value) and "after 3 attempt(s)" in str(info.value)
    assert server.count == 3


def test_timeout_is_retried_then_fails_clearly(servers):
    server = servers(reply=lambda body: delayed("too late", 3.0))
    start = time.perf_counter()
    with ChatClient(config(server, timeout_s=0.3, max_retries=1)) as client, pytest.raises(EndpointError) as info:
        client.complete(USER)
    elapsed = time.perf_counter() - start
    assert (info.value.kind, info.value.attempts, info.value.status) == ("timeout", 2, None)
    assert "0.3 s" in str(info.value)
    assert server.count == 2 and elapsed < 2.5  # two ~0.3 s attempts, not the server's 3 s


def test_timeout_then_fast_reply_succeeds(servers):
    server = servers(script=[delayed("slow", 3.0)])
    with ChatClient(config(server, timeout_s=0.3, max_retries=2)) as client:
        out = client.complete(USER)
    assert out.text == "echo: hi" and out.attempts == 2


@pytest.mark.parametrize("bad, message", [(malformed, "not JSON"), (missing_choices, "no 'choices'"),
                                          (missing_message, "no 'message'")])
def test_malformed_bodies_are_retried_then_reported(servers, bad, message):
    server = servers(script=[bad()])
    with ChatClient(config(server, max_retries=2)) as client:
        assert client.complete(USER).attempts == 2  # one bad body, then a good one
        server.reply = lambda body: bad()
        with pytest.raises(EndpointError) as info:
            client.complete(USER)
    assert (info.value.kind, info.value.status, info.value.attempts) == ("malformed", 200, 3)
    assert message in str(info.value) and info.value.body  # the excerpt shows what came back


def test_connection_errors_are_retried_and_reported(servers):
    dead = closed_port_url()
    with ChatClient(config(dead, max_retries=2)) as client, pytest.raises(EndpointError) as info:
        client.complete(USER)
    assert (info.value.kind, info.value.attempts, info.value.url) == ("connection", 3, dead)
    server = servers(script=[drop()])  # server closes the socket without replying, once
    with ChatClient(config(server, max_retries=1)) as client:
        assert client.complete(USER).attempts == 2


def test_round_robin_spreads_sequential_requests_evenly(servers):
    a, b = servers(), servers()
    with ChatClient(config(a, b, balance="round_robin")) as client:
        urls = [client.complete(USER).url for _ in range(6)]
    assert a.count == 3 and b.count == 3
    assert urls == [a.base_url, b.base_url] * 3


def test_least_inflight_uses_both_replicas_in_a_batch(servers):
    a = servers(reply=lambda body: delayed("a", 0.1))
    b = servers(reply=lambda body: delayed("b", 0.1))
    with ChatClient(config(a, b, max_concurrency=4)) as client:
        outs = client.complete_many([USER] * 8)
    assert all(isinstance(o, Completion) for o in outs)
    assert a.count + b.count == 8 and a.count >= 2 and b.count >= 2
    assert a.max_in_flight <= 2 and b.max_in_flight <= 2  # 4 slots shared evenly between 2 replicas


def test_dead_replica_costs_one_attempt(servers):
    live = servers()
    with ChatClient(config(closed_port_url(), live, balance="round_robin", max_retries=1)) as client:
        outs = client.complete_many([USER] * 6)
    assert all(isinstance(o, Completion) and o.url == live.base_url for o in outs)
    assert all(o.attempts <= 2 for o in outs) and live.count == 6


def test_concurrency_limit_is_respected_and_order_kept(servers):
    server = servers(reply=lambda body: delayed(body["messages"][0]["content"], 0.2))
    batch = [[{"role": "user", "content": f"item {i}"}] for i in range(9)]
    with ChatClient(config(server, max_concurrency=3)) as client:
        outs = client.complete_many(batch)
        assert [o.text for o in outs] == [f"item {i}" for i in range(9)]
        assert 2 <= server.max_in_flight <= 3
        # two threads sharing one client share its limit too
        server.max_in_flight = 0
        threads = [threading.Thread(target=client.complete_many, args=(batch[:4],)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)
    assert 2 <= server.max_in_flight <= 3


def test_batch_never_raises_for_a_failed_item(servers):
    def reply(body):
        text = body["messages"][0]["content"]
        return error(400, "bad item") if "bad" in text else ok(text.upper())

    server = servers(reply=reply)
    batch = [[{"role": "user", "content": t}] for t in ("one", "bad", "three", "bad too")]
    with ChatClient(config(server)) as client:
        outs = client.complete_many(batch, progress=None)
        stats = client.stats()
    assert [type(o) for o in outs] == [Completion, EndpointError, Completion, EndpointError]
    assert outs[0].text == "ONE" and outs[2].text == "THREE" and outs[1].status == 400
    assert stats["failed"] == 2 and stats["failures_by_kind"] == {"http_status": 2}


def test_iter_complete_yields_every_index_once(servers):
    server = servers(reply=lambda body: delayed("x", 0.05))
    with ChatClient(config(server, max_concurrency=2)) as client:
        seen = sorted(i for i, _ in client.iter_complete([USER] * 5))
    assert seen == [0, 1, 2, 3, 4]


def test_bad_input_is_rejected_before_any_request(servers):
    server = servers()
    with ChatClient(config(server)) as client:
        with pytest.raises(ValueError, match=r"messages_list\[1\]\[0\]"):
            client.complete_many([USER, [{"content": "no role"}]])
        with pytest.raises(ValueError, match="non-empty list"):
            client.complete("just a string")
    assert server.count == 0


def test_config_validation_and_env():
    with pytest.raises(ValueError, match="not an http"):
        EndpointConfig(base_urls=("localhost:8000",), model="m")
    with pytest.raises(ValueError, match="no model"):
        ChatClient(EndpointConfig(base_urls=("http://127.0.0.1:1/v1",)))
    with pytest.raises(ValueError, match="max_concurrency"):
        EndpointConfig(base_urls=("http://127.0.0.1:1/v1",), model="m", max_concurrency=0)
    cfg = EndpointConfig(base_urls="http://a:1/v1/, http://b:2/v1", model="m", api_key="secret")
    assert cfg.base_urls == ("http://a:1/v1", "http://b:2/v1") and cfg.configured
    assert "secret" not in repr(cfg)


def test_from_env_reads_prefixed_variables(monkeypatch):
    monkeypatch.setenv("JUDGE_BASE_URL", "http://a:1/v1,http://b:2/v1")
    monkeypatch.setenv("SHARED_MODEL", "qwen")
    monkeypatch.setenv("JUDGE_API_KEY", "k")
    cfg = EndpointConfig.from_env("JUDGE", fallback_prefix="SHARED", timeout_s=5.0)
    assert cfg.base_urls == ("http://a:1/v1", "http://b:2/v1") and cfg.model == "qwen"
    assert cfg.resolved_api_key() == "k" and cfg.timeout_s == 5.0
    assert not EndpointConfig.from_env("NOTHING_SET_HERE").configured and not EndpointConfig().configured
    monkeypatch.delenv("JUDGE_API_KEY")
    monkeypatch.setenv("OPENAI_API_KEY", "general-key")  # not sent to a server configured by prefix
    assert EndpointConfig.from_env("JUDGE", fallback_prefix="SHARED").resolved_api_key() is None


def test_openai_sdk_client_speaks_to_the_same_server(servers):
    """The fake server is a faithful chat-completions endpoint: the official SDK reads it too."""
    server = servers()
    cfg = config(server, api_key="sk-x")
    reply = cfg.openai_client().chat.completions.create(model=cfg.model, messages=USER)
    assert reply.choices[0].message.content == "echo: hi"
    assert server.requests[0]["headers"]["authorization"] == "Bearer sk-x"


def test_endpoint_error_pickles():
    e = EndpointError("boom", url="http://x/v1", status=503, body="b" * 2000, attempts=3, kind="http_status")
    back = pickle.loads(pickle.dumps(e))
    assert (back.url, back.status, back.attempts, back.kind, len(back.body)) == ("http://x/v1", 503, 3,
                                                                                  "http_status", 500)
    assert str(back) == str(e)


def test_pool_prefers_least_busy_and_avoids_failed_url():
    pool = EndpointPool(["u1", "u2", "u3"])
    first = [pool.acquire() for _ in range(3)]
    assert sorted(first) == ["u1", "u2", "u3"]
    pool.release("u2")
    assert pool.acquire() == "u2"  # the only idle one
    pool.release("u1")
    pool.release("u3")
    assert pool.acquire(avoid="u1") == "u3"
    assert pool.in_flight() == {"u1": 0, "u2": 1, "u3": 1}
