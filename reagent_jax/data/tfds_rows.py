"""TFDS/ArrayRecord datasets of the project's row schemas: built once from JSONL/parquet, read by Grain.

At pod scale (Reagent-RL-709K, RRM-RL-90K) every host parsing and indexing whole JSONL files is
the bottleneck; an ArrayRecord dataset is random-access on disk, so a host reads only the records
its sampler asks for and holds only the reader's chunk index (~8 bytes a record, against ~48 for
JSONL's line index). No TensorFlow is needed, to build
or to read: `TfdsSource` reads the shards listed in the dataset's metadata with a thread-local
`ArrayRecordReader` per shard (one range `read(i, i + 1)`; the reader's parallel `read([i])`
costs far more in thread dispatch) and decodes one JSON feature of the tf.Example.

Each schema has one builder (`reagent_agent_rl`, `reagent_agent_sft`, ...); the dataset a user
builds is a config of it, named by them (`reagent_agent_rl/gsm8k`). Rows are validated by
`JsonlSource` while building, so broken rows are skipped with the same counted, named warning as
today, and the count is kept in the dataset's metadata. Features: the schema's text fields as
`Text`, answer lists as `Sequence(Text)`, scores as their exact repr (tf.Example floats are
float32), everything nested or optional (messages, tools, meta) as JSON text, for readers that use
TFDS's own `tfds.data_source`; and `_row`, the whole normalised row (unnamed extra fields too) as
one JSON text, which is what `TfdsSource` reads: one feature lookup and one `json.loads` cost
half of decoding every field through upb's map. Shards are rewritten with snappy after TFDS
writes them (zstd's per-record decompression was half of a random read; snappy files are about
as small on these rows). Reading gives back the same normalised dict that `JsonlSource` gives.

Read with a spec string wherever a config takes a file path: `tfds:reagent_agent_rl/gsm8k`
(`data.data_dir` or `$TFDS_DATA_DIR` says where; `tfds:NAME:split` picks a split, default train).
"""
from __future__ import annotations

import dataclasses
import bisect
import functools
import itertools
import json
import os
import threading
from typing import Any, Optional, Sequence

from reagent_jax.data import schemas
from reagent_jax.data.sources import JsonlSource

TFDS_PREFIX = "tfds:"
VERSION = "1.1.0"  # bump when the feature layout changes: a resumed loader then refuses the new data
# 1.1.0: `_row` (the whole row as JSON) replaced `_extra_json`; shards are snappy, not zstd
_ROW = "_row"  # the whole normalised row as JSON: what TfdsSource decodes
_WHERE = "_where"  # source file:line of the row, for error messages downstream
COMPRESSION = "snappy"  # ArrayRecord's per-chunk compression of the shards (TFDS writes zstd:3)
# Records per compressed chunk: a reader keeps ~8 bytes of index per chunk in memory and
# decompresses a whole chunk per random read. 4: ~2 bytes a record held, reads ~0.9-0.97x of
# one-record chunks' speed (16: 0.5 bytes, 0.76x); BENCHMARKS.md, "Chunks of records".
GROUP_SIZE = 4


def _field_kind(field: schemas.Field) -> str:
    """How a schema field is stored: text, texts (answer lists), float, or json (nested/optional)."""
    if field.required and field.check in (schemas.text, schemas.any_text, schemas.identifier):
        return "text"
    if field.required and field.check is schemas.answers:
        return "texts"
    if field.required and field.check is schemas.unit_score:
        return "float"
    return "json"


def _features(schema: schemas.Schema):
    import tensorflow_datasets as tfds
    kinds = {"text": tfds.features.Text, "json": tfds.features.Text,
             "texts": lambda: tfds.features.Sequence(tfds.features.Text()),
             "float": tfds.features.Text}  # tf.Example floats are float32: scores as exact repr text
    spec = {f.name: kinds[_field_kind(f)]() for f in schema.fields}
    spec[_ROW] = tfds.features.Text()
    spec[_WHERE] = tfds.features.Text()
    return tfds.features.FeaturesDict(spec)


def encode_row(schema: schemas.Schema, row: dict, where: str) -> dict:
    """A validated row as the builder's example dict."""
    out = {}
    for f in schema.fields:
        value = row.get(f.name)
        kind = _field_kind(f)
        if kind == "json":  # "" = absent (an explicit null is kept as "null")
            value = json.dumps(value, ensure_ascii=False) if f.name in row else ""
        elif kind == "float":
            value = repr(float(value))
        out[f.name] = value
    out[_ROW] = json.dumps(row, ensure_ascii=False)
    out[_WHERE] = where
    return out


@functools.cache
def _example_class():
    """tf.Example, imported once on first read (importing TFDS costs seconds)."""
    from tensorflow_datasets.proto import tf_example_pb2
    return tf_example_pb2.Example


