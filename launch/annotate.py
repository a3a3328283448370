"""Build Agent-RRM SFT data: a strong annotator model judges agent trajectories over HTTP.

    python launch/annotate.py --input=trajectories.jsonl --output=rrm_sft.jsonl \
        --base_url=http://node1:8000/v1,http://node2:8000/v1 --model=openai/gpt-oss-120b --concurrency=64

Any OpenAI-compatible server works (vLLM, SGLang, a hosted API; the key is read from the env var
named by --api_key_env). Rerunning the same command resumes: ids already in --output (and in
--rejected_output) are skipped. See reagent_jax/rrm/remote_annotation.py for the record schemas.
Prints one JSON summary line at the end; exits with status 2 when requests were sent and none got
a reply (endpoint down or misconfigured).
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from reagent_jax.endpoints import EndpointConfig
from reagent_jax.rrm.remote_annotation import annotate_file

FLAGS = flags.FLAGS
flags.DEFINE_string("input", None, "JSONL of trajectories: {id?, question, trajectory|messages, tools?} per line.")
flags.DEFINE_string("output", None, "JSONL of accepted RRM SFT records (appended to; reruns resume).")
flags.DEFINE_list("base_url", None, "Base URL(s) of the annotator, e.g. http://127.0.0.1:8000/v1 (comma-separated "
                  "replicas are load-balanced).")
flags.DEFINE_string("model", None, "Model name to request.")
flags.DEFINE_integer("concurrency", 16, "Requests in flight at most (over all replicas).")
flags.DEFINE_string("api_key_env", "OPENAI_API_KEY", "Environment variable holding the API key (unset: no key).")
flags.DEFINE_float("timeout_s", 600.0, "Per-attempt timeout in seconds (long trajectories take a while).")
flags.DEFINE_integer("max_retries", 4, "Retries per request after timeouts, connection errors, 429 and 5xx.")
flags.DEFINE_float("temperature", 0.0, "Sampling temperature of the annotator.")
flags.DEFINE_integer("max_tokens", None, "Max tokens per reply (None: the server's default).")
flags.DEFINE_string("extra_body", None, "JSON object merged into each request body, e.g. '{\"top_p\": 0.95}'.")
flags.DEFINE_bool("multi_dim", False, "Also ask for the reasoning / tool_use / information_use sub-scores.")
flags.DEFINE_list("accept", ["ok"], "Parse statuses kept as SFT data (e.g. ok,multiple_scores).")
flags.DEFINE_string("rejected_output", None, "Optional JSONL for replies that were not accepted (with raw text).")
flags.DEFINE_string("annotator", None, "Name recorded in each record's 'annotator' field (default: --model).")
flags.DEFINE_integer("limit", None, "Annotate at most this many new trajectories in this run.")
flags.DEFINE_bool("progress", True, "Show a progress bar.")
flags.mark_flags_as_required(["input", "output", "base_url", "model"])


def main(argv: list[str]) -> None:
    del argv
    try:
        extra = json.loads(FLAGS.extra_body) if FLAGS.extra_body else {}
        if not isinstance(extra, dict):
            raise ValueError("--extra_body must be a JSON object")
        config = EndpointConfig(base_urls=tuple(FLAGS.base_url), model=FLAGS.model, api_key_env=FLAGS.api_key_env,
                                timeout_s=FLAGS.timeout_s, max_retries=FLAGS.max_retries,
                                max_concurrency=FLAGS.concurrency, temperature=FLAGS.temperature,
                                max_tokens=FLAGS.max_tokens, extra_body=extra)
        summary = annotate_file(FLAGS.input, FLAGS.output, config, annotator=FLAGS.annotator,
                                accept_statuses=FLAGS.accept, rejected_path=FLAGS.rejected_output,
                                multi_dim=FLAGS.multi_dim, limit=FLAGS.limit, progress=FLAGS.progress)
    except (ValueError, FileNotFoundError) as exc:
        raise app.UsageError(str(exc)) from None
    print(json.dumps(summary.as_dict()), flush=True)
    if summary.sent and summary.endpoint_errors == summary.sent:
        sys.exit(2)


if __name__ == "__main__":
    app.run(main)
