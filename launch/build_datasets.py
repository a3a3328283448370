r"""Builds a TFDS/ArrayRecord dataset of one row schema from local JSONL/parquet files (no TensorFlow).

  python launch/build_datasets.py --schema=agent_rl --name=gsm8k --data_dir=/data/tfds \
      --train=../shared/data/train/gsm8k_train.jsonl

then point a run at it: `--config.data.train_path=tfds:reagent_agent_rl/gsm8k --config.data.data_dir=/data/tfds`.
Files are those `launch/convert_data.py` writes; broken rows are skipped with a counted warning
(the count is kept in the dataset's metadata). Build once, on one host, onto storage every host reads.
"""
from __future__ import annotations

import logging
import sys
import time

from absl import app, flags

from reagent_jax import data

FLAGS = flags.FLAGS
flags.DEFINE_enum("schema", None, sorted(data.SCHEMAS), "Row schema of the files.")
flags.DEFINE_string("name", None, "Dataset name (the spec becomes tfds:reagent_<schema>/<name>).")
flags.DEFINE_string("data_dir", None, "Where datasets are written (TFDS data_dir).")
flags.DEFINE_string("train", "", "Comma-separated files/globs/directories for the train split.")
flags.DEFINE_string("test", "", "... for the test split (benchmarks, held-out rows).")
flags.DEFINE_string("validation", "", "... for the validation split.")
flags.DEFINE_bool("overwrite", False, "Rebuild a dataset of that name that is already built.")
flags.mark_flags_as_required(["schema", "name", "data_dir"])


def main(argv):
    del argv
    logging.getLogger("absl").setLevel(logging.WARNING)
    splits = {s: getattr(FLAGS, s) for s in ("train", "test", "validation") if getattr(FLAGS, s)}
    if not splits:
        sys.exit("FATAL: give at least one of --train, --test, --validation (files of the schema's rows)")
    start = time.perf_counter()
    try:
        spec = data.build_dataset(FLAGS.schema, FLAGS.name, splits, data_dir=FLAGS.data_dir, overwrite=FLAGS.overwrite)
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        sys.exit(f"FATAL: {e}")
    for split in splits:
        source = data.TfdsSource(f"{spec}:{split}", data_dir=FLAGS.data_dir)
        print(f"{spec}:{split}: {len(source)} records, {source.skipped_rows} broken rows skipped")
    print(f"built in {time.perf_counter() - start:.1f} s; use --config.data.train_path={spec} "
          f"--config.data.data_dir={FLAGS.data_dir}")


if __name__ == "__main__":
    app.run(main)
