"""Agent loop edge cases: malformed calls, failing tools, context limits, bad records, answer
extraction. Oracle: `chat.render(messages, mode="train")` must reproduce each trajectory's tokens and
loss mask, and the loop's tokens must equal what a max_len-enforcing engine holds."""
import dataclasses
import threading

import pytest

from reagent_jax import chat, worlds
from reagent_jax.agent import retrieval, tools
from reagent_jax.agent.loop import AgentConfig, AgentLoop
from reagent_jax.agent.tools.base import Tool, ToolError, truncate_middle, validate_arguments
from tests.scripted_engine import ScriptedEngine

Q = {"question": "q?", "answer": ["7"], "data_source": "synthetic", "id": "q1"}
ANSWER = {"role": "assistant", "content": "The answer is \\boxed{7}.", "reasoning_content": "done"}


class LimitedEngine(ScriptedEngine):
    """ScriptedEngine with the real engine's context rules: `start` refuses a prompt longer than
    max_len - 1, a turn that fills the cache is cut with finish_reason "length", and `append` refuses
    tokens that leave no position to generate. It keeps each session's tokens, as the engine does."""

    def start(self, prompt_ids, sampling=None, multi_turn=False):
        if len(prompt_ids) > self.max_len - 1:
            raise ValueError(f"prompt has {len(prompt_ids)} tokens but max_len={self.max_len}")
        sid = super().start(prompt_ids, sampling, multi_turn)
        self._sessions[sid]["tokens"] = list(prompt_ids)
        return sid

    def wait(self, sid, timeout=None):
        res = super().wait(sid, timeout)
        held = self._sessions[sid]["tokens"]
        room = self.max_len - len(held)
        if len(res.tokens) > room:
            res = dataclasses.replace(res, tokens=res.tokens[:room], logprobs=res.logprobs[:room],
                                      finish_reason="length")
        held.extend(res.tokens)
        return res

    def append(self, sid, ids, then_resume=None):
        held = self._sessions[sid]["tokens"]
        if len(held) + len(ids) > self.max_len - 1:
            raise ValueError("appended tokens exceed max_len")
        held.extend(ids)
        super().append(sid, ids, then_resume)

    def release(self, sid):
        self.released = getattr(self, "released", []) + [self._sessions[sid]["tokens"]]
        super().release(sid)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    world = worlds.make_world(worlds.WorldConfig(seed=3, n_entities=12, n_questions=8))
    corpus = world.write_corpus_jsonl(tmp_path_factory.mktemp("w") / "corpus.jsonl")
    registry = tools.build_registry({"search": {"backend": "local", "corpus": corpus}}, names=["search", "python"])
    tok = chat.build_compact_tokenizer(worlds.world_texts(world) + ["Error unknown tool invalid JSON"], vocab_size=400)
    return registry, tok


def make_loop(tok, registry, turns, max_turns=4, tool_names=("search", "python"), engine_cls=ScriptedEngine,
              **engine_kw):
    engine = engine_cls(tok, turns if callable(turns) else (lambda ids: turns), **engine_kw)
    return AgentLoop(engine, tok, registry, AgentConfig(max_turns=max_turns, include_tool_schemas=False),
                     tool_names=None if tool_names is None else list(tool_names))


def assert_render_exact(tok, t):
    """tokens / loss mask == train-mode render of the trajectory's messages (+ the template's
    newline after the last <|im_end|>), and the arrays stay aligned."""
    assert len(t.tokens) == len(t.loss_mask) == len(t.logprobs)
    ref = chat.render(tok, t.messages, mode="train")
    closing = chat.close_assistant_turn(tok, t.tokens)
    assert t.tokens + closing == list(ref.ids)
    assert t.loss_mask + [0] * len(closing) == list(ref.loss_mask)
    for s, e in t.turn_spans:
        assert all(t.loss_mask[s:e])


def call(name, args):
    import json
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


