"""TFDS/ArrayRecord datasets: built records equal the JSONL rows, broken rows counted, per-host
shards disjoint and complete, loader state resumes on the same record and refuses other data."""
import json
import logging
import os

import grain
import pytest

pytest.importorskip("tensorflow_datasets")

from reagent_jax import data  # noqa: E402
from reagent_jax.data import tfds_rows  # noqa: E402

N = 240


def _row(schema: str, i: int) -> dict:
    traj = [{"role": "user", "content": f"question {i}"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "python", "arguments": json.dumps({"code": f"print({i})"})}}]},
            {"role": "tool", "content": str(i)}, {"role": "assistant", "content": f"\\boxed{{{i}}} é"}]
    return {
        "agent_rl": {"question": f"What is {i}+1? ü", "answer": str(i + 1) if i % 2 else [i + 1, "x"],
                     "source": "gsm8k", "meta": {"solution": f"<<{i}+1={i + 1}>>"}},
        "agent_sft": {"messages": traj, **({"tools": ["python"]} if i % 3 else {})},
        "rrm_sft": {"question": f"q{i}", "trajectory": traj, "think": "t", "critique": "" if i % 2 else "bad step",
                    "score": i / N},
        "rrm_rl": {"question": f"q{i}", "trajectory": traj, "label": bool(i % 2)},
        "evalplanner_pair": {"instruction": f"i{i}", "chosen": "a", "rejected": "b",
                             **({"category": "math", "id": i} if i % 2 else {})},
        "benchmark": {"id": f"b/{i}", "question": f"q{i}", "answer": [str(i)], "source": "bench"},
    }[schema]


def _write(path, schema, broken: bool = True):
    with open(path, "w", encoding="utf-8") as f:
        for i in range(N):
            f.write(json.dumps(_row(schema, i), ensure_ascii=False) + "\n")
        if broken:
            f.write('{"not": "a row of this schema"}\n')
    return path


def _canon(rows):
    return sorted(json.dumps(r, sort_keys=True, ensure_ascii=False) for r in rows)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("tfds")
    out = {}
    for schema in sorted(data.SCHEMAS):
        path = _write(str(root / f"{schema}.jsonl"), schema)
        out[schema] = (path, data.build_dataset(schema, "toy", {"train": path}, data_dir=str(root / "data")))
    return str(root / "data"), out


@pytest.mark.parametrize("schema", sorted(data.SCHEMAS))
def test_records_equal_the_jsonl_rows_and_the_broken_row_is_counted(built, schema):
    data_dir, paths = built
    path, spec = paths[schema]
    assert spec == f"tfds:reagent_{schema}/toy"
    source = data.TfdsSource(spec, schema, data_dir=data_dir)
    jsonl = data.JsonlSource(path, schema)
    assert len(source) == N and source.skipped_rows == 1 == len(jsonl.skipped)
    assert _canon(source) == _canon(jsonl)  # same normalised dicts (TFDS shuffles the order)
    where = {source.where(i) for i in range(len(source))}
    assert where == {f"{path}:{i}" for i in range(1, N + 1)}
    assert source[-1] == source[N - 1]
    assert source.__getitems__([3, 0, -1]) == [source[3], source[0], source[N - 1]]
    with pytest.raises(IndexError):
        source[N]


def test_builder_warns_naming_the_broken_row(tmp_path, caplog):
    path = _write(str(tmp_path / "rl.jsonl"), "agent_rl")
    with caplog.at_level(logging.WARNING):
        data.build_dataset("agent_rl", "warned", {"train": path}, data_dir=str(tmp_path / "d"))
    assert any(f"{path}: skipped 1 of {N + 1} rows: line {N + 1}: missing field" in r.getMessage()
               for r in caplog.records)


def test_open_rows_picks_the_reader_and_refuses_bad_specs(built, tmp_path):
    data_dir, paths = built
    assert isinstance(data.open_rows(paths["agent_rl"][1], "agent_rl", data_dir=data_dir), data.TfdsSource)
    assert isinstance(data.open_rows(paths["agent_rl"][0], "agent_rl"), data.JsonlSource)
    with pytest.raises(ValueError, match="agent_sft rows are expected"):
        data.open_rows(paths["agent_rl"][1], "agent_sft", data_dir=data_dir)
    with pytest.raises(FileNotFoundError, match="launch/build_datasets.py"):
        data.open_rows("tfds:reagent_agent_rl/missing", "agent_rl", data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="expected tfds:reagent_<schema>/<dataset>"):
        data.open_rows("tfds:gsm8k", "agent_rl", data_dir=data_dir)
    with pytest.raises(ValueError, match="no split 'test'"):
        data.open_rows(paths["agent_rl"][1] + ":test", "agent_rl", data_dir=data_dir)


