"""The evaluation harness end to end with a tiny random Qwen3 policy (a reagent_jax params dir in
the training workdir layout, with its compact tokenizer): a run writing every output, resume
(through launch/evaluate.py too) skipping scored questions, and Reagent-C refinement with a generic judge object and with
the policy itself as Agent-RRM and grader through the engine.

Every engine here has one shape (8 slots, max_len 2048, one prefill bucket) so the kernels
compile once for the file."""
import json
import logging
import os
import subprocess
import sys

import jax
import pytest

from reagent_jax import chat, checkpoint, models, rrm
from reagent_jax.agent import tools
from reagent_jax.agent.loop import AgentConfig, AgentLoop, DEFAULT_SYSTEM_PROMPT, FINAL_STEP_MESSAGE
from reagent_jax.data import load_benchmark
from reagent_jax.eval import from_config
from reagent_jax.eval.llm_judge import GRADER_SYSTEM_PROMPT
from reagent_jax.rollout import RolloutConfig
from reagent_jax.eval.harness import BenchmarkSpec, EvalSettings, Evaluator, tools_for
from reagent_jax.serve import build_engine, load_policy
from tests.fake_openai_server import FakeOpenAIServer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLLOUT = dict(num_slots=4, max_len=2048, prefill_chunk=256, decode_steps=8, length_buckets="256", row_buckets="4",
               window_buckets="2048")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """workdir/grpo/final (params) + workdir/tokenizer, as the training pipeline leaves them."""
    d = tmp_path_factory.mktemp("work")
    texts = [r["question"] for b in ("bamboogle", "gsm8k_full") for r in load_benchmark(b, limit=50)]
    # Trained on the prompts it will meet too, so the judges' long instructions take few tokens.
    prompts = [DEFAULT_SYSTEM_PROMPT, FINAL_STEP_MESSAGE, GRADER_SYSTEM_PROMPT, rrm.RRM_SYSTEM_PROMPT,
               rrm.build_refinement_message("x")["content"]]
    tok = chat.build_compact_tokenizer(texts + prompts, vocab_size=1024)
    tok.save_pretrained(str(d / "tokenizer"))
    cfg = models.preset("tiny", compute_dtype="float32", vocab_size=len(tok))
    checkpoint.save_params(str(d / "grpo" / "final"), cfg, models.init_params(cfg, jax.random.PRNGKey(0)))
    corpus = d / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"id": str(i), "title": f"Doc {i}", "text": t})
                                for i, t in enumerate(texts)) + "\n")
    return d


def config(workdir, **over):
    sys.path.insert(0, os.path.join(ROOT, "configs"))
    try:
        import evaluate_example
    finally:
        sys.path.pop(0)
    cfg = evaluate_example.get_config()
    cfg.policy.path = str(workdir / "grpo" / "final")
    cfg.benchmarks = f"bamboogle,gsm8k={ROOT}/../shared/data/benchmarks/gsm8k_full.jsonl"
    cfg.limit, cfg.k, cfg.max_parallel = 3, 2, 16
    cfg.agent.update(dict(max_turns=2, max_tokens_per_turn=24, temperature=1.0, include_tool_schemas=False))
    cfg.rollout.update(ROLLOUT)
    cfg.tools.search.update(dict(backend="local", corpus=str(workdir / "corpus.jsonl")))
    for k, v in over.items():
        node, leaf = cfg, k.split(".")
        for part in leaf[:-1]:
            node = node[part]
        node[leaf[-1]] = v
    return cfg


def grader(body):
    user = body["messages"][-1]["content"]
    return "<reasoning>r</reasoning><extracted_answer>x</extracted_answer><correct>" + (
        "yes" if "18" in user.split("Response:", 1)[1] else "no") + "</correct>"


def lines(path):
    return [json.loads(x) for x in open(path)]