GOOD = call("python", {"code": "print(6 * 7)"})
# one turn's text -> the expected start of each tool response, in the order the calls were written
CALL_TABLE = {
    "bad_json": ('<tool_call>\n{"name": "search", "arguments": {"query": "x"}\n</tool_call>',
                 ["Error: tool call 1: invalid JSON"]),
    "unknown_tool": (call("teleport", {"to": "mars"}), ['Error: tool call 1: unknown tool "teleport"']),
    "wrong_type": (call("search", {"query": 42}),
                   ["Error (bad_arguments): search: argument 'query' must be of type string"]),
    "missing_arg": (call("python", {}),
                    ["Error (bad_arguments): python: missing required argument(s) 'code'"]),
    "extra_arg": (call("search", {"query": "x", "lang": "en"}),
                  ["Error (bad_arguments): search: unknown argument(s) 'lang'"]),
    "empty_query": (call("search", {"query": "  "}),
                    ["Error (bad_arguments): search: argument 'query' must not be empty"]),
    "stray_close": ("</tool_call>", ["Error: tool call 1: </tool_call> without a matching"]),
    "unclosed": ('<tool_call>\n{"name": "search"', ["Error: tool call 1: <tool_call> is never closed"]),
    "good_then_bad": (GOOD + "\n" + '<tool_call>\n{"name": }\n</tool_call>',
                      ["42", "Error: tool call 2: invalid JSON"]),
    "bad_then_good": ('<tool_call>\n[1]\n</tool_call>\n' + GOOD, ["Error: tool call 1:", "42"]),
    "bad_good_unknown": ("I will try.\n<tool_call>\n{}\n</tool_call>\n" + GOOD + "\n" + call("browse", {"url": "x"}),
                         ["Error: tool call 1:", "42", 'Error: tool call 3: unknown tool "browse"']),
    "over_limit": ("\n".join([GOOD] * 5), ["42"] * 4 + ["Error: at most 4 tool calls per turn"]),
}


@pytest.mark.parametrize("kind", sorted(CALL_TABLE))
def test_malformed_calls_get_ordered_readable_responses_and_render_exactly(setup, kind):
    registry, tok = setup
    text, expected = CALL_TABLE[kind]
    turns = [{"role": "assistant", "content": text, "reasoning_content": "let me call"}, ANSWER]
    (t,) = make_loop(tok, registry, turns).run([Q])
    assert t.finish_reason == "answer" and t.num_turns == 2 and t.error is None
    obs = [m["content"] for m in t.messages if m["role"] == "tool"]
    assert len(obs) == len(expected)
    for got, want in zip(obs, expected):
        assert got.strip().startswith(want), (got, want)
    turn = t.messages[2]  # every call the model wrote is still in the message (raw or structured)
    assert turn["content"].count("<tool_call>") + len(turn.get("tool_calls", [])) == text.count("<tool_call>")
    assert_render_exact(tok, t)


def test_tool_errors_and_forced_final_message_render_exactly(setup):
    registry, tok = setup
    failing = {"role": "assistant", "content": "", "reasoning_content": "r",
               "tool_calls": [{"type": "function", "function": {"name": "python", "arguments": {"code": "1/0"}}}]}
    (t,) = make_loop(tok, registry, [failing] * 3 + [ANSWER], max_turns=3).run([Q])
    assert t.finish_reason == "max_turns" and t.num_turns == 3
    assert [m["role"] for m in t.messages[-3:]] == ["tool", "user", "assistant"]
    assert t.messages[-2]["content"] == AgentConfig().final_step_message
    assert "ZeroDivisionError" in t.messages[3]["content"] and t.tool_stats.failures == 2
    assert_render_exact(tok, t)


class Boom(Tool):
    name = "boom"
    parameters = {"type": "object", "properties": {"mode": {"type": "string"}}, "required": ["mode"]}

    def run(self, mode):
        if mode == "huge":
            return "A" * 50_000 + "TAIL"
        if mode == "tool_error":
            raise ToolError("not_found", "nothing there")
        raise RuntimeError("kaboom")


@pytest.mark.parametrize("mode,needle", [("crash", "Error (runtime_error): boom failed: RuntimeError: kaboom"),
                                         ("tool_error", "Error (not_found): boom: nothing there"),
                                         ("huge", "[... truncated: the output had 50004 characters")])