def test_tfds_own_reader_sees_the_schema_features_and_shards_are_snappy_chunks(built):
    import tensorflow_datasets as tfds
    from array_record.python import array_record_module
    data_dir, paths = built
    directory = tfds_rows.dataset_dir(paths["rrm_sft"][1], data_dir)
    native = tfds.builder_from_directory(directory).as_data_source(split="train")
    ours = data.TfdsSource(paths["rrm_sft"][1], data_dir=data_dir)
    for i in (0, 7, N - 1):
        example = native[i]  # TFDS's generic decoder: the schema's own fields
        assert example["question"].decode() == ours[i]["question"]
        assert json.loads(example["trajectory"]) == ours[i]["trajectory"]
        assert float(example["score"]) == ours[i]["score"]
    for path in ours._files:  # chunks of GROUP_SIZE records: a reader's index is a quarter of one per record
        options = array_record_module.ArrayRecordReader(path).writer_options_string()
        assert "snappy" in options and f"group_size:{tfds_rows.GROUP_SIZE}," in options and tfds_rows.GROUP_SIZE == 4


def test_a_dataset_of_another_layout_version_is_refused(built, tmp_path):
    import shutil
    data_dir, paths = built
    old = tmp_path / "reagent_agent_rl" / "toy" / "1.0.0"
    shutil.copytree(tfds_rows.dataset_dir(paths["agent_rl"][1], data_dir), old)
    info = json.loads((old / "dataset_info.json").read_text())
    (old / "dataset_info.json").write_text(json.dumps({**info, "version": "1.0.0"}))
    with pytest.raises(ValueError, match="built as version 1.0.0.*--overwrite"):
        data.TfdsSource(paths["agent_rl"][1], data_dir=str(tmp_path))


def test_benchmarks_and_evalplanner_pairs_read_built_datasets(built, tmp_path):
    from reagent_jax.evalplanner.pairs import load_triples
    data_dir, paths = built
    path, spec = paths["benchmark"]
    broken = []
    rows = data.load_benchmark(spec, skipped=broken, data_dir=data_dir)
    assert _canon(rows) == _canon(data.load_benchmark(path)) and len(broken) == 1
    assert data.load_benchmark(spec, limit=5, data_dir=data_dir) == rows[:5]  # record order, fixed
    assert data.benchmark_name(spec) == "toy" and data.benchmark_name(spec + ":test") == "toy_test"
    with pytest.raises(FileNotFoundError, match="launch/build_datasets.py"):
        data.resolve_benchmark("tfds:reagent_benchmark/missing", data_dir)
    pair_path, pair_spec = paths["evalplanner_pair"]
    from_files, from_tfds = load_triples([pair_path]), load_triples([pair_spec], data_dir=data_dir)
    key = lambda t: t.id  # noqa: E731
    assert sorted(from_tfds, key=key) == sorted(from_files, key=key) and len(from_tfds) == N
    with pytest.raises(ValueError, match="duplicate pair ids"):  # a spec and its source file hold the same ids
        load_triples([pair_spec, pair_path], data_dir=data_dir)