def decode_record(serialized: bytes) -> dict:
    """One stored record (a serialized tf.Example of the builder's features) back as the row dict
    `JsonlSource` gives: its `_row` JSON, so no per-field decoding."""
    feature = _example_class().FromString(serialized).features.feature
    return json.loads(feature[_ROW].bytes_list.value[0])


def record_where(serialized: bytes) -> str:
    return _example_class().FromString(serialized).features.feature[_WHERE].bytes_list.value[0].decode("utf-8")


@functools.cache  # TFDS registers each builder class by name once
def _make_builder_class(schema: schemas.Schema):
    import tensorflow_datasets as tfds

    @dataclasses.dataclass
    class RowFilesConfig(tfds.core.BuilderConfig):
        """One dataset of this schema: the local files it is built from, per split."""
        splits: dict = dataclasses.field(default_factory=dict)  # split name -> comma-separated paths

    def _info(self):
        return self.dataset_info_from_configs(features=_features(schema), metadata=tfds.core.MetadataDict(),
                                              description=f"reagent-jax rows of schema {schema.name}")

    def _split_generators(self, dl_manager):
        self._skipped = {}
        return {split: self._generate_examples(split, paths) for split, paths in self.builder_config.splits.items()}

    def _generate_examples(self, split, paths):
        source = JsonlSource(paths.split(","), schema)  # validates; warns once per file with the count
        self.info.metadata[f"{split}/content_fingerprint"] = source.content_fingerprint
        self.info.metadata[f"{split}/skipped_rows"] = len(source.skipped)
        for i in range(len(source)):
            yield i, encode_row(schema, source[i], source.where(i))

    name = "reagent_" + schema.name
    cls = type("Reagent" + "".join(p.title() for p in schema.name.split("_")), (tfds.core.GeneratorBasedBuilder,), {
        "VERSION": tfds.core.Version(VERSION), "BUILDER_CONFIG_CLASS": RowFilesConfig,
        "_info": _info, "_split_generators": _split_generators, "_generate_examples": _generate_examples,
        "__module__": __name__, "name": name,
    })
    return cls, RowFilesConfig


def build_dataset(schema: schemas.Schema | str, name: str, splits: dict[str, str | Sequence[str]], *,
                  data_dir: str, overwrite: bool = False, group_size: int = GROUP_SIZE) -> str:
    """Builds `reagent_<schema>/<name>` under `data_dir` from local files; returns its `tfds:` spec.
    group_size: records per compressed chunk of the shards (`GROUP_SIZE`; the benchmark varies it).

    splits: split name -> JSONL/parquet path(s) (comma-separated or a list), e.g. {"train": "a.jsonl"}.
    An existing dataset of that name is an error unless `overwrite` (TFDS would silently keep it).
    """
    import tensorflow_datasets as tfds
    schema = schemas.get_schema(schema)
    cls, config_cls = _make_builder_class(schema)
    spec = f"{TFDS_PREFIX}{cls.name}/{name}"
    try:
        existing = dataset_dir(spec, data_dir)
    except FileNotFoundError:
        existing = None
    if existing and not overwrite:
        raise FileExistsError(f"{spec} is already built at {existing}; rebuild it from these files with "
                              "overwrite=True (launch/build_datasets.py --overwrite)")
    joined = {s: p if isinstance(p, str) else ",".join(map(os.fspath, p)) for s, p in splits.items()}
    builder = cls(config=config_cls(name=name, version=VERSION, splits=joined), data_dir=data_dir,
                  file_format="array_record")
    mode = tfds.download.GenerateMode.FORCE_REDOWNLOAD if existing else None
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(download_mode=mode) if mode else None)
    for split in builder.info.splits.values():
        for path in split.filepaths:
            _recompress(os.fspath(path), group_size)
    return spec


def _recompress(path: str, group_size: int = GROUP_SIZE, chunk: int = 4096) -> None:
    """Rewrites one shard with `COMPRESSION` in chunks of `group_size` records, record for record,
    in place (atomically). TFDS's ArrayRecord writer hard-codes zstd, whose per-record
    decompression was half of a random read, and one record per chunk."""
    from array_record.python import array_record_module
    reader = array_record_module.ArrayRecordReader(path)
    tmp = path + ".recompress"
    writer = array_record_module.ArrayRecordWriter(tmp, f"group_size:{group_size},{COMPRESSION}")
    written = False
    try:
        n = reader.num_records()
        for begin in range(0, n, chunk):
            for record in reader.read(begin, min(begin + chunk, n)):
                writer.write(record)
        written = True
    finally:
        writer.close()
        reader.close()
        if not written:
            os.remove(tmp)  # the zstd shard stays as TFDS wrote it
    os.replace(tmp, path)


def is_tfds_spec(path: Any) -> bool:
    return isinstance(path, str) and path.startswith(TFDS_PREFIX)