def test_raising_and_huge_tools_give_observations(setup, mode, needle):
    _, tok = setup
    reg = tools.ToolRegistry({"boom": Boom(max_output_chars=2000)})
    turns = [{"role": "assistant", "content": call("boom", {"mode": mode})}, ANSWER]
    (t,) = make_loop(tok, reg, turns, tool_names=None).run([Q])
    obs = t.messages[3]["content"]
    assert t.finish_reason == "answer" and needle in obs and len(obs) <= 2000
    if mode == "huge":
        assert obs.startswith("A") and obs.endswith("TAIL")
    assert_render_exact(tok, t)


class RaisingRegistry:
    def __init__(self, registry, short=False):
        self.registry, self.short = registry, short

    def schemas(self):
        return self.registry.schemas()

    def call_many(self, calls):
        if self.short:
            return []
        raise OSError("backend gone")


@pytest.mark.parametrize("short,needle", [(False, "OSError: backend gone"), (True, "no output for this call")])
def test_a_failing_registry_becomes_an_error_observation(setup, short, needle):
    registry, tok = setup
    turns = [{"role": "assistant", "content": GOOD}, ANSWER]
    loop = AgentLoop(ScriptedEngine(tok, lambda ids: turns), tok, RaisingRegistry(registry, short),
                     AgentConfig(max_turns=4, include_tool_schemas=False))
    (t,) = loop.run([Q])
    obs = t.messages[3]["content"]
    assert t.finish_reason == "answer" and obs.startswith("Error") and needle in obs
    assert t.tool_stats.failures == 1


class CountingRegistry:
    def __init__(self, registry):
        self.registry, self.calls = registry, []

    def schemas(self):
        return self.registry.schemas()

    def call_many(self, calls):
        self.calls += list(calls)
        return self.registry.call_many(calls)


@pytest.mark.parametrize("tool_names,registry_on", [([], True), (None, False), (["search"], True)])
def test_tools_not_offered_are_never_run(setup, tool_names, registry_on):
    """An empty tool list (a benchmark without tools) used to lift the restriction: the parser got
    None and the registry ran python anyway; without a registry the episode crashed."""
    registry, tok = setup
    counting = CountingRegistry(registry) if registry_on else None
    turns = [{"role": "assistant", "content": GOOD, "reasoning_content": ""}, ANSWER]
    (t,) = make_loop(tok, counting, turns, tool_names=tool_names).run([Q])
    assert t.finish_reason == "answer" and t.error is None
    assert t.messages[3]["content"].startswith('Error: tool call 1: unknown tool "python"')
    assert counting is None or counting.calls == []
    assert_render_exact(tok, t)


def test_boxed_only_in_reasoning_is_not_an_answer(setup):
    registry, tok = setup
    thought = {"role": "assistant", "content": "I am not sure.", "reasoning_content": "maybe \\boxed{7}"}
    (t,) = make_loop(tok, registry, [thought]).run([Q])
    assert t.finish_reason == "no_answer"
    (t,) = make_loop(tok, registry, [ANSWER]).run([Q])
    assert t.finish_reason == "answer" and t.final_text.endswith("\\boxed{7}.")


