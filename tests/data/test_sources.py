"""JsonlSource and load_benchmark on the real benchmark files and on files with broken rows."""
import json
import logging
import os
import pickle

import pytest

from reagent_jax.data import AGENT_RL, BENCHMARK, JsonlSource, list_benchmarks, load_benchmark

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "benchmarks")
if not os.path.isdir(BENCH):
    BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "benchmarks")
needs_bench = pytest.mark.skipif(not os.path.isdir(BENCH), reason="shared benchmark files not present")

# Row counts from shared/data/benchmarks/README.md.
README_ROWS = {"aime24": 30, "aime25": 30, "math500": 500, "gsm8k_full": 1319, "hotpotqa": 200,
               "2wiki": 200, "musique": 200, "bamboogle": 125, "webwalker": 680, "hle": 500,
               "xbench": 100, "simpleqa": 500}


def raw_lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@needs_bench
def test_real_benchmarks_load_with_readme_counts(monkeypatch):
    monkeypatch.setenv("REAGENT_BENCHMARK_DIR", BENCH)
    assert set(README_ROWS) <= set(list_benchmarks())
    for name, count in README_ROWS.items():
        rows = load_benchmark(name)
        assert len(rows) == count, name
        assert all(r["source"] == rows[0]["source"] and r["answer"] for r in rows)
    path = os.path.join(BENCH, "bamboogle.jsonl")
    assert load_benchmark(path) == raw_lines(path)  # normalised files pass through unchanged
    assert len(load_benchmark(path, limit=7)) == 7
    with pytest.raises(FileNotFoundError, match="benchmark 'gaia' not found"):
        load_benchmark("gaia")


@needs_bench
def test_source_over_several_real_files_reads_rows_by_offset():
    hotpot, bamboo = (os.path.join(BENCH, f) for f in ("hotpotqa.jsonl", "bamboogle.jsonl"))
    src = JsonlSource([hotpot, bamboo], AGENT_RL)
    expected = raw_lines(hotpot) + raw_lines(bamboo)
    assert len(src) == 325 and not src.skipped
    for i in (0, 199, 200, 324, -1):
        row = src[i]
        assert row["question"] == expected[i]["question"] and row["answer"] == expected[i]["answer"]
        assert row["data_source"] == expected[i]["source"]  # `source` accepted as data_source
    assert src.where(200) == f"{bamboo}:1"
    with pytest.raises(IndexError):
        src[325]
    clone = pickle.loads(pickle.dumps(src))  # Grain worker processes get a pickled copy
    assert clone[210] == src[210]
    assert len(JsonlSource(os.path.join(BENCH, "aime2*.jsonl"), BENCHMARK)) == 60  # glob


def write_lines(path, lines):
    path.write_bytes(b"".join((l if isinstance(l, bytes) else l.encode()) + b"\n" for l in lines))
    return str(path)


def good(i, answer=None):
    return json.dumps({"question": f"q{i}", "answer": answer or [f"a{i}"], "data_source": "nq"})


