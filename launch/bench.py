r"""Throughput benchmarks; prints one JSON object and optionally writes it to --json_out.

  python launch/bench.py --mode=forward --preset=bench-512 --batch=4 --seq_len=512
  python launch/bench.py --mode=rollout --preset=bench-256 --batch=16 --prompt_len=64 --new_tokens=64
  python launch/bench.py --mode=train_step --preset=bench-256
  python launch/bench.py --mode=train_step --preset=qwen3-1.7b --dtype=bfloat16 --attention=auto,xla  # on a GPU
  python launch/bench.py --mode=decode --preset=qwen3-8b --dtype=bfloat16 --param_dtype=bfloat16 --batch=64 \
      --min_prompt=256 --prompt_len=4096 --new_tokens=128   # 64 slots of mixed lengths vs the HBM roofline
  python launch/bench.py --mode=decode_kernel --preset=qwen3-8b --dtype=bfloat16 --param_dtype=bfloat16 --batch=64 \
      --min_prompt=256 --prompt_len=4096 --decode_forms=einsum,reduce   # the decode call alone, per form
  launch/bench_gpu.sh OUTDIR   # every GPU figure of BENCHMARKS.md
  python launch/bench.py --mode=grpo_step --preset=bench-256
  python launch/bench.py --mode=tools --workdir=runs/quickstart
  python launch/bench.py --mode=serve --preset=bench-256 --clients=64 --iters=5
  python launch/bench.py --mode=eval
  python launch/bench.py --mode=data --iters=100000   # ArrayRecord vs JSONL random reads (records)
  python launch/bench.py --mode=kv_dtype --checkpoint=smollm2 --batch=16 --new_tokens=96   # KV cache dtypes vs fp32
  python launch/bench.py --mode=grpo_rollout --preset=bench-256 --batch=4 --samples=8 --prompt_len=256  # paged KV

Figures are medians over --iters runs; ratios are against a baseline run in the same process.
"""
from __future__ import annotations

import json
import os

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_enum("mode", "forward", ["forward", "rollout", "decode", "decode_kernel", "train_step", "grpo_step",
                                      "tools", "serve", "eval", "data", "kv_dtype", "grpo_rollout"],
                  "What to measure.")
flags.DEFINE_integer("clients", 64, "serve mode: concurrent clients.", lower_bound=1)
flags.DEFINE_bool("stream", False, "serve mode: stream responses (server-sent events).")
flags.DEFINE_integer("vocab_size", 0, "serve mode: override the preset's vocabulary size (0: keep it).",
                     lower_bound=0)
flags.DEFINE_string("preset", "bench-512", "Model shape preset (reagent_jax.models.preset_names()).")
flags.DEFINE_integer("batch", 4, "Batch size.", lower_bound=1)
flags.DEFINE_integer("seq_len", 512, "Sequence length (forward / train_step).", lower_bound=1)
flags.DEFINE_integer("prompt_len", 64, "Prompt tokens (rollout; decode: the longest prompt).", lower_bound=1)
flags.DEFINE_integer("min_prompt", 32, "decode mode: the shortest prompt (lengths spread evenly up to --prompt_len).",
                     lower_bound=1)
flags.DEFINE_integer("decode_steps", 16, "decode mode: decode steps fused per host round trip.", lower_bound=1)
flags.DEFINE_integer("new_tokens", 64, "Generated tokens (rollout).", lower_bound=1)
flags.DEFINE_integer("iters", 3, "Timed repetitions (median reported).", lower_bound=1)
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                  "forward / rollout / train_step / grpo_step / decode: compute dtype (weights in --param_dtype; the torch "
                  "baselines run under the same dtype, bf16 as autocast). fp32 is the like-for-like CPU default.")
flags.DEFINE_enum("param_dtype", "float32", ["float32", "bfloat16"],
                  "train_step / decode: weights (and AdamW state) dtype; bfloat16 fits an 8B model's update on one GPU.")
flags.DEFINE_list("attention", ["auto"], "train_step: attention kernels to time on the same state (the first is the "
                  "headline, the others baselines: e.g. auto,xla); other modes use the first.")
flags.DEFINE_list("kv_orders", [""], "decode_kernel: KV cache axis orders to time ('' = the platform's; e.g. "
                  "lnksd,lnskd).")
flags.DEFINE_list("decode_forms", [""], "decode_kernel: one-token decode attention forms to time ('' = the "
                  "platform's; einsum, values, reduce: kernels/xla_attention.py DECODE_FORMS).")
flags.DEFINE_enum("remat", None, ["none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable"],
                  "Override the preset's rematerialisation policy.")
flags.DEFINE_bool("baseline", True, "Also run the mode's baseline where it has one (transformers/torch; grpo_step: the "
                  "update with the rematerialised output head).")
flags.DEFINE_string("json_out", None, "Write the JSON result here too.")
flags.DEFINE_integer("group_size", 0, "data mode: records per compressed chunk of the ArrayRecord shards "
                     "(0: the library's, tfds_rows.GROUP_SIZE).", lower_bound=0)