def test_bad_records_and_engine_failures_fail_alone(setup):
    registry, tok = setup

    class FlakyEngine(ScriptedEngine):
        def wait(self, sid, timeout=None):
            if self._sessions[sid].get("flaky"):
                raise RuntimeError("device lost")
            return super().wait(sid, timeout)

        def start(self, prompt_ids, sampling=None, multi_turn=False):
            sid = super().start(prompt_ids, sampling, multi_turn)
            self._sessions[sid]["flaky"] = "FLAKY" in tok.decode(prompt_ids)
            return sid

    loop = AgentLoop(FlakyEngine(tok, lambda ids: [ANSWER]), tok, registry, AgentConfig(include_tool_schemas=False))
    records = [Q, {"question": None, "id": "none"}, {"answer": ["x"]}, "not a record", {"question": "a\ud800b"},
               {"question": "FLAKY", "id": "f"}, {**Q, "id": "q2"}]
    trajs = loop.run(records)
    assert [t.finish_reason for t in trajs] == ["answer"] + ["error"] * 5 + ["answer"]
    assert "record 'none': 'question' must be a non-empty string" in trajs[1].error
    assert "lone surrogate" in trajs[4].error and "device lost" in trajs[5].error
    assert [t.question.get("id") for t in trajs[:2]] == ["q1", "none"]
    # a failed first attempt has nothing to continue: the second attempt fails alone too
    second = loop.continue_many([(trajs[1], [{"role": "user", "content": "again"}]),
                                 (trajs[0], [{"role": "user", "content": "again"}])])
    assert [t.finish_reason for t in second] == ["error", "answer"] and second[1].attempt == 2
    assert "no sampled turn to continue" in second[0].error
    t2, ref = second[1], chat.render(tok, second[1].messages, mode="train")
    closing = chat.close_assistant_turn(tok, t2.tokens)
    assert t2.tokens + closing == list(ref.ids)  # the first attempt is context (mask 0) by design
    assert t2.loss_mask == [0] * t2.prompt_len + list(ref.loss_mask[t2.prompt_len:len(t2.tokens)])


def _tool_turn(n):
    return {"role": "assistant", "content": call("search", {"query": "capital"}), "reasoning_content": "r" * n}


@pytest.mark.parametrize("max_len,turns,want", [
    (40, [ANSWER], "length"),                      # the prompt alone does not fit
    (None, [_tool_turn(400)], "length"),           # a turn fills the cache in its reasoning
    (None, [{"role": "assistant", "content": "x" * 900}], "length"),  # cut answer turn
    (None, [_tool_turn(1)] * 6, "length"),         # tool responses no longer fit
    (10 ** 6, [_tool_turn(1)] * 2 + [ANSWER], "answer"),
])
def test_context_limits_end_with_length_and_match_the_engine(setup, max_len, turns, want):
    registry, tok = setup
    loop = make_loop(tok, registry, turns, max_turns=8, engine_cls=LimitedEngine, max_len=max_len or 300)
    (t,) = loop.run([Q])
    assert t.finish_reason == want, (t.finish_reason, t.error)
    assert len(t.tokens) == len(t.loss_mask) == len(t.logprobs)
    if t.turn_spans:
        assert loop.engine.released[-1] == t.tokens  # the loop's tokens are the engine's
        assert len(t.tokens) <= loop.engine.max_len
    else:  # refused before sampling: the prompt is kept as context
        assert t.tokens == chat.render(tok, t.messages, add_generation_prompt=True, mode="train").ids
    if want == "length":
        assert t.error is None or "max_len" in t.error


def test_agent_config_rejects_empty_budgets():
    for field in ("max_turns", "max_tokens_per_turn", "max_tool_calls_per_turn", "max_parallel_episodes"):
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ValueError, match=field):
                AgentConfig(**{field: bad})


def test_retrieval_over_corpora_without_words_is_a_clear_error():
    """Stopword-only or one-letter documents used to crash inside bm25s (max() of an empty sequence)."""
    for texts in (["the the", "a"], ["x"], ["!!!"]):
        with pytest.raises(retrieval.RetrievalError, match="no indexable words"):
            retrieval.BM25Index.from_texts(texts)
    with pytest.raises(retrieval.RetrievalError, match="empty corpus"):
        retrieval.BM25Index.from_texts([])
    idx = retrieval.BM25Index.from_texts(["Paris is the capital of France", "the of", "Berlin Germany"])
    hits = idx.search(["", "the", "capital Paris", "zzz"], 3)
    assert [[d["id"] for d, _ in h] for h in hits] == [[], [], ["0"], []]


@pytest.mark.parametrize("limit", [1, 5, 40, 79, 80, 81, 100, 1000])
def test_truncate_middle_respects_the_limit(limit):
    text = "".join(chr(ord("a") + i % 26) for i in range(5000))
    out = truncate_middle(text, limit)
    assert len(out) <= limit
    if "truncated" in out:  # head and tail are the text's own
        head, tail = out.split("\n\n[...")[0], out.split("...]\n\n")[-1]
        assert text.startswith(head) and text.endswith(tail)
    else:
        assert out == text[:limit]
    assert truncate_middle("short", limit) == ("short" if limit >= 5 else "short"[:limit])


