"""Agent-RRM data edges: prompts for unusual trajectories, judges that fail in every way, annotation
resume, the rule annotator's missing answer, and the RRM GRPO reward on edge-case targets."""

import json
import math

import pytest

from reagent_jax import chat, rrm, worlds
from reagent_jax.endpoints import EndpointConfig
from reagent_jax.rrm.base import ENDPOINT_ERROR
from reagent_jax.rrm.remote import RemoteJudge
from reagent_jax.rrm.remote_annotation import annotate_file
from reagent_jax.rrm.training import RRMCollect, rrm_reward
from reagent_jax.worlds import rrm_annotator
from tests.fake_openai_server import FakeOpenAIServer, delayed, drop, error, malformed, missing_choices

Q = "Wie viel ist 6×7? 🤔"
GOOD = "<think>Looked it up.</think>\n<critique>Sound.</critique>\n<score>0.9</score>"


def call(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


# ---- prompt ---------------------------------------------------------------------------------------
LONG = "Ä" * 40 + "MIDDLE" + "z" * 40
PROMPT_CASES = {  # trajectory -> pieces that must appear in this order in the user turn
    "no_tool_calls": ([{"role": "user", "content": Q}, {"role": "assistant", "content": "<think>rechnen</think>\\boxed{42}"}],
                      ["Reasoning:\nrechnen", "Message:\n\\boxed{42}"]),
    "many_tool_calls": ([{"role": "assistant", "content": "", "tool_calls": [call("python", {"code": f"print({i})"})
                                                                                for i in range(12)]}]
                        + [{"role": "tool", "content": f"out-{i}"} for i in range(12)],
                        [f'Tool call {i + 1}: python {{"code": "print({i})"}}' for i in range(12)]
                        + [f"Tool response (python)\nout-{i}" for i in range(12)]),
    "tool_error": ([{"role": "assistant", "content": "", "tool_calls": [call("search", "{broken")]},
                    {"role": "tool", "name": "error", "content": "Error: arguments are not JSON"}],
                   ["search {broken  (arguments are not valid JSON)", "Tool response (error)\nError: arguments"]),
    "reasoning_content": ([{"role": "assistant", "content": "<think>inline</think>Antwort: \\boxed{42}",
                            "reasoning_content": "server-side ✓"}],
                          ["Reasoning:\nserver-side ✓\ninline", "Message:\nAntwort: \\boxed{42}"]),
    "missing_final_answer": ([{"role": "assistant", "content": "", "tool_calls": [call("search", {"query": "Zürich"})]},
                              {"role": "tool", "name": "search", "content": "nichts"}],
                             ['search {"query": "Zürich"}', "Tool response (search)\nnichts"]),
    "only_reasoning": ([{"role": "assistant", "content": "", "reasoning_content": "cut off while thinking"}],
                       ["[1] Assistant\nReasoning:\ncut off while thinking"]),
}


@pytest.mark.parametrize("name", sorted(PROMPT_CASES))
def test_prompt_renders_unusual_trajectories_in_order_and_deterministically(name):
    trajectory, pieces = PROMPT_CASES[name]
    user = rrm.build_rrm_messages(Q, trajectory)[1]["content"]
    pos = -1
    for piece in pieces:
        found = user.find(piece, pos + 1)
        assert found > pos, f"{piece!r} missing or out of order in\n{user}"
        pos = found
    assert user.count(Q) == 1
    again = rrm.build_rrm_messages(Q, json.loads(json.dumps(trajectory)))  # an equal copy: the same prompt
    assert again == rrm.build_rrm_messages(Q, trajectory)


@pytest.mark.parametrize("limit", [2, 3, 10, 85, 86, 200])
def test_long_tool_output_truncation_is_exact(limit):
    traj = [{"role": "assistant", "content": "", "tool_calls": [call("browse", {"url": "u"})]},
            {"role": "tool", "content": LONG}]
    user = rrm.build_rrm_messages(Q, traj, max_tool_chars=limit)[1]["content"]
    body = user.split("Tool response (browse)\n", 1)[1].split("\n\nReview the whole attempt", 1)[0]
    if len(LONG) <= limit:
        assert body == LONG
    else:  # reference: first limit//2 and last limit - limit//2 characters, the count of the rest
        head, tail = limit // 2, limit - limit // 2
        note = f"[... {len(LONG) - limit} characters omitted from the middle of this tool output ...]"
        assert body == f"{LONG[:head]}\n{note}\n{LONG[-tail:]}"


@pytest.mark.parametrize("tools", ["search", {"type": "function", "function": {"name": "search"}}, 5, ["ok", 7]])
def test_bad_tools_are_a_clear_error_not_a_list_of_characters(tools):
    with pytest.raises(ValueError, match="tools"):
        rrm.build_rrm_messages(Q, [{"role": "assistant", "content": "x"}], tools=tools)


def test_unnamed_tool_response_is_labelled_by_its_own_turn():
    traj = [{"role": "assistant", "content": "", "tool_calls": [call("search", {"query": "a"})]},
            {"role": "assistant", "content": "", "tool_calls": [call("python", {"code": "print(1)"})]},
            {"role": "tool", "content": "1"}]  # the search never got a response
    user = rrm.build_rrm_messages(Q, traj)[1]["content"]
    assert "Tool response (python)\n1" in user and "Tool response (search)" not in user


# ---- remote judge failures -------------------------------------------------------------------------
BEHAVIOURS = {  # marker in the trajectory -> (server behaviour, expected status)
    "OKAY": (GOOD, rrm.JudgementStatus.OK),
    "GARBAGE": ("no tags, just prose", rrm.JudgementStatus.MISSING_SCORE),
    "NOSCORE": ("<think>a</think><critique>b</critique><score>great</score>", rrm.JudgementStatus.BAD_SCORE),
    "EMPTY": ("", rrm.JudgementStatus.MISSING_SCORE),
    "HTTP500": (error(500), ENDPOINT_ERROR),
    "HTTP400": (error(400), ENDPOINT_ERROR),
    "TIMEOUT": (delayed(GOOD, 60.0), ENDPOINT_ERROR),  # the wait ends when the server stops
    "MALFORMED": (malformed(), ENDPOINT_ERROR),
    "NOCHOICES": (missing_choices(), ENDPOINT_ERROR),
    "DROP": (drop(), ENDPOINT_ERROR),
}


def reply_by_marker(body):
    text = body["messages"][-1]["content"]
    return next(b for marker, (b, _) in BEHAVIOURS.items() if f"MARK-{marker}" in text)


def traj(marker):
    return [{"role": "user", "content": Q}, {"role": "assistant", "content": f"MARK-{marker} \\boxed{{42}}"}]


def cfg(server, **kw):
    # timeout_s: long enough for a loaded machine, short enough that the TIMEOUT item costs little
    base = dict(base_urls=(server.base_url,), model="rrm", max_retries=0, timeout_s=3.0, backoff_base_s=0.01,
                backoff_max_s=0.02)
    return EndpointConfig(**(base | kw))


def test_every_failure_gets_an_explicit_status_and_the_batch_continues():
    markers = list(BEHAVIOURS) + ["OKAY"]
    with FakeOpenAIServer(reply=reply_by_marker) as server, RemoteJudge(cfg(server), fallback_score=0.3) as judge:
        out = judge.judge_many([(Q, traj(m)) for m in markers])
        stats = judge.stats_dict()
    assert [j.status for j in out] == [BEHAVIOURS[m][1] for m in markers]
    for j in out:  # a failure is never a silent score: the fallback comes with a non-ok status
        assert j.score == (0.9 if j.ok else 0.3)
    assert stats["rrm/n"] == len(markers) and stats["rrm/count/ok"] == 2
    assert stats["rrm/count/endpoint_error"] == 6


class ShortClient:
    """Wraps a ChatClient but drops the results of some items (a client that stops early)."""

    def __init__(self, inner, drop_indices):
        self.inner, self.drop_indices = inner, set(drop_indices)

    def iter_complete(self, messages_list, **params):
        for i, result in self.inner.iter_complete(messages_list, **params):
            if i not in self.drop_indices:
                yield i, result
                yield i, result  # a repeated index must not count twice

    def stats(self):
        return self.inner.stats()

    def close(self):
        self.inner.close()


def test_items_a_client_never_answers_become_endpoint_errors():
    from reagent_jax.endpoints import ChatClient

    with FakeOpenAIServer(reply=reply_by_marker) as server:
        client = ShortClient(ChatClient(cfg(server)), drop_indices={1, 3})
        with RemoteJudge(cfg(server), client=client) as judge:
            out = judge.judge_many([(Q, traj("OKAY"))] * 4)
            assert judge.stats.total == 4
        client.close()
    assert [j.status for j in out] == [rrm.JudgementStatus.OK, ENDPOINT_ERROR, rrm.JudgementStatus.OK, ENDPOINT_ERROR]


# ---- annotation ---------------------------------------------------------------------------------------
def write_rows(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows))


