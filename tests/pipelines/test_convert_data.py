"""Dataset conversion (reagent_jax/pipelines/convert_data.py and its command line launch/convert_data.py) on small files in the layouts of the real downloads (JSONL, JSON, parquet):
every kind converts to rows its schema accepts and the library loads, odd rows are skipped and
counted with their file and row, and the command line reports errors without a traceback."""
import json
import logging
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reagent_jax import data
from reagent_jax.evalplanner.pairs import load_triples
from reagent_jax.pipelines import convert_data as cd

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "launch", "convert_data.py")  # the command line over reagent_jax.pipelines.convert_data


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


def read_jsonl(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def test_agent_rl_verl_parquet_with_nested_ground_truth(tmp_path):
    rows = [  # verl / Search-R1 layout: chat prompt, reward_model.ground_truth.target, data_source
        {"prompt": [{"role": "user", "content": "Who wrote Hamlet?"}], "data_source": "nq",
         "reward_model": {"style": "rule", "ground_truth": {"target": ["Shakespeare", "William Shakespeare"]}}},
        {"prompt": [{"role": "user", "content": "2+3?"}], "data_source": "gsm8k",
         "reward_model": {"style": "rule", "ground_truth": {"target": ["5"]}}},
    ]
    src = tmp_path / "train-00000.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)
    out = tmp_path / "rl.jsonl"
    stats = cd.convert("agent_rl", str(tmp_path), str(out))
    assert stats == {"written": 2, "skipped": 0, "reasons": []}
    got = [dict(r) for r in data.JsonlSource(str(out), data.AGENT_RL)]
    assert got == [{"question": "Who wrote Hamlet?", "answer": ["Shakespeare", "William Shakespeare"], "data_source": "nq"},
                   {"question": "2+3?", "answer": ["5"], "data_source": "gsm8k"}]


def test_agent_rl_reagent_fields_default_source_and_bad_rows(tmp_path):
    src = write_jsonl(tmp_path / "r.jsonl", [
        {"question": "What is 6*7?", "ground_truth": 42, "meta_info": {"source": "deepscaler"}},
        {"question": "Capital of Peru?", "ground_truth": "Lima"},          # no source: --data_source
        {"question": "", "ground_truth": "x", "data_source": "nq"},        # empty question: skipped
        "{not json",                                                        # skipped, with its row
        {"ground_truth": "y", "data_source": "nq"},                        # no question: skipped
    ])
    out = tmp_path / "o.jsonl"
    stats = cd.convert("agent_rl", src, str(out), data_source="search")
    assert stats["written"] == 2 and stats["skipped"] == 3
    assert any(":4: not valid JSON" in r for r in stats["reasons"])
    assert any(":5: no 'question' field" in r for r in stats["reasons"])
    assert read_jsonl(out) == [{"question": "What is 6*7?", "answer": ["42"], "data_source": "deepscaler"},
                               {"question": "Capital of Peru?", "answer": ["Lima"], "data_source": "search"}]
    with pytest.raises(cd.ConvertError, match=r":3: field 'question' is empty"):
        cd.convert("agent_rl", src, str(tmp_path / "x.jsonl"), data_source="search", on_error="raise")
    assert not os.path.exists(tmp_path / "x.jsonl") and not os.path.exists(tmp_path / "x.jsonl.tmp")


def test_agent_sft_sharegpt_and_hermes_tool_call_text(tmp_path):
    rows = [{"conversations": [
        {"from": "system", "value": "Use tools."},
        {"from": "human", "value": "Capital of France?"},
        {"from": "gpt", "value": "<think>\nLook it up.\n</think>\n\n<tool_call>\n"
                                 '{"name": "search", "arguments": {"query": "capital of France"}}\n</tool_call>'},
        {"from": "observation", "value": "Paris is the capital of France."},
        {"from": "gpt", "value": "\\boxed{Paris}"}],
        "tools": json.dumps([{"type": "function", "function": {"name": "search", "parameters": {}}}])}]
    src = tmp_path / "sft.json"
    src.write_text(json.dumps(rows))
    out = tmp_path / "sft.jsonl"
    assert cd.convert("agent_sft", str(src), str(out))["written"] == 1
    row = next(iter(data.JsonlSource(str(out), data.AGENT_SFT)))
    roles = [m["role"] for m in row["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    call = row["messages"][2]
    assert call["tool_calls"][0]["function"] == {"name": "search", "arguments": {"query": "capital of France"}}
    assert "<tool_call>" not in call["content"] and call["reasoning_content"].strip() == "Look it up."
    assert row["tools"][0]["function"]["name"] == "search"
    # the converted conversation renders with the library's chat template
    from reagent_jax import chat
    r = chat.render(chat.load_tokenizer(None), row["messages"], tools=row["tools"])
    assert sum(r.loss_mask) > 0 and "<tool_call>" in r.text


def test_rrm_sft_from_judgement_text_and_rrm_rl_labels(tmp_path):
    traj = [{"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "\\boxed{Lyon}"}]
    src = write_jsonl(tmp_path / "rrm.jsonl", [
        {"trajectory": traj, "output": "<think>No search was made.</think>\n<critique>Search before answering."
                                       "</critique>\n<score>0.1</score>"},
        {"question": "Q?", "trajectory": traj, "output": "no tags here"},   # does not parse: skipped
        {"question": "Q?", "trajectory": traj, "think": "t", "critique": "", "score": 1.0},
    ])
    out = tmp_path / "rrm_sft.jsonl"
    stats = cd.convert("rrm_sft", src, str(out))
    assert stats["written"] == 2 and "does not parse" in stats["reasons"][0]
    rows = [dict(r) for r in data.JsonlSource(str(out), data.RRM_SFT)]
    assert rows[0]["question"] == "Capital of France?"  # taken from the first user turn
    assert (rows[0]["think"], rows[0]["critique"], rows[0]["score"]) == ("No search was made.",
                                                                         "Search before answering.", 0.1)
    src2 = write_jsonl(tmp_path / "rl.jsonl", [{"question": "Q?", "messages": traj, "label": False},
                                               {"question": "Q?", "messages": traj, "reward": 0.75}])
    out2 = tmp_path / "rrm_rl.jsonl"
    cd.convert("rrm_rl", src2, str(out2))
    assert [r["target"] for r in data.JsonlSource(str(out2), data.RRM_RL)] == [0.0, 0.75]


def test_pairwise_rewardbench_rmbench_judgebench_and_chat_lists(tmp_path):
    rb = tmp_path / "rb.parquet"  # RewardBench: prompt, chosen, rejected, subset, id
    pq.write_table(pa.Table.from_pylist([
        {"prompt": "Say hi", "chosen": "Hi!", "rejected": "No.", "subset": "alpacaeval-easy", "id": 30},
        {"prompt": "Same", "chosen": "x", "rejected": "x", "subset": "refusals", "id": 31},  # identical: skipped
    ]), rb)
    rm = write_jsonl(tmp_path / "rm.jsonl", [  # RM-Bench: 3 chosen x 3 rejected styles
        {"id": 7, "prompt": "2+2?", "chosen": ["4", "**4**", "It is 4."], "rejected": ["5", "**5**", "It is 5."],
         "domain": "math"}])
    jb = write_jsonl(tmp_path / "jb.jsonl", [  # JudgeBench: response_A / response_B + label
        {"pair_id": "p1", "question": "Q1", "response_A": "bad", "response_B": "good", "label": "B>A",
         "source": "mmlu-pro"},
        {"pair_id": "p2", "question": "Q2", "response_A": "a", "response_B": "b", "label": "A=B"}])  # skipped
    hh = write_jsonl(tmp_path / "hh.jsonl", [  # chosen / rejected as whole chats, no instruction field
        {"chosen": [{"role": "user", "content": "Tell a joke"}, {"role": "assistant", "content": "Knock knock."}],
         "rejected": [{"role": "user", "content": "Tell a joke"}, {"role": "assistant", "content": "No."}]}])
    out = tmp_path / "pairs.jsonl"
    stats = cd.convert("pairwise", ",".join([str(rb), rm, jb, hh]), str(out))
    assert stats["written"] == 1 + 9 + 1 + 1 and stats["skipped"] == 2
    triples = load_triples(str(out))
    by_id = {t.id: t for t in triples}
    assert (by_id["30"].instruction, by_id["30"].chosen, by_id["30"].category) == ("Say hi", "Hi!", "alpacaeval-easy")
    assert by_id["7/c1-r2"].chosen == "**4**" and by_id["7/c1-r2"].rejected == "It is 5."
    assert (by_id["p1"].chosen, by_id["p1"].rejected, by_id["p1"].category) == ("good", "bad", "mmlu-pro")
    joke = next(t for t in triples if t.instruction == "Tell a joke")
    assert (joke.chosen, joke.rejected) == ("Knock knock.", "No.")


def test_benchmark_gaia_layout_and_field_map(tmp_path):
    src = write_jsonl(tmp_path / "gaia.jsonl", [
        {"task_id": "abc", "Question": "How many legs has a spider?", "Final answer": "8", "Level": 1,
         "file_name": ""}])
    out = tmp_path / "gaia_local.jsonl"
    cd.convert("benchmark", src, str(out), data_source="gaia")
    rows = data.load_benchmark(str(out))
    assert rows[0]["id"] == "gaia/abc" and rows[0]["answer"] == ["8"] and rows[0]["source"] == "gaia"
    assert rows[0]["meta"] == {"Level": 1, "file_name": ""}
    src2 = write_jsonl(tmp_path / "odd.jsonl", [{"q_text": "2+2?", "gold": {"value": 4}}])
    out2 = tmp_path / "odd_out.jsonl"
    cd.convert("agent_rl", src2, str(out2), field_map=cd.parse_field_map("question=q_text,answer=gold.value"),
               data_source="gsm8k")
    assert read_jsonl(out2) == [{"question": "2+2?", "answer": ["4"], "data_source": "gsm8k"}]
    with pytest.raises(ValueError, match="TARGET=SOURCE"):
        cd.parse_field_map("answer")


def test_command_line(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"question": "Q?", "answer": "A", "data_source": "nq"}] * 3)
    out = tmp_path / "out" / "rl.jsonl"
    env = dict(os.environ, PYTHONPATH=ROOT)
    ok = subprocess.run([sys.executable, SCRIPT, "--kind=agent_rl", f"--input={src}", f"--output={out}", "--limit=2"],
                        capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "wrote 2 agent_rl rows" in ok.stdout and len(read_jsonl(out)) == 2
    bad = subprocess.run([sys.executable, SCRIPT, "--kind=agent_sft", f"--input={src}", f"--output={out}"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 1 and "no row of" in bad.stderr and "no 'messages' field" in bad.stderr
    assert "Traceback" not in bad.stderr and len(read_jsonl(out)) == 2  # the earlier output is untouched
    seen = subprocess.run([sys.executable, SCRIPT, "--inspect", f"--input={src}"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert seen.returncode == 0 and "fields: ['answer', 'data_source', 'question']" in seen.stdout
    missing = subprocess.run([sys.executable, SCRIPT, "--kind=pairwise", f"--input={tmp_path}/nope.jsonl",
                              f"--output={out}"], capture_output=True, text=True, env=env, timeout=120)
    assert missing.returncode == 1 and "nothing matches" in missing.stderr


def test_rrm_sft_messages_train_the_rrm_with_the_sft_stage(tmp_path):
    """rrm_sft_messages rows are agent_sft conversations: the Agent-RRM prompt, then the judgement."""
    from reagent_jax import chat, rrm
    traj = [{"role": "system", "content": "agent system prompt"}, {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "\\boxed{Lyon}"}]
    src = write_jsonl(tmp_path / "rrm.jsonl", [{"question": "Capital of France?", "trajectory": traj, "think": "t",
                                                "critique": "Search first.", "score": 0.2}])
    out = tmp_path / "rrm_msgs.jsonl"
    cd.convert("rrm_sft_messages", src, str(out))
    row = next(iter(data.JsonlSource(str(out), data.AGENT_SFT)))
    msgs = row["messages"]
    assert msgs[:-1] == rrm.build_rrm_messages("Capital of France?", traj[1:])  # system turn left out
    assert msgs[-1] == {"role": "assistant", "content": rrm.render_judgement("t", "Search first.", 0.2)}
    j = rrm.parse_judgement(msgs[-1]["content"])
    assert (j.critique, j.score, j.ok) == ("Search first.", 0.2, True)
    r = chat.render(chat.load_tokenizer(None), msgs, mode="train")
    # the template renders the judgement's <think> block as the Qwen3 reasoning block: same blocks, parseable
    assert r.text.endswith("<critique>\nSearch first.\n</critique>\n<score>0.20</score><|im_end|>\n")
    assert sum(r.loss_mask) > 0


BOM = b"\xef\xbb\xbf"


def row(i, **over):
    return {"question": f"q{i}", "answer": [str(i)], "data_source": "nq", **over}


# ---- awkward files ----------------------------------------------------------------------------------
def convert(tmp_path, name, data, **kw):
    src = tmp_path / name
    src.write_bytes(data)
    out = tmp_path / "out.jsonl"
    stats = cd.convert("agent_rl", str(src), str(out), **kw)
    return stats, [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]


def lines_of(*rows):
    return b"\n".join(json.dumps(r).encode() for r in rows) + b"\n"


def test_convert_keeps_a_bom_row_and_skips_a_non_utf8_line_with_its_place(tmp_path):
    data = BOM + lines_of(row(1)) + b'{"question": "caf\xe9", "answer": "a", "data_source": "nq"}\n' + lines_of(row(3))
    stats, out = convert(tmp_path, "in.jsonl", data)
    assert [r["question"] for r in out] == ["q1", "q3"] and stats["skipped"] == 1
    assert stats["reasons"][0].startswith(f"{tmp_path / 'in.jsonl'}:2: not valid UTF-8")


@pytest.mark.parametrize("name, data", [
    ("lines.json", lines_of(row(1), row(2))),  # JSON Lines under a .json name
    ("bom.json", BOM + json.dumps([row(1), row(2)]).encode()),
    ("pretty.jsonl", json.dumps([row(1), row(2)], indent=2).encode()),  # an array under a .jsonl name
    ("wrapped.json", json.dumps({"data": [row(1), row(2)]}).encode()),
])
def test_convert_reads_json_documents_and_json_lines_whatever_the_name(tmp_path, name, data):
    stats, out = convert(tmp_path, name, data)
    assert [r["question"] for r in out] == ["q1", "q2"] and stats["skipped"] == 0


def test_convert_broken_json_array_and_empty_inputs_say_where(tmp_path):
    (tmp_path / "cut.json").write_text('[{"question": "q", "answer": "a",\n "data_source": ')
    with pytest.raises(cd.ConvertError, match=r"cut\.json:2: not valid JSON"):
        cd.convert("agent_rl", str(tmp_path / "cut.json"), str(tmp_path / "o.jsonl"))
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(cd.ConvertError, match="the inputs have no rows"):
        cd.convert("agent_rl", str(tmp_path / "empty.json"), str(tmp_path / "o.jsonl"))
    assert not os.path.exists(tmp_path / "o.jsonl") and not os.path.exists(tmp_path / "o.jsonl.tmp")


def test_convert_numeric_answers(tmp_path, caplog):
    data = (b'{"question": "a", "answer": NaN, "data_source": "nq"}\n'
            b'{"question": "b", "answer": [2.0, 0.5, 7], "data_source": "nq"}\n'
            b'{"question": "c", "answer": [Infinity], "data_source": "nq"}\n'
            b'{"question": "d", "answer": 1e300, "data_source": "nq"}\n'
            b'{"question": "e", "answer": 1234567890123456.0, "data_source": "nq"}\n')
    with caplog.at_level(logging.WARNING):
        stats, out = convert(tmp_path, "n.jsonl", data)
    assert [r["answer"] for r in out] == [["2", "0.5", "7"], ["1e+300"], ["1234567890123456"]]
    assert stats["skipped"] == 2 and all("not a usable value" in r for r in stats["reasons"])