def test_tool_sets_by_benchmark():
    assert tools_for("bamboogle", "bamboogle") == ("search", "browse")
    assert tools_for("gsm8k", "gsm8k") == ("python",) and tools_for("aime24") == ("python",)
    assert tools_for("gaia", "gaia") == tuple(tools.TOOL_NAMES)
    assert tools_for("mine", "unknown_source") == ("search", "browse", "python")
    with pytest.raises(ValueError, match="unknown tools"):
        tools_for("x", None, {"x": ("search", "telepathy")})


def test_evaluate_end_to_end_then_resume(workdir, tmp_path, caplog):
    out = tmp_path / "eval"
    judge = lambda server: {"scoring.method": "llm", "scoring.judge.base_url": server.base_url,
                            "scoring.judge.model": "grader"}
    with FakeOpenAIServer(reply=grader) as server:
        res = from_config.run(config(workdir, **judge(server)), str(out))
        assert server.count == 12  # 2 benchmarks x 3 questions x 2 samples, one grading request each
    assert {"results.jsonl", "summary.json", "results.md", "bamboogle.png", "gsm8k.png"} <= set(os.listdir(out))
    recs = lines(out / "results.jsonl")
    assert sorted((r["benchmark"], r["id"]) for r in recs) == sorted(
        [("bamboogle", f"bamboogle/{i}") for i in range(3)] + [("gsm8k", f"gsm8k/{i}") for i in range(3)])
    for r in recs:
        assert len(r["samples"]) == 2 and r["tools"] == (["python"] if r["benchmark"] == "gsm8k" else ["search", "browse"])
        for s in r["samples"]:
            t = s["trajectory"]
            assert [m["role"] for m in t["messages"][:3]] == ["system", "user", "assistant"]
            assert t["messages"][1]["content"] == r["question"] and 1 <= t["num_turns"] <= 2
            assert s["method"] in ("llm", "rule_fallback") and isinstance(s["correct"], bool)
    summary = json.load(open(out / "summary.json"))
    assert summary["benchmarks"] == json.loads(json.dumps(res["benchmarks"]))
    for name in ("bamboogle", "gsm8k"):
        b = summary["benchmarks"][name]
        assert b["questions"] == 3 and b["k"] == 2 and 0.0 <= b["avg@k"] <= b["pass@k"] <= 1.0
        assert sum(b["methods"].values()) == 6 and set(b["pass_curve"]) == {"1", "2"}
    table = open(out / "results.md").read()
    assert "| bamboogle" in table and "| gsm8k" in table and "avg@k %" in table and "pass@2 %" in table
    assert open(out / "bamboogle.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"

    # launch/evaluate.py on the same outdir: everything is scored already, so nothing runs again.
    os.remove(out / "results.md")
    with FakeOpenAIServer(reply=grader) as server:
        flags = [f"--config.{k}={v}" for k, v in {
            "policy.path": workdir / "grpo" / "final", "benchmarks": config(workdir).benchmarks, "limit": 3, "k": 2,
            "agent.max_turns": 2, "agent.max_tokens_per_turn": 24, "agent.temperature": 1.0,
            "agent.include_tool_schemas": False, "tools.search.backend": "local", "tools.search.corpus": workdir / "corpus.jsonl",
            **judge(server), **{f"rollout.{k}": v for k, v in ROLLOUT.items()}}.items()]
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "evaluate.py"), f"--outdir={out}", *flags],
                              capture_output=True, text=True, timeout=300, env={**os.environ, "REAGENT_NO_PROGRESS": "1"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert server.count == 0, proc.stderr[-3000:]
    assert lines(out / "results.jsonl") == recs and open(out / "results.md").read() == table
    assert table.splitlines()[2] in proc.stdout and "3 already scored, 0 to run" in proc.stderr

    # A changed setting (the sampling temperature) re-scores, naming what changed; the same
    # settings again skip everything (in process: the CLI path is the one above).
    with FakeOpenAIServer(reply=grader) as server, caplog.at_level(logging.INFO):
        from_config.run(config(workdir, **{"agent.temperature": 0.5}, **judge(server)), str(out))
        assert "0 already scored, 3 to run" in caplog.text
        assert "scored with other settings (agent.temperature: 1.0 -> 0.5)" in caplog.text
    assert len(lines(out / "results.jsonl")) == 12  # every question scored again, appended
    caplog.clear()
    with FakeOpenAIServer(reply=grader) as server, caplog.at_level(logging.INFO):
        from_config.run(config(workdir, **{"agent.temperature": 0.5}, **judge(server)), str(out))
        assert server.count == 0 and "3 already scored, 0 to run" in caplog.text
    recs = lines(out / "results.jsonl")[-6:]  # the re-scored lines (a later line replaces an earlier one)

    # Failed samples (here: prompts longer than a 40-token engine) are loud: counted, named, exit 1;
    # --config.max_failed_samples=-1 accepts them.
    with FakeOpenAIServer(reply=grader) as server:
        flags2 = [f for f in flags if not f.startswith("--config.agent.temperature")] + ["--config.agent.temperature=0.5"]
        bad = [f for f in flags2 if not f.startswith("--config.rollout.max_len")] + ["--config.rollout.max_len=40",
                                                                                    "--config.limit=1"]
        cmd = [sys.executable, os.path.join(ROOT, "launch", "evaluate.py"), f"--outdir={tmp_path / 'failing'}"]
        proc = subprocess.run(cmd + bad, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "REAGENT_NO_PROGRESS": "1"})
        assert proc.returncode == 1, proc.stdout[-3000:]
        assert "error: 4 sample(s) failed (bamboogle: 2, gsm8k: 2; first: bamboogle/0: " in proc.stderr
        assert "max_len=40" in proc.stderr and "max_failed_samples=0" in proc.stderr
        proc = subprocess.run(cmd + bad + ["--config.max_failed_samples=-1"], capture_output=True, text=True,
                              timeout=300, env={**os.environ, "REAGENT_NO_PROGRESS": "1"})
        assert proc.returncode == 0, proc.stderr[-3000:]

    # In process, 4 questions now: only the new one of each benchmark runs.
    with FakeOpenAIServer(reply=grader) as server:
        res = from_config.run(config(workdir, limit=4, **{"agent.temperature": 0.5}, **judge(server)), str(out))
        assert server.count == 4  # one new question per benchmark, 2 samples each
    recs2 = lines(out / "results.jsonl")
    assert recs2[6:12] == recs and sorted(r["id"] for r in recs2[12:]) == ["bamboogle/3", "gsm8k/3"]
    assert res["benchmarks"]["bamboogle"]["questions"] == 4 and res["benchmarks"]["bamboogle"]["questions_run"] == 1
    assert res["engine"]["requests"] == 4  # 2 new questions x 2 samples: nothing else went through the engine


