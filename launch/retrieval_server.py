"""Serve a BM25 index over a JSONL corpus with the Search-R1 retriever protocol.

    python launch/retrieval_server.py --corpus=corpus.jsonl --port=8000
    curl -s localhost:8000/retrieve -d '{"queries": ["capital of France"], "topk": 3, "return_scores": true}'

Point the search tool at it with REAGENT_RETRIEVAL_URL=http://127.0.0.1:8000/retrieve (any server
speaking the same protocol, e.g. a dense wiki-18 retriever, works the same way).
"""

from __future__ import annotations

import os
import sys
import time

from absl import app, flags, logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from reagent_jax.agent import retrieval

FLAGS = flags.FLAGS
flags.DEFINE_string("corpus", None, "JSONL corpus: one {\"id\", \"title\", \"contents\" or \"text\"} per line.")
flags.DEFINE_string("host", "127.0.0.1", "Address to bind; loopback by default (0.0.0.0 exposes it).")
flags.DEFINE_integer("port", 8000, "Port to listen on.")
flags.DEFINE_integer("topk", 3, "Passages per query when a request gives no topk.")
flags.DEFINE_string("log_level", "warning", "uvicorn log level.")
flags.mark_flag_as_required("corpus")


def main(argv: list[str]) -> None:
    del argv
    start = time.perf_counter()
    try:
        index = retrieval.BM25Index.from_jsonl(FLAGS.corpus)
    except retrieval.RetrievalError as exc:
        raise app.UsageError(str(exc)) from None
    logging.info("indexed %d documents from %s in %.2f s", len(index), FLAGS.corpus, time.perf_counter() - start)
    print(f"retrieval server: {len(index)} documents, listening on http://{FLAGS.host}:{FLAGS.port}/retrieve",
          flush=True)
    retrieval.serve(index, host=FLAGS.host, port=FLAGS.port, default_topk=FLAGS.topk, log_level=FLAGS.log_level)


if __name__ == "__main__":
    app.run(main)
