"""RemoteJudge and RRM SFT annotation end to end against fake OpenAI-compatible servers on loopback."""

import json
import os
import subprocess
import sys

import pytest

from reagent_jax.endpoints import EndpointConfig
from reagent_jax.rrm import JudgementStatus, build_rrm_messages, rrm_system_prompt
from reagent_jax.rrm.base import ENDPOINT_ERROR, Judge, JudgeRequest, judge_one
from reagent_jax.rrm.remote import RemoteJudge
from reagent_jax.rrm.remote_annotation import annotate_file, record_id
from tests.fake_openai_server import FakeOpenAIServer, error, ok

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOOD = ("<think>The agent looked the value up and used it.</think>\n<critique>Sound work.</critique>\n"
        "<score>0.9</score>")
BAD = "<think>It guessed.</think>\n<critique>Search before answering.</critique>\n<score>0.2</score>"


def rrm_reply(body):
    """A scripted Agent-RRM: the verdict depends on markers in the rendered trajectory."""
    text = body["messages"][-1]["content"]
    if "FAILME" in text:
        return error(500)
    if "GARBAGE" in text:
        return "I would rather not use tags today."
    if "SERVERTHINK" in text:  # thinking returned separately by a reasoning parser
        return ok("<critique>Fine.</critique>\n<score>0.7</score>", reasoning_content="Checked every step.")
    if "MULTIDIM" in text:
        return GOOD + "\n<scores>reasoning=0.8; tool_use=0.6; information_use=1.0</scores>"
    return GOOD if "\\boxed{42}" in text else BAD


def trajectory(final: str) -> list[dict]:
    return [
        {"role": "user", "content": "What is 6 times 7?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "python", "arguments": {"code": "print(6*7)"}}}]},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": final},
    ]


@pytest.fixture
def server():
    with FakeOpenAIServer(reply=rrm_reply) as s:
        yield s


def cfg(server_or_url, **kw):
    url = server_or_url if isinstance(server_or_url, str) else server_or_url.base_url
    return EndpointConfig(base_urls=(url,), model="rrm", max_retries=1, backoff_base_s=0.01, backoff_max_s=0.02,
                          timeout_s=5.0, **kw)


def test_remote_judge_end_to_end(server):
    items = [("What is 6 times 7?", trajectory("So \\boxed{42}.")),
             {"question": "What is 6 times 7?", "trajectory": trajectory("I guess \\boxed{41}.")},
             JudgeRequest("What is 6 times 7?", trajectory("GARBAGE \\boxed{42}")),
             ("What is 6 times 7?", trajectory("FAILME")),
             ("What is 6 times 7?", trajectory("SERVERTHINK \\boxed{42}"))]
    with RemoteJudge(cfg(server), fallback_score=0.1) as judge:
        assert isinstance(judge, Judge)
        out = judge.judge_many(items)
        stats = judge.stats_dict()
    assert [j.score for j in out] == [0.9, 0.2, 0.1, 0.1, 0.7]
    assert [j.status for j in out] == [JudgementStatus.OK, JudgementStatus.OK, JudgementStatus.MISSING_SCORE,
                                       ENDPOINT_ERROR, JudgementStatus.OK]
    assert out[0].critique == "Sound work." and out[1].critique == "Search before answering."
    assert out[4].think == "Checked every step."  # reasoning_content became the <think> block
    assert str(out[3].status) == "endpoint_error" and not out[3].ok and out[3].critique == ""
    assert stats["rrm/n"] == 5 and stats["rrm/count/endpoint_error"] == 1 and stats["rrm/count/ok"] == 3
    assert stats["rrm/count/missing_score"] == 1 and stats["rrm/endpoint/retries"] == 1  # FAILME retried once
    # the request is exactly the shared RRM prompt
    first = next(r["body"] for r in server.requests if "\\boxed{42}." in r["body"]["messages"][-1]["content"])
    assert first["messages"] == build_rrm_messages("What is 6 times 7?", trajectory("So \\boxed{42}."))
    assert first["model"] == "rrm"


def test_remote_judge_single_and_multi_dim(server):
    with RemoteJudge(cfg(server), multi_dim=True, tools=["search", "python"]) as judge:
        j = judge.judge("What is 6 times 7?", trajectory("MULTIDIM \\boxed{42}"))
        assert judge_one(judge, "What is 6 times 7?", trajectory("\\boxed{42}")).score == 0.9
    assert j.sub_scores == {"reasoning": 0.8, "tool_use": 0.6, "information_use": 1.0}
    system, user = server.requests[0]["body"]["messages"]
    assert system["content"] == rrm_system_prompt(multi_dim=True)
    assert "Tools the agent could call:\n- search\n- python" in user["content"]


def test_remote_judge_with_endpoint_down_never_raises():
    from tests.endpoints.test_client import closed_port_url

    with RemoteJudge(cfg(closed_port_url()), fallback_score=0.25) as judge:
        out = judge.judge_many([("q?", trajectory("\\boxed{1}"))] * 3)
        assert judge.stats_dict()["rrm/frac/endpoint_error"] == 1.0
    assert all(j.score == 0.25 and j.status == ENDPOINT_ERROR for j in out)