class CritiqueJudge:
    """A judge object with judge_many, as the harness asks for (here: a fixed critique)."""

    def __init__(self):
        self.seen = []

    def judge_many(self, items):  # called from the episode threads
        self.seen.extend(items)
        return [rrm.parse_judgement("<think>t</think><critique>Search for the founding year first.</critique>"
                                    "<score>0.2</score>") for _ in items]


def test_reagent_c_with_a_generic_judge(workdir, tmp_path):
    policy = load_policy(str(workdir / "grpo" / "final"))
    engine = build_engine(policy, **RolloutConfig.from_config(ROLLOUT, "rollout").engine_kwargs())
    judge = CritiqueJudge()
    registry = tools.build_registry({"search": {"backend": "local", "corpus": str(workdir / "corpus.jsonl")}},
                                    names=["search", "browse"])
    try:
        ev = Evaluator(engine, policy.tokenizer, str(tmp_path), registry=registry,
                       agent_config=AgentConfig(max_turns=2, max_tokens_per_turn=24, include_tool_schemas=False),
                       settings=EvalSettings(k=2, refine=True), rrm_judge=judge, progress=False)
        out = ev.run([BenchmarkSpec("bamboogle", "bamboogle", ("search", "browse"), limit=2)])
    finally:
        engine.stop_background()
    assert sorted(r.question for r in judge.seen) == sorted(2 * [r["question"] for r in load_benchmark("bamboogle", limit=2)])
    for r in lines(tmp_path / "results.jsonl"):
        for s in r["samples"]:
            ref = s["refined"]
            assert ref["critique"] == "Search for the founding year first." and ref["rrm_score"] == pytest.approx(0.2)
            msgs = ref["trajectory"]["messages"]
            first = s["trajectory"]["messages"]
            assert msgs[:len(first)] == first  # the second attempt continues the first
            assert msgs[len(first)]["role"] == "user" and "Search for the founding year first." in msgs[len(first)]["content"]
            assert ref["trajectory"]["attempt"] == 2 and isinstance(ref["correct"], bool)
    b = out["benchmarks"]["bamboogle"]
    assert {"attempt2/avg@k", "attempt2/pass@k", "attempt2/delta", "attempt2/fixed", "attempt2/broken"} <= set(b)
    assert b["attempt2/delta"] == pytest.approx(b["attempt2/avg@k"] - b["avg@k"])
    with pytest.raises(ValueError, match="rrm_judge"):
        Evaluator(engine, policy.tokenizer, str(tmp_path / "x"), registry=registry, settings=EvalSettings(refine=True))


