"""Broken dataset files and rows and loader resume (conversion of awkward inputs:
tests/pipelines/test_convert_data.py).

Oracles: plain Python (the rows written, `list(range(n))` per epoch, an uninterrupted pass).
"""
import collections
import itertools
import json

import grain
import pytest

from reagent_jax.data import JsonlSource, load_benchmark, make_loader

BOM = b"\xef\xbb\xbf"


def row(i, **over):
    return {"question": f"q{i}", "answer": [str(i)], "data_source": "nq", **over}


def write(path, lines, sep=b"\n"):
    path.write_bytes(sep.join(x if isinstance(x, bytes) else json.dumps(x).encode() for x in lines) + sep)
    return str(path)


# ---- sources: what counts as a broken row, and where it is reported ---------------------------------
@pytest.mark.parametrize("bad, reason", [
    (b'{"question": "x\xed\xa0\x80", "answer": ["a"], "data_source": "nq"}', "not valid UTF-8"),  # encoded surrogate
    (b'{"question": "x\\ud800", "answer": ["a"], "data_source": "nq"}', "lone surrogate"),  # escaped surrogate
    (b'{"question": "x\\uDFFF y", "answer": ["a"], "data_source": "nq"}', "lone surrogate"),
    (b'{"question": "caf\xe9", "answer": ["a"], "data_source": "nq"}', "not valid UTF-8"),  # Latin-1
])
def test_rows_no_tokenizer_could_read_are_skipped_at_index_time(tmp_path, bad, reason):
    path = write(tmp_path / "d.jsonl", [row(1), bad, row(3)])
    src = JsonlSource(path, "agent_rl")
    assert [r["question"] for r in src] == ["q1", "q3"]
    assert [(f, n) for f, n, _ in src.skipped] == [(path, 2)] and reason in src.skipped[0][2]
    with pytest.raises(ValueError, match=f"d.jsonl:2: {reason}"):
        JsonlSource(path, "agent_rl", on_error="raise")


def test_valid_surrogate_pair_and_escaped_backslash_are_kept(tmp_path):
    path = write(tmp_path / "d.jsonl", [row(1, question="smile \\ud83d\\ude00".encode().decode("unicode_escape")),
                                        b'{"question": "a \\\\ud800 b", "answer": ["a"], "data_source": "nq"}'])
    src = JsonlSource(path, "agent_rl")
    assert [r["question"] for r in src] == ["smile \U0001F600", "a \\ud800 b"] and src.skipped == []


def test_pretty_printed_json_array_is_a_file_error_naming_the_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps([row(i) for i in range(3)], indent=2))
    for on_error in ("skip", "raise"):
        with pytest.raises(ValueError, match=r"rows\.jsonl:1: this is a JSON array, not JSON Lines"):
            JsonlSource(str(path), "agent_rl", on_error=on_error)
    (tmp_path / "bom.jsonl").write_bytes(BOM + b"\n[\n" + json.dumps(row(1)).encode() + b"\n]\n")
    with pytest.raises(ValueError, match=r"bom\.jsonl:2: this is a JSON array"):
        JsonlSource(str(tmp_path / "bom.jsonl"), "agent_rl")


def test_one_line_list_row_is_an_ordinary_broken_row(tmp_path):
    path = write(tmp_path / "d.jsonl", [[1, 2], row(2)])
    src = JsonlSource(path, "agent_rl")
    assert len(src) == 1 and src.skipped == [(path, 1, "expected a JSON object, got list")]


def test_bom_crlf_blank_lines_and_a_bom_inside_concatenated_files(tmp_path):
    lines = [BOM + json.dumps(row(1)).encode(), b"", b"   ", json.dumps(row(4)).encode(),
             BOM + json.dumps(row(5)).encode()]
    path = write(tmp_path / "d.jsonl", lines, sep=b"\r\n")
    src = JsonlSource(path, "agent_rl")
    assert [r["question"] for r in src] == ["q1", "q4", "q5"] and src.skipped == []
    assert [src.where(i) for i in range(3)] == [f"{path}:1", f"{path}:4", f"{path}:5"]


def test_load_benchmark_reports_skipped_rows(tmp_path):
    ok = {"id": "b/1", "question": "q", "answer": "a", "source": "nq"}
    path = write(tmp_path / "b.jsonl", [ok, {**ok, "id": "b/2", "answer": []}, b"{oops"])
    skipped = []
    rows = load_benchmark(path, skipped=skipped)
    assert [r["id"] for r in rows] == ["b/1"]
    assert [(n, r[:5]) for _, n, r in skipped] == [(2, "field"), (3, "bad J")]


# ---- loader: determinism and resume against an uninterrupted pass ------------------------------------
def test_batch_size_one_forever_without_drop_remainder():
    it = make_loader(list(range(5)), batch_size=1, seed=0, shuffle=False, drop_remainder=False)
    assert [next(it) for _ in range(7)] == [[0], [1], [2], [3], [4], [0], [1]]


@pytest.mark.parametrize("n, bs, epochs, drop, shuffle", [
    (7, 3, 2, False, True), (7, 3, 2, True, True), (10, 4, None, False, True), (10, 1, None, False, False),
    (6, 6, 3, True, False), (9, 2, 1, False, False),
])
def test_resume_at_every_position_matches_the_uninterrupted_pass(n, bs, epochs, drop, shuffle):
    opts = grain.ReadOptions(num_threads=2, prefetch_buffer_size=4)
    make = lambda: make_loader(list(range(n)), batch_size=bs, seed=3, num_epochs=epochs,  # noqa: E731
                               drop_remainder=drop, shuffle=shuffle, read_options=opts)
    full = list(itertools.islice(make(), 12))
    if epochs is not None:  # each epoch is a permutation; only a final short batch may be dropped
        flat, every = sum(full, []), list(range(n)) * epochs
        expected = n * epochs - (n * epochs % bs if drop else 0)
        assert len(flat) == expected and not collections.Counter(flat) - collections.Counter(every)
        if not shuffle:
            assert flat == every[:expected]
    for j in range(len(full) + 1):
        it = make()
        head = list(itertools.islice(it, j))
        state = json.loads(json.dumps(it.get_state()))
        it.close()
        resumed = make()
        resumed.set_state(state)
        assert head + list(itertools.islice(resumed, 12 - j)) == full, j
        resumed.close()
