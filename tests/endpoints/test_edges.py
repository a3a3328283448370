"""The chat client against odd keys, odd URLs and odd replies (loopback fake server only).

Secrets must never reach an error message: a key with a trailing newline (read from a key file)
made httpx quote the whole Authorization header in its error, and a server that echoes the
request's headers in its error body would have put the key in the excerpt.
"""
import json

import pytest

from reagent_jax.endpoints import ChatClient, EndpointConfig, EndpointError, parse_chat_completion
from tests.fake_openai_server import Behaviour, FakeOpenAIServer, error, ok
from tests.endpoints.test_client import closed_port_url, config

USER = [{"role": "user", "content": "hi"}]
KEY = "sk-VERY-SECRET-0123456789"


@pytest.fixture
def server():
    with FakeOpenAIServer() as s:
        yield s


@pytest.mark.parametrize("raw", [KEY + "\n", KEY + "\r\n", " " + KEY + " "])
def test_a_key_with_surrounding_whitespace_is_sent_trimmed(server, monkeypatch, raw):
    monkeypatch.setenv("EDGE_TEST_KEY", raw)
    with ChatClient(config(server, api_key_env="EDGE_TEST_KEY", max_retries=0)) as client:
        assert client.complete(USER).text == "echo: hi"  # was: a "connection" error quoting the key
    assert server.requests[-1]["headers"]["authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize("raw", [KEY[:8] + "\n" + KEY[8:], KEY + "\r\nX-Injected: 1", KEY.replace("S", "Š"),
                                 "sk-inner space-0123456789"])
def test_a_key_no_header_can_carry_is_refused_without_showing_it(monkeypatch, raw):
    monkeypatch.setenv("EDGE_TEST_KEY", raw)
    with pytest.raises(ValueError, match=r"\$EDGE_TEST_KEY") as info:
        ChatClient(config(closed_port_url(), api_key_env="EDGE_TEST_KEY"))
    assert "0123456789" not in str(info.value)
    with pytest.raises(ValueError, match=r"EndpointConfig\.api_key"):
        ChatClient(config(closed_port_url(), api_key=raw))


def test_a_key_echoed_by_the_server_is_redacted_from_the_error(server):
    def reply(body):
        headers = server.requests[-1]["headers"]
        return error(400, json.dumps({"error": {"message": f"bad request; you sent {headers['authorization']}"}}))
    server.reply = reply
    with ChatClient(config(server, api_key=KEY, max_retries=0)) as client, pytest.raises(EndpointError) as info:
        client.complete(USER)
    e = info.value
    assert KEY not in str(e) and KEY not in e.body and "you sent Bearer ***" in e.body  # was: the key in both
    assert e.status == 400 and e.url == server.base_url


def test_a_password_in_the_url_is_hidden_but_the_endpoint_named():
    dead = closed_port_url().replace("http://", "http://user:pw-SECRET@")
    with ChatClient(config(dead, max_retries=0)) as client, pytest.raises(EndpointError) as info:
        client.complete(USER)
    message = str(info.value)
    assert "pw-SECRET" not in message and "user:***@127.0.0.1" in message and info.value.kind == "connection"
    outs = ChatClient(config(dead, max_retries=0)).complete_many([USER])
    assert isinstance(outs[0], EndpointError) and "pw-SECRET" not in str(outs[0])


def test_a_reply_nested_too_deep_is_malformed_and_retried(server):
    server.push(Behaviour("raw", body="[" * 100_000), ok("fine"))
    with ChatClient(config(server, max_retries=1)) as client:
        assert client.complete(USER).text == "fine"  # was: RecursionError out of complete()
        server.reply = lambda body: Behaviour("raw", body="[" * 100_000)
        with pytest.raises(EndpointError) as info:
            client.complete(USER)
    assert (info.value.kind, info.value.attempts) == ("malformed", 2) and "not JSON" in str(info.value)


@pytest.mark.parametrize("data, says", [
    (None, "not an object"), ([], "not an object"), ({"choices": []}, "no 'choices'"),
    ({"choices": None, "error": {"message": "overloaded"}}, "overloaded"), ({"choices": [None]}, "choices[0]"),
    ({"choices": [{"message": {"content": "a"}}, {"message": "b"}]}, "choices[1]"),
    ({"choices": [{"message": {"content": 5}}]}, "content is a int"),
])
def test_malformed_reply_bodies_say_what_is_wrong(data, says):
    with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("]", r"\]")):
        parse_chat_completion(data)


def test_reply_variants_are_read():
    parts = {"choices": [{"message": {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                                      "reasoning": "r", "tool_calls": [{"id": "c", "type": "function",
                                                                        "function": {"name": "f", "arguments": "{}"}}]},
                          "finish_reason": "tool_calls"}, {"message": {"content": None}}]}
    out = parse_chat_completion(parts)
    assert (out["text"], out["texts"], out["reasoning_content"], out["finish_reason"]) == ("ab", ("ab", ""), "r",
                                                                                          "tool_calls")
    assert out["tool_calls"][0]["function"]["name"] == "f" and out["usage"] == {}


def test_config_key_resolution():
    assert EndpointConfig(api_key="  ", api_key_env=None).resolved_api_key() is None
    assert EndpointConfig(api_key=KEY + "\n").resolved_api_key() == KEY
    assert KEY not in repr(EndpointConfig(api_key=KEY)) and KEY not in EndpointConfig(
        base_urls="http://a:1/v1", model="m", api_key=KEY).describe()