class BrokenJudge:
    def judge_many(self, items):
        raise RuntimeError("judge offline")


def test_failures_inside_a_sample_are_recorded_not_fatal(workdir, tmp_path, monkeypatch):
    policy = load_policy(str(workdir / "grpo" / "final"))
    engine = build_engine(policy, **RolloutConfig.from_config(ROLLOUT, "rollout").engine_kwargs())
    run_episode = AgentLoop.run_episode

    def flaky(self, record, sample_index=0, **kw):
        if sample_index == 1:
            raise RuntimeError("tool schema exploded")
        return run_episode(self, record, sample_index=sample_index, **kw)
    monkeypatch.setattr(AgentLoop, "run_episode", flaky)
    try:
        ev = Evaluator(engine, policy.tokenizer, str(tmp_path), registry=None,
                       agent_config=AgentConfig(max_turns=1, max_tokens_per_turn=8, include_tool_schemas=False),
                       settings=EvalSettings(k=2, refine=True), rrm_judge=BrokenJudge(), progress=False)
        out = ev.run([BenchmarkSpec("gsm8k", "gsm8k_full", (), limit=1)])
    finally:
        engine.stop_background()
    ok, failed = lines(tmp_path / "results.jsonl")[0]["samples"]
    assert ok["refined"]["critique"] == "" and ok["trajectory"]["finish_reason"] != "error"
    assert "gave no specific critique" in ok["refined"]["trajectory"]["messages"][len(ok["trajectory"]["messages"])]["content"]
    assert failed["trajectory"]["error"] == "RuntimeError: tool schema exploded" and failed["correct"] is False
    assert failed["refined"]["trajectory"]["finish_reason"] == "error"
    assert out["benchmarks"]["gsm8k"]["questions"] == 1 and "attempt2/avg@k" in out["benchmarks"]["gsm8k"]


def test_policy_as_its_own_judge_and_rrm_through_the_engine(workdir, tmp_path):
    """The tiny model's replies are not valid grades or judgements: every grade falls back to the
    rule and every critique to the fallback judgement, but the requests went through the engine."""
    cfg = config(workdir, limit=1, k=1, benchmarks="bamboogle", **{
        "scoring.method": "llm", "scoring.judge.kind": "policy", "scoring.judge.max_tokens": 16,
        "reagent_c.enabled": True, "reagent_c.judge.kind": "policy", "reagent_c.judge.max_tokens": 16})
    out = from_config.run(cfg, str(tmp_path))
    b = out["benchmarks"]["bamboogle"]
    assert b["questions"] == 1 and b["methods"] == {"rule_fallback": 1} and "attempt2/avg@k" in b
    # 1 episode + 1 RRM judgement + 1 second attempt + 2 grades, all on the policy's engine
    assert out["engine"]["requests"] == 5
    rec = lines(tmp_path / "results.jsonl")[0]
    assert all(s["judge"]["status"] in ("missing_label", "bad_label", "conflicting_labels", "loose_format")
               for s in rec["samples"])