def parse_spec(spec: str) -> tuple[str, str, str]:
    """`tfds:reagent_agent_rl/gsm8k[:split]` -> (builder name, config name, split)."""
    body = spec[len(TFDS_PREFIX):]
    name, _, split = body.partition(":")
    builder, _, config = name.partition("/")
    if not builder.startswith("reagent_") or not config:
        raise ValueError(f"{spec!r}: expected tfds:reagent_<schema>/<dataset>[:split], e.g. tfds:reagent_agent_rl/gsm8k")
    return builder, config, split or "train"


def dataset_dir(spec: str, data_dir: Optional[str] = None) -> str:
    """The newest built version's directory of a `tfds:` spec; FileNotFoundError naming the build
    command when there is none."""
    builder_name, config, _ = parse_spec(spec)
    data_dir = data_dir or os.environ.get("TFDS_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets")
    root = os.path.join(data_dir, builder_name, config)
    versions = [v for v in os.listdir(root) if v.count(".") == 2] if os.path.isdir(root) else []
    if not versions:
        raise FileNotFoundError(f"{spec}: no built dataset under {root}; build it with "
                                f"launch/build_datasets.py --data_dir={data_dir}")
    return os.path.join(root, max(versions, key=lambda v: tuple(int(x) for x in v.split(".") if x.isdigit())))


class TfdsSource:
    """Random-access rows of a built dataset: `len()`, `source[i]` (the JsonlSource row dict), `where(i)`.

    `content_fingerprint` names the dataset, its version and the built rows' hash, so a resumed
    loader refuses a state taken on other data or another version (`make_loader`)."""

    def __init__(self, spec: str, schema: schemas.Schema | str | None = None, *, data_dir: Optional[str] = None):
        import tensorflow_datasets as tfds
        builder_name, config, self.split = parse_spec(spec)
        name = builder_name[len("reagent_"):]
        self.schema = schemas.get_schema(schema or name)
        if self.schema.name != name:
            raise ValueError(f"{spec} holds {name} rows, but {self.schema.name} rows are expected here")
        builder = tfds.builder_from_directory(dataset_dir(spec, data_dir))
        if self.split not in builder.info.splits:
            raise ValueError(f"{spec}: no split {self.split!r}; built: {sorted(builder.info.splits)}")
        self.version = str(builder.version)
        if self.version != VERSION:
            raise ValueError(f"{spec} was built as version {self.version}; this reader reads {VERSION}: rebuild it "
                             "with launch/build_datasets.py --overwrite")
        meta = builder.info.metadata or {}
        self.skipped_rows = int(meta.get(f"{self.split}/skipped_rows", 0))
        self.content_fingerprint = f"{spec}@{self.version}:{meta.get(f'{self.split}/content_fingerprint', '')}"
        split_info = builder.info.splits[self.split]
        self._files = [os.fspath(p) for p in split_info.filepaths]
        self._starts = [0, *itertools.accumulate(split_info.shard_lengths)]  # record i is in file bisect(i)
        self._len = self._starts[-1]
        self._local = threading.local()  # one reader per (thread, file): a reader is not thread-safe
        self.spec = spec

    def __getstate__(self) -> dict:  # Grain worker processes pickle the source; readers reopen there
        return {k: v for k, v in self.__dict__.items() if k != "_local"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def __len__(self) -> int:
        return self._len

    def _record(self, index: int) -> bytes:
        """The serialized record, from a single-thread reader per (thread, file) read by range: the
        reader's parallel `read([i])` costs ~100x more a record in thread dispatch."""
        n = self._len
        index = int(index)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for {n} rows")
        index %= n
        shard = bisect.bisect_right(self._starts, index) - 1
        try:
            reader = self._local.readers[shard]
        except (AttributeError, KeyError):
            reader = self._open_reader(shard)
        local = index - self._starts[shard]
        return reader.read(local, local + 1)[0]  # one call: ~20% less than seek() + read()

    def _open_reader(self, shard: int):
        from array_record.python import array_record_module
        readers = self._local.__dict__.setdefault("readers", {})
        readers[shard] = array_record_module.ArrayRecordReader(
            self._files[shard], options="readahead_buffer_size:0,max_parallelism:1")
        return readers[shard]

    def __getitem__(self, index: int) -> dict:
        return decode_record(self._record(index))

    def __getitems__(self, indices: Sequence[int]) -> list[dict]:
        """Batched reads (the batched-read hook Grain calls `_getitems`)."""
        return [self[i] for i in indices]

    _getitems = __getitems__

    def where(self, index: int) -> str:
        """The source `file:line` the record was built from."""
        return record_where(self._record(index))

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return f"TfdsSource({self.spec}, version {self.version}, {len(self)} rows, skipped at build={self.skipped_rows})"


def open_rows(path: str | Sequence[str], schema: schemas.Schema | str | None = None, *,
              data_dir: Optional[str] = None, on_error: str = "skip"):
    """The rows behind a config's path: a `tfds:` spec (TfdsSource) or JSONL/parquet files (JsonlSource)."""
    if is_tfds_spec(path):
        return TfdsSource(path, schema, data_dir=data_dir)
    return JsonlSource(path, schema, on_error=on_error)
