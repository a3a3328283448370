"""Tool protocol, registry and call fuzzing: every bad call becomes a readable ok=False output."""

from __future__ import annotations

import json
import time

import pytest

from reagent_jax.agent import tools
from reagent_jax.agent.tools.base import Tool, ToolError

FAST_PYTHON = {"wall_time_s": 5.0, "cpu_time_s": 4}


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("corpus") / "c.jsonl"
    corpus.write_text(json.dumps({"id": "1", "title": "Paris", "text": "Paris is the capital of France."}) + "\n")
    return tools.build_registry({"search": {"backend": "local", "corpus": str(corpus)}, "python": FAST_PYTHON,
                                 "browse": {"allow_network": False}, "file_reader": {}, "image2text": {},
                                 "audio2text": {}})


def test_public_surface_runs_python():
    out = tools.get("python").call({"code": "print(1 + 1)"})
    assert out.ok and out.text == "2" and out.error_kind is None and out.elapsed_s > 0
    outs = tools.call_many([("python", {"code": "print(3)"}), ("nope", {})], max_workers=2)
    assert [o.text for o in outs][0] == "3" and outs[1].error_kind == "unknown_tool"


def test_schemas_are_openai_function_schemas(registry):
    schemas = registry.schemas()
    assert [s["function"]["name"] for s in schemas] == list(tools.TOOL_NAMES)
    for schema in schemas:
        assert schema["type"] == "function"
        params = schema["function"]["parameters"]
        assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])
        assert schema["function"]["description"]
        json.dumps(schema)  # serialisable as sent to a chat template
    assert tools.schemas() == schemas
    expected = {"search": {"query", "topk"}, "browse": {"url", "query"}, "python": {"code"},
                "file_reader": {"path"}, "image2text": {"path", "question"}, "audio2text": {"path"}}
    assert {s["function"]["name"]: set(s["function"]["parameters"]["properties"]) for s in schemas} == expected


@pytest.mark.parametrize("name,args,needle", [
    ("search", {"query": 42}, "'query' must be of type string, got integer"),
    ("search", {"query": "x", "topk": "3"}, "'topk' must be of type integer, got string"),
    ("search", {"query": "x", "topk": True}, "'topk' must be of type integer, got boolean"),
    ("search", {"query": "x", "topk": 0}, "'topk' must be >= 1"),
    ("search", {}, "missing required argument(s) 'query'"),
    ("search", {"query": "   "}, "'query' must not be empty"),
    ("browse", {"url": ["a"]}, "'url' must be of type string, got array"),
    ("browse", {"query": "x"}, "missing required argument(s) 'url'"),
    ("python", {"code": None}, "'code' must be of type string, got null"),
    ("python", {"source": "print(1)"}, "unknown argument(s) 'source'"),
    ("file_reader", {"path": {"p": 1}}, "'path' must be of type string, got object"),
    ("image2text", {"path": "a.png", "question": 3.5}, "'question' must be of type string, got number"),
    ("audio2text", {"path": "a.wav", "language": "en"}, "unknown argument(s) 'language'"),
])
def test_bad_arguments_are_reported_by_name(registry, name, args, needle):
    out = registry.call(name, args)
    assert not out.ok and out.error_kind == "bad_arguments"
    assert needle in out.text and out.text.startswith(name)


@pytest.mark.parametrize("arguments,needle", [
    ("not json {", "not valid JSON"), ([1, 2], "must be a JSON object, got array"), (7, "got integer"),
    ('{"query": 5}', "'query' must be of type string"),
])
def test_malformed_argument_payloads(registry, arguments, needle):
    out = registry.call("search", arguments)
    assert not out.ok and out.error_kind == "bad_arguments" and needle in out.text


def test_json_string_arguments_are_accepted(registry):
    out = registry.call("search", '{"query": "capital of France"}')
    assert out.ok and "Doc 1 (Title: Paris)" in out.text


@pytest.mark.parametrize("name,field", [("search", "query"), ("browse", "url"), ("python", "code"),
                                        ("file_reader", "path"), ("image2text", "path"), ("audio2text", "path")])
def test_megabyte_arguments_are_refused(registry, name, field):
    args = {"url": "u", "path": "p", "query": "q", "code": "c"}
    args = {k: v for k, v in args.items() if k in registry[name].parameters["properties"]}
    args[field] = "A" * (1 << 20)
    start = time.perf_counter()
    out = registry.call(name, args)
    assert not out.ok and out.error_kind == "bad_arguments"
    assert f"argument {field!r} is too long (1048576 characters" in out.text
    assert time.perf_counter() - start < 1.0


