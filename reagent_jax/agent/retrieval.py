"""BM25 retrieval over a local JSONL corpus, and an HTTP server speaking the Search-R1 retriever protocol.

Protocol (Search-R1 / verl `retrieval_server.py`, so the search tool can point at a dense wiki-18
server instead of this one):
    POST /retrieve {"queries": [str, ...], "topk": int, "return_scores": bool}
    -> {"result": [[{"document": {"id": str, "contents": str}, "score": float}, ...], ...]}
       (without scores: {"result": [[{"id", "contents"}, ...], ...]})
`contents` is "title\\ntext" as in wiki-18, so clients take the first line as the title.
Corpus lines: {"id": ..., "title": ..., "contents" or "text": ...}.
"""

# No `from __future__ import annotations`: FastAPI must see the request model of make_app as a class.
import asyncio
import concurrent.futures
import json
import threading
import time
from typing import Any, Iterable

import bm25s
import httpx

MAX_TOPK = 100
MAX_QUERIES = 1024
MAX_QUERY_CHARS = 4096


class RetrievalError(RuntimeError):
    """A corpus that cannot be read, or a retrieval server that answers badly."""


def normalise_document(row: dict, where: str) -> dict:
    """{"id", "title", "text", "contents"} from a corpus row with "contents" or "title" + "text"."""
    if not isinstance(row, dict):
        raise RetrievalError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if "contents" in row:
        contents = str(row["contents"])
        first, _, rest = contents.partition("\n")
        if row.get("title") and first.strip().strip('"') != str(row["title"]).strip():
            # {"id", "title", "contents"}: contents is the body; served and indexed as "title\nbody"
            title, text = str(row["title"]), str(row.get("text") or contents)
            contents = f"{title}\n{text}"
        else:  # wiki-18: the title is the first line of contents
            title = str(row.get("title") or first.strip().strip('"'))
            text = str(row.get("text") or rest)
    elif "text" in row:
        title, text = str(row.get("title", "")), str(row["text"])
        contents = f"{title}\n{text}" if title else text
    else:
        raise RetrievalError(f"{where}: a document needs a 'contents' or a 'text' field; has {sorted(row)}")
    doc_id = str(row.get("id", row.get("_id", where)))
    return {"id": doc_id, "title": title, "text": text, "contents": contents}


def load_corpus(path: str) -> list[dict]:
    """Read a JSONL corpus; errors name the file and line."""
    docs = []
    try:
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise RetrievalError(f"{path}:{line_no}: invalid JSON ({exc})") from None
                docs.append(normalise_document(row, f"{path}:{line_no}"))
    except OSError as exc:
        raise RetrievalError(f"cannot read corpus {path}: {exc}") from None
    if not docs:
        raise RetrievalError(f"corpus {path} has no documents")
    return docs


class BM25Index:
    """An in-memory BM25 index (bm25s, English stopwords) over normalised documents."""

    def __init__(self, docs: list[dict], k1: float = 1.5, b: float = 0.75):
        if not docs:
            raise RetrievalError("cannot index an empty corpus")
        self.docs = docs
        tokens = bm25s.tokenize([d["contents"] for d in docs], stopwords="en", show_progress=False)
        if not tokens.vocab:  # bm25s would fail with "max() arg is an empty sequence"
            raise RetrievalError(f"the corpus ({len(docs)} documents) has no indexable words: every document is "
                                 "empty, stopwords only, or one-letter tokens")
        self._bm25 = bm25s.BM25(k1=k1, b=b)
        self._bm25.index(tokens, show_progress=False)
        self._lock = threading.Lock()  # bm25s keeps no per-query state, but make no assumption

    @classmethod
    def from_jsonl(cls, path: str) -> "BM25Index":
        return cls(load_corpus(path))

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> "BM25Index":
        return cls([{"id": str(i), "title": "", "text": t, "contents": t} for i, t in enumerate(texts)])

    def __len__(self) -> int:
        return len(self.docs)

    def search(self, queries: list[str], topk: int = 3) -> list[list[tuple[dict, float]]]:
        """Top-`topk` (document, score) per query, best first; documents with score 0 are dropped."""
        if not queries:
            return []
        k = max(1, min(int(topk), len(self.docs)))
        query_tokens = bm25s.tokenize(list(queries), stopwords="en", show_progress=False, return_ids=False)
        with self._lock:
            ids, scores = self._bm25.retrieve(query_tokens, k=k, show_progress=False)
        return [[(self.docs[int(i)], float(s)) for i, s in zip(row_ids, row_scores) if s > 0]
                for row_ids, row_scores in zip(ids, scores)]