@pytest.mark.parametrize("data,ext,kind,needle", [
    (b"\xff\xfeH\x00i\x00 \x00t\x00h\x00e\x00r\x00e\x00", ".txt", None, "Hi there"),   # UTF-16 LE with BOM
    (b"\xfe\xff\x00H\x00i", ".md", None, "Hi"),                                        # UTF-16 BE with BOM
    (b"caf\xe9 cr\xe8me", ".txt", None, "café crème"),                                 # latin-1 text
    (b"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00", ".txt", "unsupported", "binary"),     # binary named .txt
    (b"\x00\x01\x02", "", "unsupported", "binary"),
])
def test_file_reader_decodes_or_refuses_non_utf8(tmp_path, data, ext, kind, needle):
    path = tmp_path / f"f{ext}"
    path.write_bytes(data)
    out = tools.get("file_reader", root=None).call({"path": str(path)})
    assert out.error_kind == kind and needle in out.text and "\x00" not in out.text


def test_file_reader_missing_and_bad_paths(tmp_path):
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "a.txt").write_text("inside")
    reader = tools.get("file_reader", root=str(tmp_path / "inner"))
    assert reader.call({"path": "a.txt"}).text == "inside"
    assert reader.call({"path": "nope.txt"}).error_kind == "not_found"
    assert reader.call({"path": "a.txt\x00.md"}).error_kind == "bad_arguments"
    assert reader.call({"path": ""}).error_kind == "bad_arguments"


NULLABLE = {"type": "object", "properties": {"k": {"type": ["integer", "null"]}, "n": {"type": "number"},
                                             "x": {"type": "custom"}}}


@pytest.mark.parametrize("args,want", [
    ({"k": None}, {"k": None}), ({"k": 3.0}, {"k": 3}), ({"k": "3"}, "integer or null, got string"),
    ({"k": True}, "integer or null, got boolean"), ({"n": True}, "number, got boolean"), ({"x": [1]}, {"x": [1]}),
])
def test_schema_type_lists_and_unknown_types(args, want):
    """A custom tool's ["integer", "null"] or non-standard type used to raise KeyError out of
    Tool.call (and so out of the registry) instead of validating."""
    if isinstance(want, dict):
        assert validate_arguments(NULLABLE, args) == want
    else:
        with pytest.raises(ToolError, match=want):
            validate_arguments(NULLABLE, args)


def test_second_attempt_survives_a_lost_session_and_a_full_cache(setup):
    """continue_many on kept sessions: an engine refusing the append used to raise out of the whole
    batch; now that attempt re-prefills. A prefix with no room left ends "length"."""
    registry, tok = setup

    class LosingEngine(LimitedEngine):
        def append(self, sid, ids, then_resume=None):
            if self._sessions[sid].get("lose"):
                raise ValueError(f"unknown session id {sid}")
            super().append(sid, ids, then_resume)

    loop = make_loop(tok, registry, [ANSWER], engine_cls=LosingEngine, max_len=400)
    first = loop.run([Q, {**Q, "id": "q2"}], keep_sessions=True)
    assert all("session_id" in t.extras for t in first)
    loop.engine._sessions[first[0].extras["session_id"]]["lose"] = True
    critique = [{"role": "user", "content": "Check again."}]
    second = loop.continue_many([(t, critique) for t in first])
    assert [t.finish_reason for t in second] == ["answer", "answer"]
    assert [t.tokens[:len(f.tokens)] for t, f in zip(second, first)] == [f.tokens for f in first]
    full = make_loop(tok, registry, [ANSWER], engine_cls=LimitedEngine, max_len=len(first[0].tokens) + 3)
    (kept,) = full.run([Q], keep_sessions=True)
    (again,) = full.continue_many([(kept, critique)])
    assert again.finish_reason == "length" and "max_len" in again.error and not again.turn_spans