def test_broken_rows_skipped_with_file_and_line(tmp_path, caplog):
    path = write_lines(tmp_path / "train.jsonl", [
        good(1),                                                       # 1
        '{"question": "q2", "answer": ["a"], "data_source": "nq"',     # 2 bad JSON
        json.dumps({"question": "q3", "data_source": "nq"}),           # 3 missing answer
        json.dumps({"question": 3, "answer": ["a"], "data_source": "nq"}),  # 4 wrong type
        "",                                                            # 5 blank: not a row
        json.dumps({"question": "q6", "answer": [], "data_source": "nq"}),  # 6 empty answer
        good(7, answer="seven"),                                       # 7 str answer -> list
        b'{"question": "\xff", "answer": ["a"], "data_source": "nq"}',  # 8 not UTF-8
        "[1, 2]",                                                      # 9 not an object
    ])
    other = write_lines(tmp_path / "other.jsonl", [b"\xef\xbb\xbf" + good(10).encode(), good(11)])
    with caplog.at_level(logging.WARNING):
        src = JsonlSource([path, other], "agent_rl")
    assert len(src) == 4
    assert [src[i]["question"] for i in range(4)] == ["q1", "q7", "q10", "q11"]
    assert src[1]["answer"] == ["seven"]
    assert [(f, n) for f, n, _ in src.skipped] == [(path, 2), (path, 3), (path, 4), (path, 6), (path, 8), (path, 9)]
    reasons = [r for _, _, r in src.skipped]
    assert reasons[0].startswith("bad JSON") and reasons[1] == "missing field 'answer'"
    assert reasons[2] == "field 'question' expected a string, got int"
    assert reasons[3] == "field 'answer' has no non-empty answer" and reasons[4] == "not valid UTF-8"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # one summary per file with problems
    assert warnings[0].startswith(f"{path}: skipped 6 of 8 rows: line 2: bad JSON")
    assert "line 3: missing field 'answer'" in warnings[0] and "(and 1 more)" in warnings[0]
    assert src.where(1) == f"{path}:7" and src.where(2) == f"{other}:1"


def test_all_broken_empty_missing_and_raise_mode(tmp_path):
    bad = write_lines(tmp_path / "bad.jsonl", ["{", json.dumps({"question": "q"})])
    with pytest.raises(ValueError, match=r"no valid rows in .*bad\.jsonl \(2 broken, e\.g\. .*bad\.jsonl:1: bad JSON"):
        JsonlSource(bad, AGENT_RL)
    empty = write_lines(tmp_path / "empty.jsonl", [""])
    with pytest.raises(ValueError, match="files are empty"):
        JsonlSource(empty, AGENT_RL)
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        JsonlSource(tmp_path / "nope.jsonl", AGENT_RL)
    mixed = write_lines(tmp_path / "mixed.jsonl", [good(1), json.dumps({"question": "q", "answer": "a"})])
    with pytest.raises(ValueError, match=r"mixed\.jsonl:2: missing field 'data_source'"):
        JsonlSource(mixed, AGENT_RL, on_error="raise")
    assert len(JsonlSource(mixed, None)) == 2  # schema None: any JSON object


def test_parquet_rows_across_row_groups(tmp_path, caplog):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    rows = [{"question": f"q{i}", "answer": [f"a{i}"] if i % 4 else [], "data_source": "nq"} for i in range(10)]
    path = str(tmp_path / "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=3)
    with caplog.at_level(logging.WARNING):
        src = JsonlSource([path], AGENT_RL)
    kept = [r for i, r in enumerate(rows) if i % 4]
    assert len(src) == len(kept) == 7
    assert [src[i] for i in (6, 0, 3, 5, 1)] == [kept[i] for i in (6, 0, 3, 5, 1)]
    assert [(f, n) for f, n, _ in src.skipped] == [(path, 0), (path, 4), (path, 8)]
    assert "row 4: field 'answer' has no non-empty answer" in caplog.text
    assert pickle.loads(pickle.dumps(src))[4] == kept[4]


def test_rows_at_reads_each_row_once_and_only_when_asked():
    from reagent_jax.data import RowsAt

    class Source(list):
        reads = 0

        def __getitem__(self, i):
            Source.reads += 1
            return list.__getitem__(self, i)

    source = Source([{"i": i} for i in range(10)])
    rows = RowsAt(source, [7, 2, 9])
    assert len(rows) == 3 and Source.reads == 0 and rows.rows_read == 0
    assert rows[1] == {"i": 2} and rows[1] is rows[1] and Source.reads == 1
    assert rows[-1] == {"i": 9} and list(rows) == [{"i": 7}, {"i": 2}, {"i": 9}]
    assert rows[0:2] == [{"i": 7}, {"i": 2}] and Source.reads == 3 and rows.rows_read == 3
    with pytest.raises(IndexError):
        rows[3]