flags.DEFINE_integer("samples", 8, "grpo_rollout mode: episodes per prompt (--batch prompts).", lower_bound=1)
flags.DEFINE_integer("page_size", 64, "grpo_rollout mode: the paged engine's KV page size.", lower_bound=1)
flags.DEFINE_string("checkpoint", "smollm2", "kv_dtype mode: an HF checkpoint directory or a GGUF name.")
flags.DEFINE_list("kv_dtypes", ["bfloat16", "float8_e4m3fn", "float8_e5m2"], "kv_dtype mode: cache dtypes to "
                  "compare with an fp32 cache (--batch GSM8K prompts, --new_tokens greedy tokens).")
flags.DEFINE_string("workdir", None, "tools mode: a finished quickstart workdir (its SFT policy drives the "
                    "tool-latency overlap benchmark).")


def main(argv):
    del argv
    if FLAGS.mode == "tools" and FLAGS.workdir and not os.path.isdir(os.path.join(FLAGS.workdir, "sft", "final")):
        raise app.UsageError(f"--workdir={FLAGS.workdir}: not a finished quickstart workdir (no sft/final in it)")
    from reagent_jax import models
    cfg = models.preset(FLAGS.preset, attention=FLAGS.attention[0],
                        **({"remat_policy": FLAGS.remat} if FLAGS.remat else {}))
    if FLAGS.mode == "forward":
        from reagent_jax.benchmarks import forward as bench
        result = bench.run(cfg, batch=FLAGS.batch, seq_len=FLAGS.seq_len, iters=FLAGS.iters, with_torch=FLAGS.baseline,
                           dtype=FLAGS.dtype)
    elif FLAGS.mode == "rollout":
        from reagent_jax.benchmarks import rollout as bench
        result = bench.run(cfg, batch=FLAGS.batch, prompt_len=FLAGS.prompt_len, new_tokens=FLAGS.new_tokens,
                           iters=FLAGS.iters, with_torch=FLAGS.baseline, dtype=FLAGS.dtype)
    elif FLAGS.mode == "train_step":
        from reagent_jax.benchmarks import train as bench
        result = bench.run_train_step(cfg, batch=FLAGS.batch, seq_len=FLAGS.seq_len, iters=FLAGS.iters,
                                      dtype=FLAGS.dtype, param_dtype=FLAGS.param_dtype,
                                      attentions=tuple(FLAGS.attention))
    elif FLAGS.mode == "decode_kernel":
        from reagent_jax.benchmarks import rollout as bench
        result = bench.decode_kernel(cfg, slots=FLAGS.batch, min_len=FLAGS.min_prompt, max_len=FLAGS.prompt_len,
                                     steps=FLAGS.decode_steps, iters=FLAGS.iters, dtype=FLAGS.dtype,
                                     param_dtype=FLAGS.param_dtype, orders=tuple(FLAGS.kv_orders),
                                     forms=tuple(FLAGS.decode_forms))
    elif FLAGS.mode == "decode":
        from reagent_jax.benchmarks import rollout as bench
        result = bench.mixed_decode(cfg, slots=FLAGS.batch, min_prompt=FLAGS.min_prompt, max_prompt=FLAGS.prompt_len,
                                    new_tokens=FLAGS.new_tokens, decode_steps=FLAGS.decode_steps, iters=FLAGS.iters,
                                    dtype=FLAGS.dtype, param_dtype=FLAGS.param_dtype)
    elif FLAGS.mode == "grpo_step":
        from reagent_jax.benchmarks import train as bench
        result = bench.run_grpo_step(cfg, iters=FLAGS.iters, dtype=FLAGS.dtype, baseline=FLAGS.baseline)
    elif FLAGS.mode == "serve":
        from reagent_jax.benchmarks import serve as bench
        result = bench.server_under_load(FLAGS.preset, clients=FLAGS.clients, prompt_len=FLAGS.prompt_len,
                                         new_tokens=FLAGS.new_tokens, stream=FLAGS.stream, repeats=FLAGS.iters,
                                         **({"vocab_size": FLAGS.vocab_size} if FLAGS.vocab_size else {}))
    elif FLAGS.mode == "data":
        from reagent_jax.benchmarks import data as bench
        result = bench.run(num_records=max(FLAGS.iters, 1000), reads=max(FLAGS.iters, 1000),
                           **({"group_size": FLAGS.group_size} if FLAGS.group_size else {}))
    elif FLAGS.mode == "grpo_rollout":
        from reagent_jax.benchmarks import paged as bench
        result = bench.grpo_rollout(cfg, questions=FLAGS.batch, n=FLAGS.samples, prompt_len=FLAGS.prompt_len,
                                    new_tokens=FLAGS.new_tokens, page_size=FLAGS.page_size, iters=FLAGS.iters,
                                    dtype=FLAGS.dtype)
    elif FLAGS.mode == "kv_dtype":
        from reagent_jax.benchmarks import kv_dtype as bench
        result = bench.run(FLAGS.checkpoint, FLAGS.kv_dtypes, prompts=FLAGS.batch, new_tokens=FLAGS.new_tokens)
    elif FLAGS.mode == "eval":
        from reagent_jax.benchmarks import serve as bench
        result = bench.eval_wall_time()
    else:
        from reagent_jax.benchmarks import tools as bench
        result = bench.run(iters=FLAGS.iters, workdir=FLAGS.workdir)
    result = {"mode": FLAGS.mode, "preset": FLAGS.preset, **result}
    text = json.dumps(result, indent=2, sort_keys=True)
    print(text)
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    app.run(main)
