"""make_loader: exact resume from a JSON state, seeded shuffling, epochs and per-host sharding."""
import collections
import json
import os

import grain
import pytest

from reagent_jax.data import JsonlSource, make_loader

_HERE = os.path.dirname(__file__)
BENCH = next((p for p in (os.path.join(_HERE, "..", "..", "..", "shared", "data", "benchmarks", "bamboogle.jsonl"),
                          os.path.join(_HERE, "..", "..", "shared", "data", "benchmarks", "bamboogle.jsonl"))
              if os.path.exists(p)), "")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The real bamboogle file (125 rows) when present, else an equivalent written one."""
    if os.path.exists(BENCH):
        return JsonlSource(BENCH, "benchmark")
    path = tmp_path_factory.mktemp("data") / "rows.jsonl"
    path.write_text("".join(json.dumps({"id": f"r/{i}", "question": f"q{i}", "answer": [str(i)],
                                        "source": "r"}) + "\n" for i in range(125)))
    return JsonlSource(str(path), "benchmark")


def ids(batch):
    return [row["id"] for row in batch]


def take(it, n):
    return [ids(next(it)) for _ in range(n)]


@pytest.mark.parametrize("threads", [0, 2])
def test_resume_continues_with_the_exact_next_batch(source, threads):
    opts = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=8 * threads)
    it = make_loader(source, batch_size=16, seed=7, read_options=opts)
    take(it, 5)
    state = json.loads(json.dumps(it.get_state()))  # must survive a JSON sidecar
    expected = take(it, 3)  # crosses the end of epoch 1 (125 // 16 = 7 batches)
    fresh = make_loader(source, batch_size=16, seed=7, read_options=opts)
    fresh.set_state(state)
    assert take(fresh, 3) == expected
    assert it.steps_per_epoch == 7
    it.close()
    fresh.close()


def test_state_from_other_settings_is_refused(source):
    it = make_loader(source, batch_size=16, seed=7)
    next(it)
    state = it.get_state()
    other = make_loader(source, batch_size=16, seed=8)
    with pytest.raises(ValueError, match="seed: saved 7 vs now 8"):
        other.set_state(state)
    with pytest.raises(ValueError, match="not a loader state"):
        other.set_state({"next_index": 3})


def test_state_over_other_content_is_refused(tmp_path):
    """Same number of rows, other content (an edited or regenerated file): resuming would silently
    feed other batches, so it is refused; the unchanged file resumes, and a state saved without a
    content entry (older runs) is still accepted."""
    path = tmp_path / "rows.jsonl"
    write = lambda tag: path.write_text("".join(json.dumps({"id": f"{tag}{i}"}) + "\n" for i in range(40)))
    write("a")
    it = make_loader(JsonlSource(str(path)), batch_size=4, seed=0)
    take(it, 2)
    state = it.get_state()
    expected = take(it, 1)
    same = make_loader(JsonlSource(str(path)), batch_size=4, seed=0)
    same.set_state(state)
    assert take(same, 1) == expected
    write("b")
    other = make_loader(JsonlSource(str(path)), batch_size=4, seed=0)
    with pytest.raises(ValueError, match="content: saved"):
        other.set_state(state)
    legacy = {k: v for k, v in state.items() if k != "content"}
    other.set_state(legacy)
    assert take(other, 1) == [[i.replace("a", "b") for i in expected[0]]]


def test_parquet_content_fingerprint_follows_the_rows(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa
    path = str(tmp_path / "rows.parquet")
    write = lambda tag: pq.write_table(pa.Table.from_pylist([{"id": f"{tag}{i}"} for i in range(10)]), path)
    write("a")
    first = JsonlSource(path).content_fingerprint
    write("a")
    assert JsonlSource(path).content_fingerprint == first
    write("b")
    assert JsonlSource(path).content_fingerprint != first


def test_shuffle_is_deterministic_by_seed_and_reshuffles_each_epoch(source):
    first = take(make_loader(source, batch_size=25, seed=1), 10)
    assert first == take(make_loader(source, batch_size=25, seed=1), 10)
    assert first != take(make_loader(source, batch_size=25, seed=2), 10)
    epoch1, epoch2 = sum(first[:5], []), sum(first[5:], [])
    all_ids = [source[i]["id"] for i in range(len(source))]
    assert sorted(epoch1) == sorted(epoch2) == sorted(all_ids)  # each epoch is a permutation
    assert epoch1 != epoch2 and epoch1 != all_ids
    ordered = take(make_loader(source, batch_size=25, seed=1, shuffle=False), 2)
    assert sum(ordered, []) == all_ids[:50]


def test_finite_epochs_remainder_and_map_fn(source):
    batches = list(make_loader(source, batch_size=50, seed=0, num_epochs=1, drop_remainder=False,
                               map_fn=lambda row: row["id"]))
    assert [len(b) for b in batches] == [50, 50, 25]
    assert collections.Counter(sum(batches, [])) == collections.Counter(source[i]["id"] for i in range(125))
    assert [len(b) for b in make_loader(source, batch_size=50, seed=0, num_epochs=1)] == [50, 50]
    with pytest.raises(ValueError, match="batch_size 200 exceeds the 125 records"):
        make_loader(source, batch_size=200, seed=0, num_epochs=1)


def test_per_host_shards_are_disjoint_and_equal(source):
    shards = []
    for index in range(3):
        opts = grain.sharding.ShardOptions(index, 3, drop_remainder=True)
        it = make_loader(source, batch_size=41, seed=3, num_epochs=1, shard_options=opts)
        shards.append(sum(take(it, 1), []))
        assert it.get_state()["shard_index"] == index
    assert [len(s) for s in shards] == [41, 41, 41]
    assert len(set().union(*map(set, shards))) == 123  # 125 rows, uneven tail of 2 dropped
    default = make_loader(source, batch_size=5, seed=0)  # single process: ShardByJaxProcess -> 1 shard
    assert default.get_state()["shard_count"] == 1


def test_worker_processes_give_the_same_batches_and_resume_across_counts(source):
    """Batches read in 2 worker processes equal the in-process ones; a state taken with workers
    resumes without them at the exact next batch (the count is not part of the sequence)."""
    plain = make_loader(source, batch_size=16, seed=3)
    workers = make_loader(source, batch_size=16, seed=3, worker_count=2)
    try:
        first = take(workers, 4)
        assert first == take(plain, 4)
        state = json.loads(json.dumps(workers.get_state()))
        expected = take(workers, 5)  # crosses an epoch
        fresh = make_loader(source, batch_size=16, seed=3)
        fresh.set_state(state)
        assert take(fresh, 5) == expected
        fresh.close()
    finally:
        workers.close()
        plain.close()
    with pytest.raises(ValueError, match="worker_count must be an int >= 0"):
        make_loader(source, batch_size=16, seed=3, worker_count=-1)