def read_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_row_with_bad_tools_is_counted_and_the_rest_is_annotated(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_rows(src, [{"id": "a", "question": Q, "trajectory": traj("OKAY")},
                     {"id": "bad", "question": Q, "trajectory": traj("OKAY"), "tools": "search"},
                     {"id": "b", "question": Q, "trajectory": traj("OKAY"), "tools": ["search"]}])
    with FakeOpenAIServer(reply=reply_by_marker) as server:
        summary = annotate_file(str(src), str(out), cfg(server), progress=False)
    assert (summary.bad_input, summary.sent, summary.written) == (1, 2, 2)
    assert "tools" in summary.examples[0] and sorted(r["id"] for r in read_rows(out)) == ["a", "b"]


class StopAfter:
    """A client that dies (KeyboardInterrupt) after `n` results: an interrupted annotation run."""

    def __init__(self, inner, n):
        self.inner, self.n = inner, n

    def iter_complete(self, messages_list, **params):
        for k, item in enumerate(self.inner.iter_complete(messages_list, **params)):
            if k == self.n:
                raise KeyboardInterrupt
            yield item

    def stats(self):
        return self.inner.stats()

    def close(self):
        self.inner.close()


def test_interrupted_annotation_resumes_without_duplicates_or_losses(tmp_path):
    from reagent_jax.endpoints import ChatClient

    markers = ["OKAY", "GARBAGE", "HTTP500", "OKAY", "NOSCORE", "OKAY", "OKAY", "HTTP500"]
    src = tmp_path / "in.jsonl"
    write_rows(src, [{"id": f"r{i}", "question": Q, "trajectory": traj(m)} for i, m in enumerate(markers)])
    with FakeOpenAIServer(reply=reply_by_marker) as server:
        ref_out, ref_rej = tmp_path / "ref.jsonl", tmp_path / "ref_rej.jsonl"  # the uninterrupted run
        annotate_file(str(src), str(ref_out), cfg(server), rejected_path=str(ref_rej), progress=False)
        out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
        inner = ChatClient(cfg(server, max_concurrency=1))
        with pytest.raises(KeyboardInterrupt):
            annotate_file(str(src), str(out), cfg(server), rejected_path=str(rej), progress=False,
                          judge=RemoteJudge(cfg(server), client=StopAfter(inner, 3)))
        inner.close()
        first = {r["id"] for r in read_rows(out) + read_rows(rej)}
        assert 0 < len(first) <= 3
        again = annotate_file(str(src), str(out), cfg(server), rejected_path=str(rej), progress=False)
    assert again.already_done == len(first) and again.sent == len(markers) - len(first)
    for got, want in ((out, ref_out), (rej, ref_rej)):
        rows = read_rows(got)
        assert len(rows) == len({r["id"] for r in rows})  # no id twice
        assert sorted(rows, key=lambda r: r["id"]) == sorted(read_rows(want), key=lambda r: r["id"])


# ---- rule annotator and RRM GRPO reward -----------------------------------------------------------------
def test_rule_annotator_empty_last_turn_is_no_answer():
    world = worlds.make_world(seed=0, n_entities=12, n_questions=20)
    q = world.questions[0]
    messages = worlds.expert_trajectory(world, q)[:-1] + [{"role": "assistant", "content": "",
                                                        "reasoning_content": "still thinking"}]
    a = rrm_annotator.annotate(q, messages)
    assert "no_answer" in a.flaws and "no_boxed" not in a.flaws and a.score == 0.0


OK_TEXT = "<think>ok</think><critique>fine</critique><score>{}</score>"


@pytest.mark.parametrize("score,target", [(0.8, 1.0), (0.8, 0.0), (0.0, 1.0), (1.0, 1.0), (0.25, 0.6), (0.5, 1)])
def test_rrm_reward_matches_the_formula(score, target):
    assert rrm_reward(OK_TEXT.format(score), target) == pytest.approx(1.0 - abs(score - target))


@pytest.mark.parametrize("target", [None, math.nan, math.inf, 1.5, -0.1, "0.5", True])
def test_rrm_reward_rejects_bad_targets(target):
    with pytest.raises(ValueError, match="target"):
        rrm_reward(OK_TEXT.format(0.5), target)


def test_rrm_grpo_format_ok_fraction_counts_well_formed_replies_not_positive_rewards():
    """An ok reply with score 0 on a target of 1 earns 0 but is well formed."""
    replies = [OK_TEXT.format(0.0), OK_TEXT.format(0.7), "garbage"]
    tok = chat.build_compact_tokenizer(replies + [Q, "question answer"], vocab_size=300)

    class Result:
        def __init__(self, text):
            self.tokens = tok.encode(text, add_special_tokens=False)
            self.logprobs = [0.0] * len(self.tokens)
            self.finish_reason = "stop"

    class Loop:
        class engine:  # noqa: N801 - mimics `loop.engine`
            @staticmethod
            def generate(prompts, sps):
                return [Result(replies[k % 3]) for k in range(len(prompts))]

    collect = RRMCollect(tok)
    records = [{"id": "r0", "question": Q, "trajectory": traj("OKAY"), "target": 1.0}]
    _, scores, groups, metrics = collect.collect(Loop(), records, n=3, seed=0)
    assert list(scores) == pytest.approx([0.0, 0.7, 0.0]) and list(groups) == [0, 0, 0]
    assert metrics["rrm/format_ok_frac"] == pytest.approx(2 / 3)
    class NoEngine:
        class engine:  # noqa: N801
            @staticmethod
            def generate(prompts, sps):
                raise AssertionError("a bad target is found before any sampling")

    with pytest.raises(ValueError, match="'r1'.*target"):
        collect.collect(NoEngine(), [records[0], records[0] | {"id": "r1", "target": 2.0}], n=1, seed=0)
