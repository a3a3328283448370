"""The agent pipeline's Agent-RRM without a synthetic world: rrm_sft on GSM8K-style rows with
worked solutions, then the trained RRM judges held-out annotated trajectories and the policy's own
evaluated ones, and the run reports each set's judge quality and Reagent-C's attempt 1 vs 2."""
import json

from reagent_jax.pipelines import agent as agent_pipeline
from reagent_jax.worlds import gsm8k_annotator


def _rows(path, n, offset=0):
    rows = []
    for i in range(offset, offset + n):
        a, b = i + 2, i + 3
        rows.append({"id": f"r/{i}", "question": f"Tom has {a} apples and buys {b} more, then doubles them. How many?",
                     "answer": [str(2 * (a + b))], "data_source": "gsm8k", "source": "gsm8k",
                     "meta": {"solution": f"He has {a}+{b} = <<{a}+{b}={a + b}>>{a + b} apples.\n"
                                          f"Doubled: {a + b}*2 = <<{a + b}*2={2 * (a + b)}>>{2 * (a + b)}.\n"
                                          f"#### {2 * (a + b)}"}})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_rrm_sft_on_worked_solutions_then_judge_quality_on_held_out(tmp_path, capsys):
    from tests.test_configs import _load
    c = _load("quickstart")
    del c["world"]
    c.data = type(c.rrm)(dict(train_path=_rows(tmp_path / "train.jsonl", 8), sft_path="", sft_from="solutions",
                              eval_path=_rows(tmp_path / "test.jsonl", 3, offset=50)))
    c.tokenizer.kind = "qwen3"
    c.stages = "rrm_sft"
    c.agent.tools = "python"
    c.model.update(dict(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16))
    c.rrm_sft.update(dict(steps=2, batch_size=2, max_len=1024, num_examples=6))
    c.rrm.update(dict(max_len=1024, max_new_tokens=8))
    c.rollout.update(dict(num_slots=4, max_len=512, prefill_chunk=128))
    c.agent.update(dict(max_turns=1, max_tokens_per_turn=8))
    c.eval.update(dict(num_questions=3, max_turns=1, rrm_items=2, refinement=True))  # Reagent-C with this RRM
    c.rrm.judge = "local"
    workdir = tmp_path / "run"
    summary = agent_pipeline.run(c, str(workdir))
    rrm = summary["rrm"]
    assert set(rrm) == {"annotated", "random_init"}
    assert rrm["annotated"]["n"] == 2 and rrm["random_init"]["n"] == 3
    for q in rrm.values():  # a 1-layer model after 2 steps: its 8-token replies are judged, not assumed
        assert 0 <= q["format_valid"] <= q["n"] and sum(q["statuses"].values()) == q["n"]
    lines = [json.loads(line) for line in open(workdir / "rrm_eval.jsonl")]
    assert [line["set"] for line in lines] == ["annotated"] * 2 + ["random_init"] * 3
    evaluated = [json.loads(line) for line in open(workdir / "eval_random_init.jsonl")]
    records = {r["id"]: r for r in map(json.loads, open(c.data.eval_path))}
    assert [(line["id"], line["target"], line["step"]) for line in lines[2:]] == [  # labelled by the annotator
        (t["id"], 0.0, gsm8k_annotator.annotate(records[t["id"]], t["messages"]).step) for t in evaluated]
    assert "Agent-RRM on annotated: format-valid" in capsys.readouterr().out
    assert (workdir / "rrm_sft" / "final").is_dir()
    pairs = {(d["before"], d["after"]): d for d in summary["comparisons"]}
    refined = pairs[("attempt 1 (Reagent-C)", "attempt 2 (critique)")]  # paired over the same 3 questions
    assert refined["n"] == 3 and refined["lo"] <= refined["estimate"] <= refined["hi"]
    selective = pairs[("attempt 1 (Reagent-C)", "attempt 2 where RRM score < 0.5")]  # read off the same attempts
    assert selective["n"] == 3
    lines = [json.loads(line) for line in open(workdir / "refinement.jsonl")]
    assert [line["id"] for line in lines] == [r["id"] for r in records.values()]