def make_app(index: BM25Index, default_topk: int = 3):
    """A FastAPI app serving `index` with the Search-R1 protocol (+ GET /health). The body is
    read as JSON whatever its content type (`curl -d` sends a form type); errors answer 400 in
    the OpenAI format the main server uses: {"error": {"message", "type", "param", "code"}}."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, Field, ValidationError

    class RetrieveRequest(BaseModel):
        queries: list[str] = Field(..., max_length=MAX_QUERIES)
        topk: int | None = Field(None, ge=1, le=MAX_TOPK)
        return_scores: bool = False

    app = FastAPI(title="reagent-jax BM25 retriever")

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "documents": len(index)}

    def error(message: str, param=None) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": param,
                                       "code": None}}, status_code=400)

    @app.post("/retrieve")
    async def retrieve_endpoint(raw: Request):
        try:
            request = RetrieveRequest.model_validate_json(await raw.body())
        except ValidationError as e:
            first = e.errors()[0]
            param = ".".join(str(p) for p in first.get("loc", ())) or None
            return error(f"invalid request body: {first.get('msg', e)}" + (f" (at {param})" if param else ""), param)
        return await asyncio.to_thread(retrieve, request)  # BM25 off the event loop

    def retrieve(request) -> dict:
        queries = [q[:MAX_QUERY_CHARS] for q in request.queries]
        results = index.search(queries, request.topk or default_topk)
        public = lambda d: {"id": d["id"], "contents": d["contents"]}  # noqa: E731
        if request.return_scores:
            return {"result": [[{"document": public(d), "score": s} for d, s in hits] for hits in results]}
        return {"result": [[public(d) for d, _ in hits] for hits in results]}

    return app


def serve(index: BM25Index, host: str = "127.0.0.1", port: int = 8000, default_topk: int = 3,
          log_level: str = "warning") -> None:
    """Serve until interrupted (blocking)."""
    import uvicorn

    uvicorn.run(make_app(index, default_topk), host=host, port=port, log_level=log_level)


class RetrievalClient:
    """Client of any server speaking the protocol above (this one, or a dense wiki-18 server)."""

    def __init__(self, url: str, timeout_s: float = 20.0):
        self.url = url if url.rstrip("/").endswith("/retrieve") else url.rstrip("/") + "/retrieve"
        self._client = httpx.Client(timeout=timeout_s)

    def search(self, queries: list[str], topk: int = 3) -> list[list[tuple[dict, float | None]]]:
        try:
            response = self._client.post(self.url, json={"queries": queries, "topk": topk, "return_scores": True})
        except httpx.HTTPError as exc:
            raise RetrievalError(f"retrieval server {self.url} unreachable: {exc}") from None
        if response.status_code != 200:
            raise RetrievalError(f"retrieval server {self.url} answered HTTP {response.status_code}: "
                                 f"{response.text[:300]}")
        try:
            result = response.json()["result"]
            return [[_parse_hit(hit, f"result[{i}][{j}]") for j, hit in enumerate(hits)]
                    for i, hits in enumerate(result)]
        except (ValueError, KeyError, TypeError) as exc:
            raise RetrievalError(f"retrieval server {self.url} sent an unexpected response: {exc!r}") from None

    def close(self) -> None:
        self._client.close()


def _parse_hit(hit: Any, where: str) -> tuple[dict, float | None]:
    if isinstance(hit, dict) and "document" in hit:
        score = hit.get("score")
        return normalise_document(hit["document"], where), (float(score) if score is not None else None)
    return normalise_document(hit, where), None


def benchmark_queries(url: str, n: int = 200, concurrency: int = 8, queries: list[str] | None = None,
                      topk: int = 3, timeout_s: float = 20.0) -> dict:
    """Fire `n` single-query requests with `concurrency` threads; queries/s and latency percentiles."""
    queries = queries or ["capital city of a country", "who wrote the novel", "largest river",
                          "year the war ended", "inventor of the telephone"]
    client = RetrievalClient(url, timeout_s=timeout_s)
    errors = 0

    def one(i: int) -> float:
        t0 = time.perf_counter()
        client.search([queries[i % len(queries)]], topk)
        return time.perf_counter() - t0

    latencies = []
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        futures = [pool.submit(one, i) for i in range(n)]
        for future in futures:
            try:
                latencies.append(future.result())
            except RetrievalError:
                errors += 1
    wall = time.perf_counter() - start
    client.close()
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else 0.0  # noqa: E731
    return {"requests": n, "concurrency": concurrency, "errors": errors, "queries_per_s": n / wall if wall else 0.0,
            "latency_p50_ms": 1000 * pick(0.5), "latency_p95_ms": 1000 * pick(0.95)}
