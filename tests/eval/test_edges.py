"""Evaluation edge cases: pass@k against exact integer math, results and reports written then read
back, and the harness reporting (not dropping) broken rows and failed samples, and stopping
promptly without losing scored questions. The harness runs with a stub episode: no model."""
import collections
import functools
import json
import threading
from fractions import Fraction
from math import comb

import numpy as np
import pytest

from reagent_jax import chat
from reagent_jax.agent.trajectory import Trajectory
from reagent_jax.eval import harness, passk
from reagent_jax.eval.harness import BenchmarkSpec, EvalSettings, Evaluator
from reagent_jax.eval.report import benchmark_summary, table_rows, write_reports
from reagent_jax.eval.results import ResultStore


# ---- pass@k -----------------------------------------------------------------------------------------------
def exact_pass_at_k(n, c, k):
    """1 - C(n - c, k) / C(n, k) in exact rationals, rounded once."""
    return float(1 - Fraction(comb(n - c, k), comb(n, k)))


CASES = [(n, c, k) for n in (1, 2, 3, 7, 16, 100, 5000) for c in {0, 1, n // 2, n - 1, n} if 0 <= c <= n
         for k in {1, 2, n // 3 or 1, n - 1 or 1, n} if 1 <= k <= n]


@pytest.mark.parametrize("n, c, k", CASES + [(10**6, 1, 1), (10**6, 3, 2), (10**5, 10, 500), (2000, 1000, 999)])
def test_pass_at_k_equals_the_exact_estimator(n, c, k):
    assert passk.pass_at_k(n, c, k) == exact_pass_at_k(n, c, k)


def test_pass_at_1_is_exactly_c_over_n_and_edges():
    for n, c in ((5000, 1), (3, 1), (10**7, 7), (49, 48)):
        assert passk.pass_at_k(n, c, 1) == c / n
    assert passk.pass_at_k(9, 0, 9) == 0.0 and passk.pass_at_k(9, 9, 1) == 1.0 and passk.pass_at_k(9, 1, 9) == 1.0
    assert passk.pass_at_k(np.int64(6), np.int64(2), np.int64(3)) == exact_pass_at_k(6, 2, 3)
    for bad in ((5, 0, 6), (5, 5, 6)):  # k > n: no k distinct samples exist
        with pytest.raises(ValueError, match="1 <= k <= n"):
            passk.pass_at_k(*bad)


def test_mean_pass_at_k_and_curve_against_exact_means():
    table = [[True] * c + [False] * (8 - c) for c in range(9)]
    for k in range(1, 9):
        expected = sum(Fraction(1) - Fraction(comb(8 - c, k), comb(8, k)) for c in range(9)) / 9
        assert passk.mean_pass_at_k(table, k) == pytest.approx(float(expected), rel=1e-15)
    assert passk.pass_curve(table) == {k: passk.mean_pass_at_k(table, k) for k in range(1, 9)}


# ---- results file and reports round-trip --------------------------------------------------------------
def sample(correct, score=None, method="rule", finish="answer"):
    return {"correct": correct, "score": float(correct) if score is None else score, "method": method,
            "trajectory": {"finish_reason": finish, "num_turns": 2, "tool_calls": 1}}


def test_results_store_round_trips_odd_text_and_exact_floats(tmp_path):
    store = ResultStore(tmp_path / "r.jsonl")
    odd = {"benchmark": "b", "id": "q1", "question": "x\ud800 \u4e2d\u6587 \u2028",
           "samples": [sample(True, 0.1 + 0.2), sample(False, 1 / 3)]}
    store.append(odd)  # a lone surrogate from a tool or a file must not stop the run
    store.append({"benchmark": "b", "id": 7, "samples": [sample(False, 5e-324)]})
    again = ResultStore(tmp_path / "r.jsonl")
    assert [r["id"] for r in again] == ["q1", 7] and again.records("b")[0] == odd
    assert again.records("b")[1]["samples"][0]["score"] == 5e-324 and again.done("b", "7", k=1)


def test_failed_samples_count_wrong_and_incomplete_records_are_counted():
    records = [{"id": "a", "samples": [sample(True), sample(False, method="error")]},
               {"id": "b", "samples": [sample(True), sample(False, finish="error")]},
               {"id": "c", "samples": [sample(True)]}]  # fewer than k: left out, but counted
    s = benchmark_summary(records, k=2)
    assert s["questions"] == 2 and s["incomplete"] == 1 and s["failed"] == 2
    assert s["avg@k"] == 0.5 and s["pass@k"] == 1.0 and s["methods"] == {"rule": 3, "error": 1}
    row = table_rows({"bench": {**s, "skipped_rows": 3}})[0]
    assert (row["failed samples"], row["incomplete"], row["skipped rows"], row["avg@k %"]) == (2, 1, 3, 50.0)
    assert table_rows({"empty": {"questions": 0, "k": 2, "skipped_rows": 4}}) == [
        {"benchmark": "empty", "questions": 0, "skipped rows": 4}]


def test_write_reports_then_read_gives_the_same_numbers(tmp_path):
    rng = np.random.default_rng(1)
    records = [{"id": str(q), "samples": [sample(bool(x), float(s)) for x, s in zip(rng.random(4) < p, rng.random(4))]}
               for q, p in enumerate(np.linspace(0, 1, 7))]
    summaries = {"b1": benchmark_summary(records, k=4), "b2": benchmark_summary(records[:3], k=3)}
    write_reports(str(tmp_path), summaries, {"note": "x"})
    back = json.load(open(tmp_path / "summary.json"))
    assert back["benchmarks"] == json.loads(json.dumps(summaries)) and back["note"] == "x"
    correct = [[bool(s["correct"]) for s in r["samples"]] for r in records]
    assert back["benchmarks"]["b1"]["avg@k"] == np.mean([np.mean(c) for c in correct])
    assert back["benchmarks"]["b1"]["pass@k"] == np.mean([float(any(c)) for c in correct])
    table = (tmp_path / "results.md").read_text().splitlines()
    header = [h.strip() for h in table[0].strip("|").split("|")]
    cells = {name: [c.strip() for c in line.strip("|").split("|")] for name, line in zip(summaries, table[2:])}
    for name, s in summaries.items():
        got = dict(zip(header, cells[name]))
        assert float(got["avg@k %"]) == round(100 * s["avg@k"], 2)
        assert float(got[f"pass@{s['k']} %"]) == round(100 * s["pass@k"], 2)


# ---- the harness with a stub episode ------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def compact_tokenizer():
    """A real (compact) tokenizer: the agent loop reads its chat template's stop tokens."""
    return chat.build_compact_tokenizer(["question answer nope"], vocab_size=300)


def stub_episode(record, index, finish="answer"):
    text = f"\\boxed{{{record['answer'][0]}}}" if int(record["id"].split("/")[1]) % 2 == 0 else "\\boxed{nope}"
    return Trajectory(question=record, messages=[], tokens=[], loss_mask=[], logprobs=[], prompt_len=0,
                      turn_spans=[(0, 1)], finish_reason=finish, final_text=text, sample_index=index)


def bench_file(tmp_path, n, broken=()):
    lines = [json.dumps({"id": f"t/{i}", "question": f"question {i}?", "answer": [f"answer {i}"], "source": "nq"})
             for i in range(n)]
    for i in broken:  # no acceptable answer: the schema rejects the row
        lines[i] = json.dumps({"id": f"t/{i}", "question": f"question {i}?", "answer": [], "source": "nq"})
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def evaluator(tmp_path, monkeypatch, episode, **settings):
    monkeypatch.setattr(Evaluator, "_attempts", lambda self, loop, record, index: (episode(record, index), None))
    return Evaluator(None, compact_tokenizer(), str(tmp_path / "out"), registry=None, progress=False,
                     settings=EvalSettings(**settings))


def test_broken_rows_and_failed_samples_are_reported_not_dropped(tmp_path, monkeypatch):
    path = bench_file(tmp_path, 6, broken=(3,))

    def episode(record, index):
        if record["id"] == "t/4" and index == 1:
            raise RuntimeError("sandbox died")
        return stub_episode(record, index)
    out = evaluator(tmp_path, monkeypatch, episode, k=2).run([BenchmarkSpec("t", path, ())])
    s = out["benchmarks"]["t"]
    assert s["questions"] == 5 and s["skipped_rows"] == 1 and "t.jsonl:4" in s["skipped_reasons"][0]
    # t/0, t/2 right twice; t/4 right once (its failed sample is wrong); t/1 wrong
    assert s["avg@k"] == pytest.approx((1 + 1 + 0.5 + 0 + 0) / 5) and s["failed"] == 1
    table = open(out["paths"]["table"]).read()
    assert "skipped rows" in table and "failed samples" in table


@pytest.mark.parametrize("error", [KeyboardInterrupt, OSError])
def test_stopping_cancels_queued_episodes_and_keeps_scored_questions(tmp_path, monkeypatch, error):
    n, calls, gate = 12, collections.Counter(), threading.Event()
    path = bench_file(tmp_path, n)

    def episode(record, index):
        calls[record["id"]] += 1
        if record["id"] != "t/0":
            gate.wait()  # the rest wait until the pools are shut down
        return stub_episode(record, index)

    class GatedPool(harness.cf.ThreadPoolExecutor):
        def shutdown(self, *args, **kw):  # leaving the `with`: let the episodes in flight end
            gate.set()
            super().shutdown(*args, **kw)
    monkeypatch.setattr(harness.cf, "ThreadPoolExecutor", GatedPool)
    ev = evaluator(tmp_path, monkeypatch, episode, k=1, max_parallel=2)
    real_append = ev.store.append

    def append(record):  # the first question is stored, then the run is stopped
        real_append(record)
        raise error("stop")
    monkeypatch.setattr(ev.store, "append", append)
    with pytest.raises(error):
        ev.run([BenchmarkSpec("t", path, ())])
    assert sum(calls.values()) <= 3 < n  # t/0 and the two in flight ran; the queued ones were cancelled
    monkeypatch.setattr(ev.store, "append", real_append)
    calls.clear()
    rerun = Evaluator(None, compact_tokenizer(), str(tmp_path / "out"), registry=None, progress=False,
                      settings=EvalSettings(k=1))
    s = rerun.run([BenchmarkSpec("t", path, ())])["benchmarks"]["t"]
    assert calls["t/0"] == 0 and sum(calls.values()) <= n - 1  # resumed after the stored question(s)
    assert s["questions"] == n and s["avg@k"] == 0.5