def test_unknown_tool_lists_available_tools(registry):
    for name in ("web_search", None, 12, "x" * 100_000):
        out = registry.call(name, {})
        assert not out.ok and out.error_kind == "unknown_tool"
        assert "Available tools: search, browse, python, file_reader, image2text, audio2text" in out.text
        assert len(out.text) < 400
    assert tools.call("nope", {}).error_kind == "unknown_tool"
    with pytest.raises(KeyError, match="available tools"):
        tools.get("nope")


def test_call_many_runs_in_parallel_and_keeps_order(registry):
    calls = [("python", {"code": f"import time\ntime.sleep(0.6)\nprint({i})"}) for i in range(4)]
    calls.insert(2, ("nope", {}))
    calls.append({"type": "function", "function": {"name": "python", "arguments": '{"code": "print(99)"}'}})
    start = time.perf_counter()
    outs = registry.call_many(calls, max_workers=8)
    elapsed = time.perf_counter() - start
    assert [o.text for o in outs] == ["0", "1", outs[2].text, "2", "3", "99"]
    assert outs[2].error_kind == "unknown_tool"
    assert elapsed < 4 * 0.6  # sequential would take at least 2.4 s


class _SlowTool(Tool):
    name = "slow"
    parameters = {"type": "object", "properties": {"mode": {"type": "string"}}, "required": ["mode"]}

    def run(self, mode: str) -> str:
        if mode == "sleep":
            time.sleep(5)
        if mode == "error":
            raise ToolError("not_found", "nothing there")
        if mode == "crash":
            raise RuntimeError("boom")
        return "x" * 50_000


def test_tool_timeouts_crashes_and_truncation():
    tool = _SlowTool(timeout_s=0.3, max_output_chars=1000)
    start = time.perf_counter()
    out = tool.call({"mode": "sleep"})
    assert out.error_kind == "timeout" and "timed out after 0.3 s" in out.text and time.perf_counter() - start < 1
    assert tool.call({"mode": "error"}).text == "slow: nothing there"
    crash = tool.call({"mode": "crash"})
    assert crash.error_kind == "runtime_error" and "RuntimeError: boom" in crash.text
    long = tool.call({"mode": "long"})
    assert long.ok and len(long.text) <= 1000 and "the output had 50000 characters" in long.text
    assert long.text.startswith("xxx") and long.text.endswith("xxx")


def test_python_tool_reports_errors_and_truncates_output():
    tool = tools.get("python", max_output_chars=2000, **FAST_PYTHON)
    err = tool.call({"code": "import json\njson.loads('{bad')"})
    assert not err.ok and err.error_kind == "runtime_error" and "JSONDecodeError" in err.text
    assert "[stderr]" in err.text
    big = tool.call({"code": "print('\\n'.join(str(i) for i in range(100000)))"})
    assert big.ok and len(big.text) <= 2000 and big.text.startswith("0\n1\n") and big.text.endswith("99999")
    assert "truncated" in big.text
    slow = tools.get("python", wall_time_s=1.0).call({"code": "import time\ntime.sleep(30)"})
    assert slow.error_kind == "timeout" and "timed out after 1 s" in slow.text
    silent = tool.call({"code": "import os\nprint('lost')\nos._exit(7)"})  # not just "(no output)"
    assert not silent.ok and "exited with code 7 without an error message" in silent.text


def test_search_backend_errors_are_explicit(tmp_path, monkeypatch):
    for var in ("REAGENT_SEARCH_BACKEND", "REAGENT_RETRIEVAL_URL", "REAGENT_SEARCH_CORPUS", "SERPER_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    unconfigured = tools.get("search", backend=None).call({"query": "x"})
    assert unconfigured.error_kind == "not_configured" and "REAGENT_RETRIEVAL_URL" in unconfigured.text
    serper = tools.get("search", backend="serper").call({"query": "x"})
    assert serper.error_kind == "not_configured" and "SERPER_API_KEY" in serper.text
    missing = tools.get("search", backend="local", corpus=str(tmp_path / "none.jsonl")).call({"query": "x"})
    assert missing.error_kind == "not_configured" and "none.jsonl" in missing.text
    with pytest.raises(ValueError, match="unknown search backend"):
        tools.get("search", backend="bing")