def test_remote_judge_rejects_bad_items_before_sending(server):
    with RemoteJudge(cfg(server)) as judge:
        with pytest.raises(ValueError, match="judge item 1: question"):
            judge.judge_many([("q?", trajectory("x")), ("", trajectory("x"))])
        with pytest.raises(ValueError, match="judge item 0: trajectory"):
            judge.judge_many([("q?", "not a list")])
    assert server.count == 0


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write(row if isinstance(row, str) else json.dumps(row))
            f.write("\n")


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def annotation_input(path):
    q = "What is 6 times 7?"
    rows = [{"id": "good", "question": q, "trajectory": trajectory("\\boxed{42}")},
            {"id": "wrong", "question": q, "messages": trajectory("\\boxed{41}")},
            {"question": q, "trajectory": trajectory("no id \\boxed{42}")},
            {"id": "garbage", "question": q, "trajectory": trajectory("GARBAGE")},
            {"id": "flaky", "question": q, "trajectory": trajectory("FAILME")},
            "this line is not JSON",
            {"id": "good", "question": q, "trajectory": trajectory("duplicate id")},
            {"id": "noq", "trajectory": trajectory("x")}]
    write_jsonl(path, rows)
    return rows


def test_annotate_end_to_end_with_resume(server, tmp_path):
    src, out, rej = tmp_path / "traj.jsonl", tmp_path / "sft" / "rrm_sft.jsonl", tmp_path / "rejected.jsonl"
    rows = annotation_input(src)
    summary = annotate_file(str(src), str(out), cfg(server), annotator="teacher-120b", rejected_path=str(rej),
                            progress=False)
    assert (summary.input_records, summary.bad_input, summary.duplicates) == (8, 2, 1)
    assert (summary.sent, summary.written, summary.endpoint_errors) == (5, 3, 1)
    assert summary.rejected == {"missing_score": 1} and len(summary.examples) == 3
    records = {r["id"]: r for r in read_jsonl(out)}
    no_id = record_id(rows[2])
    assert set(records) == {"good", "wrong", no_id}
    good = records["good"]
    assert set(good) == {"id", "question", "trajectory", "think", "critique", "score", "annotator", "status"}
    assert (good["score"], good["status"], good["annotator"]) == (0.9, "ok", "teacher-120b")
    assert good["critique"] == "Sound work." and good["trajectory"] == rows[0]["trajectory"]
    assert records["wrong"]["score"] == 0.2
    (rejected,) = read_jsonl(rej)
    assert rejected["id"] == "garbage" and rejected["status"] == "missing_score" and "rather not" in rejected["text"]

    # rerun: only the request that failed at the endpoint is sent again; now the endpoint answers it
    before = server.count
    server.reply = lambda body: GOOD
    with open(out, "a") as f:
        f.write('{"id": "half-writ')  # a crash in the middle of a line
    again = annotate_file(str(src), str(out), cfg(server), annotator="teacher-120b", rejected_path=str(rej),
                          progress=False)
    assert again.repaired_tail and again.already_done == 4 and again.sent == 1 and again.written == 1
    assert server.count - before == 1
    final = read_jsonl(out)  # every line parses: the cut-off line was removed
    assert sorted(r["id"] for r in final) == sorted(["good", "wrong", no_id, "flaky"])

    third = annotate_file(str(src), str(out), cfg(server), rejected_path=str(rej), progress=False)
    assert third.sent == 0 and third.already_done == 5 and server.count - before == 1


def test_annotate_accept_statuses_and_bad_config(server, tmp_path):
    src, out = tmp_path / "traj.jsonl", tmp_path / "out.jsonl"
    write_jsonl(src, [{"id": "a", "question": "q?", "trajectory": trajectory("GARBAGE")}])
    with pytest.raises(ValueError, match="unknown statuses"):
        annotate_file(str(src), str(out), cfg(server), accept_statuses=["okay"], progress=False)
    summary = annotate_file(str(src), str(out), cfg(server), accept_statuses=["ok", "missing_score"], progress=False)
    assert summary.written == 1 and read_jsonl(out)[0]["status"] == "missing_score"
    with pytest.raises(FileNotFoundError, match="not found"):
        annotate_file(str(tmp_path / "missing.jsonl"), str(out), cfg(server), progress=False)


def test_annotate_launch_script(server, tmp_path):
    src, out = tmp_path / "traj.jsonl", tmp_path / "out.jsonl"
    write_jsonl(src, [{"id": str(i), "question": "What is 6 times 7?", "trajectory": trajectory("\\boxed{42}")}
                      for i in range(4)])
    cmd = [sys.executable, os.path.join(REPO, "launch", "annotate.py"), f"--input={src}", f"--output={out}",
           f"--base_url={server.base_url}", "--model=teacher", "--concurrency=2", "--noprogress", "--max_retries=0"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["written"] == 4 and summary["sent"] == 4
    assert sorted(r["id"] for r in read_jsonl(out)) == ["0", "1", "2", "3"]
    assert server.max_in_flight <= 2