def test_evaluation_config_takes_a_built_benchmark(built):
    import importlib.util
    from reagent_jax.eval import from_config
    data_dir, paths = built
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location("evaluate_example", os.path.join(root, "configs", "evaluate_example.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.benchmarks, config.data_dir, config.limit = f"{paths['benchmark'][1]},named={paths['benchmark'][0]}", data_dir, 3
    toy, named = from_config.benchmark_specs(config)
    assert (toy.name, toy.path, toy.data_dir, toy.limit) == ("toy", paths["benchmark"][1], data_dir, 3)
    assert named.name == "named" and named.path == paths["benchmark"][0]


def _loader(source, index, count, **kw):
    return data.make_loader(source, batch_size=8, seed=3, num_epochs=1, drop_remainder=False,
                            shard_options=grain.sharding.ShardOptions(index, count), **kw)


def test_two_hosts_read_disjoint_records_whose_union_is_the_dataset(built):
    data_dir, paths = built
    source = data.TfdsSource(paths["agent_rl"][1], data_dir=data_dir)
    seen = [_canon([r for batch in _loader(source, i, 2) for r in batch]) for i in range(2)]
    assert len(seen[0]) == len(seen[1]) == N // 2
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == _canon(source)
    assert _canon(next(iter(_loader(source, 0, 2)))) != _canon(next(iter(_loader(source, 1, 2))))


def test_loader_state_resumes_at_the_same_record_and_refuses_other_data(built, tmp_path):
    data_dir, paths = built
    source = data.TfdsSource(paths["agent_rl"][1], data_dir=data_dir)
    for host in range(2):
        it = _loader(source, host, 2)
        next(it), next(it)
        state = json.loads(json.dumps(it.get_state()))  # as the checkpoint sidecar stores it
        expected = [next(it), next(it)]
        fresh = _loader(data.TfdsSource(paths["agent_rl"][1], data_dir=data_dir), host, 2)
        fresh.set_state(state)
        assert [next(fresh), next(fresh)] == expected
    # The same length and name, other rows (a rebuilt dataset): the state is refused.
    other = _write(str(tmp_path / "other.jsonl"), "agent_rl", broken=False)
    with open(other, "a") as f:
        f.write(json.dumps({**_row("agent_rl", 0), "question": "changed"}) + "\n")
    changed = data.TfdsSource(data.build_dataset("agent_rl", "toy", {"train": other}, data_dir=str(tmp_path / "d")),
                              data_dir=str(tmp_path / "d"))
    assert len(changed) == N + 1
    with pytest.raises(ValueError, match="content"):
        data.make_loader(changed, batch_size=8, seed=3, num_epochs=1, drop_remainder=False,
                         shard_options=grain.sharding.ShardOptions(0, 2)).set_state(
            {**state, "num_records": N + 1})


def test_config_check_accepts_a_built_dataset_and_names_a_missing_one(built, tmp_path):
    import ml_collections
    from reagent_jax.pipelines import config_checks
    data_dir, paths = built
    problems = config_checks._Problems(_config(paths["agent_rl"][1], data_dir))
    config_checks._data_paths(problems, ("data.train_path",))
    assert not problems.lines
    problems = config_checks._Problems(_config("tfds:reagent_agent_rl/nope", data_dir))
    config_checks._data_paths(problems, ("data.train_path",))
    assert "no built dataset" in str(problems.lines)
    # Comma lists (EvalPlanner's train_paths) may mix built datasets and files, each checked.
    pairs = f"{paths['evalplanner_pair'][1]},{paths['evalplanner_pair'][0]}"
    problems = config_checks._Problems(_config(pairs, data_dir))
    config_checks._data_paths(problems, ("data.train_path",), comma_lists=True)
    assert not problems.lines
    problems = config_checks._Problems(_config(pairs + ",tfds:reagent_evalplanner_pair/nope", data_dir))
    config_checks._data_paths(problems, ("data.train_path",), comma_lists=True)
    assert "reagent_evalplanner_pair/nope" in str(problems.lines)
    # data.eval_path: a built benchmark dataset resolves under data.data_dir.
    problems = config_checks._Problems(ml_collections.ConfigDict(
        {"data": {"eval_path": paths["benchmark"][1], "data_dir": data_dir}}))
    config_checks._eval_path(problems)
    assert not problems.lines


def _config(train_path, data_dir):
    import ml_collections
    return ml_collections.ConfigDict({"data": {"train_path": train_path, "data_dir": data_dir}})


def test_training_rows_stay_a_random_access_source(built):
    import ml_collections
    from reagent_jax.pipelines.context import load_records
    data_dir, paths = built
    ctx = type("Ctx", (), {"world": None, "config": ml_collections.ConfigDict(
        {"data": {"train_path": paths["agent_rl"][1], "eval_path": "", "data_dir": data_dir},
         "eval": {"num_questions": 4}})})()
    train, heldout = load_records(ctx)
    assert isinstance(train, data.TfdsSource) and len(train) == N and heldout == []
    assert train[5]["data_source"] == "gsm8k" and os.path.exists(train.where(5).rsplit(":", 1)[0])


def test_build_datasets_cli_builds_and_names_the_spec(tmp_path):
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = _write(str(tmp_path / "sft.jsonl"), "agent_sft")
    cmd = [sys.executable, os.path.join(root, "launch", "build_datasets.py"), "--schema=agent_sft", "--name=cli",
           f"--data_dir={tmp_path / 'd'}"]
    done = subprocess.run(cmd + [f"--train={path}"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"tfds:reagent_agent_sft/cli:train: {N} records, 1 broken rows skipped" in done.stdout
    assert "--config.data.train_path=tfds:reagent_agent_sft/cli" in done.stdout
    again = subprocess.run(cmd + [f"--train={path}"], capture_output=True, text=True, timeout=120)
    assert again.returncode != 0 and "is already built" in again.stderr and "--overwrite" in again.stderr
    missing = subprocess.run(cmd[:-2] + ["--name=other", f"--data_dir={tmp_path / 'd'}", "--train=/nonexistent.jsonl"],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "FATAL: data file not found: /nonexistent.jsonl" in missing.stderr


def test_overwrite_rebuilds_from_the_new_files(tmp_path):
    first = _write(str(tmp_path / "a.jsonl"), "agent_rl", broken=False)
    spec = data.build_dataset("agent_rl", "x", {"train": first}, data_dir=str(tmp_path / "d"))
    second = str(tmp_path / "b.jsonl")
    with open(second, "w") as f:
        f.write(json.dumps(_row("agent_rl", 7)) + "\n")
    with pytest.raises(FileExistsError, match="already built"):
        data.build_dataset("agent_rl", "x", {"train": second}, data_dir=str(tmp_path / "d"))
    data.build_dataset("agent_rl", "x", {"train": second}, data_dir=str(tmp_path / "d"), overwrite=True)
    rebuilt = data.TfdsSource(spec, data_dir=str(tmp_path / "d"))
    assert len(rebuilt) == 1 and rebuilt[0] == data.JsonlSource(second, "agent_rl")[0]
