"""The `search` tool: numbered passages with titles from a BM25 corpus, a retrieval server, or the web.

Backends (REAGENT_SEARCH_BACKEND, or chosen from what is configured):
  local   in-process BM25 over a JSONL corpus (REAGENT_SEARCH_CORPUS)
  http    any Search-R1-protocol retrieval server (REAGENT_RETRIEVAL_URL), e.g. launch/retrieval_server.py
  serper  Google results through serper.dev (SERPER_API_KEY); needs a network
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading

import httpx

from reagent_jax.agent import retrieval
from reagent_jax.agent.tools.base import NOT_CONFIGURED, RUNTIME_ERROR, Tool, ToolError, resolve_config

BACKENDS = ("local", "http", "serper")


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    backend: str | None = None      # None: http if a url is set, else local if a corpus is set
    corpus: str | None = None
    url: str | None = None
    topk: int = 3
    serper_api_key: str | None = None
    request_timeout_s: float = 20.0
    max_passage_chars: int = 1200

    @classmethod
    def from_env(cls, **overrides) -> "SearchConfig":
        env = os.environ.get
        values = dict(backend=env("REAGENT_SEARCH_BACKEND") or None, corpus=env("REAGENT_SEARCH_CORPUS") or None,
                      url=env("REAGENT_RETRIEVAL_URL") or None, topk=int(env("REAGENT_SEARCH_TOPK", "3")),
                      serper_api_key=env("SERPER_API_KEY") or None)
        values.update(overrides)
        return cls(**values)

    def resolved_backend(self) -> str | None:
        if self.backend:
            return self.backend
        return "http" if self.url else "local" if self.corpus else None


@functools.lru_cache(maxsize=8)
def _local_index(path: str, mtime: float) -> retrieval.BM25Index:
    del mtime  # part of the cache key: an edited corpus is re-indexed
    return retrieval.BM25Index.from_jsonl(path)


def format_passages(hits: list[tuple[dict, float | None]], max_chars: int) -> str:
    """'Doc 1 (Title: ...) text' lines, the Search-R1 observation format."""
    if not hits:
        return "No results found."
    lines = []
    for i, (doc, _score) in enumerate(hits, 1):
        text = " ".join(doc["text"].split())
        if len(text) > max_chars:
            text = text[:max_chars] + " ..."
        lines.append(f"Doc {i} (Title: {doc['title'] or 'untitled'}) {text}")
    return "\n".join(lines)


class SearchTool(Tool):
    name = "search"
    description = ("Search a knowledge source and return the top passages, numbered, with titles. "
                   "Use short keyword queries; search again with different words if nothing fits.")
    parameters = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "The search query.", "maxLength": 2000, "minLength": 1},
            "topk": {"type": "integer", "description": "How many passages to return (default 3).",
                     "minimum": 1, "maximum": 20},
        },
        "required": ["query"],
        "additionalProperties": False,
    }

    def __init__(self, config: SearchConfig | None = None, timeout_s: float = 30.0, max_output_chars: int = 8000,
                 **overrides):
        self.config = resolve_config(SearchConfig, config, overrides)
        backend = self.config.resolved_backend()
        if backend is not None and backend not in BACKENDS:
            raise ValueError(f"unknown search backend {backend!r}; choose one of {BACKENDS}")
        super().__init__(timeout_s=timeout_s, max_output_chars=max_output_chars)
        self._client: retrieval.RetrievalClient | None = None
        self._client_lock = threading.Lock()

    def run(self, query: str, topk: int | None = None) -> str:
        topk = topk or self.config.topk
        backend = self.config.resolved_backend()
        if backend is None:
            raise ToolError(NOT_CONFIGURED, "no search backend is configured: set REAGENT_RETRIEVAL_URL (a retrieval "
                                            "server) or REAGENT_SEARCH_CORPUS (a JSONL corpus), or pass backend=...")
        if backend == "local":
            hits = self._search_local(query, topk)
        elif backend == "http":
            hits = self._search_http(query, topk)
        else:
            hits = self._search_serper(query, topk)
        return format_passages(hits, self.config.max_passage_chars)

    def _search_local(self, query: str, topk: int) -> list:
        path = self.config.corpus
        if not path:
            raise ToolError(NOT_CONFIGURED, "the local backend needs a corpus (REAGENT_SEARCH_CORPUS or corpus=...)")
        try:
            index = _local_index(os.path.abspath(path), os.path.getmtime(path))
        except OSError as exc:
            raise ToolError(NOT_CONFIGURED, f"cannot read the search corpus: {exc}") from None
        except retrieval.RetrievalError as exc:
            raise ToolError(NOT_CONFIGURED, str(exc)) from None
        return index.search([query], topk)[0]

    def _search_http(self, query: str, topk: int) -> list:
        if not self.config.url:
            raise ToolError(NOT_CONFIGURED, "the http backend needs a server URL (REAGENT_RETRIEVAL_URL or url=...)")
        with self._client_lock:  # one pooled client per tool, shared by call_many's threads
            if self._client is None:
                self._client = retrieval.RetrievalClient(self.config.url, self.config.request_timeout_s)
        try:
            return self._client.search([query], topk)[0]
        except retrieval.RetrievalError as exc:
            raise ToolError(RUNTIME_ERROR, str(exc)) from None
        except IndexError:
            raise ToolError(RUNTIME_ERROR, "the retrieval server returned no result list for the query") from None

    def _search_serper(self, query: str, topk: int) -> list:
        if not self.config.serper_api_key:
            raise ToolError(NOT_CONFIGURED, "the serper backend needs SERPER_API_KEY")
        try:
            response = httpx.post("https://google.serper.dev/search", json={"q": query, "num": topk},
                                  headers={"X-API-KEY": self.config.serper_api_key},
                                  timeout=self.config.request_timeout_s)
            response.raise_for_status()
            organic = response.json().get("organic", [])
        except (httpx.HTTPError, ValueError) as exc:
            raise ToolError(RUNTIME_ERROR, f"web search failed: {exc}") from None
        if not isinstance(organic, list):
            raise ToolError(RUNTIME_ERROR, "web search returned an unexpected response")
        return [({"title": r.get("title", ""), "text": f"{r.get('snippet', '')} (URL: {r.get('link', '')})"}, None)
                for r in organic[:topk] if isinstance(r, dict)]
