"""A `ChatClient` look-alike that answers from a `ModelService` in this process, without HTTP.

Why: the judges (`eval.llm_judge.LLMAnswerJudge`, `rrm.remote.RemoteJudge`) talk to a chat client;
handing them this one makes the project's own model (through the rollout engine, batched with
everything else it runs) the grader or the Agent-RRM, with exactly the server's request handling.

    client = EngineChatClient(ModelService(engine, tok, "judge"), temperature=0.0, max_tokens=1024)
    judge = LLMAnswerJudge(EndpointConfig(model="judge"), client=client)
"""
from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any, Iterator, Mapping, Sequence

from reagent_jax.endpoints import Completion, EndpointError, parse_chat_completion
from reagent_jax.serve.errors import APIError
from reagent_jax.serve.service import ModelService


class EngineChatClient:
    """complete / complete_many / iter_complete / stats / close, as `endpoints.ChatClient`.
    `defaults` are body fields sent with every request (a call's own fields win; None drops one)."""

    def __init__(self, service: ModelService, *, max_concurrency: int = 64, **defaults: Any):
        if max_concurrency < 1:
            raise ValueError(f"EngineChatClient: max_concurrency={max_concurrency} must be >= 1")
        self.service, self.max_concurrency, self.defaults = service, max_concurrency, defaults
        self.url = f"inprocess://{service.name}"
        self._lock = threading.Lock()
        self._counts = {"requests": 0, "attempts": 0, "retries": 0, "succeeded": 0, "failed": 0}

    def _count(self, key: str) -> None:
        with self._lock:
            self._counts[key] += 1

    def complete(self, messages: Sequence[Mapping[str, Any]], **params: Any) -> Completion:
        """One chat completion; raises EndpointError (kind "http_status" with the 4xx/5xx the
        server would have sent, or "internal")."""
        body = {"model": self.service.name, "messages": list(messages), **self.defaults, **params}
        body = {k: v for k, v in body.items() if v is not None}
        self._count("requests")
        self._count("attempts")
        start = time.perf_counter()
        try:
            data = self.service.chat_body(body)
            fields = parse_chat_completion(data)
        except APIError as e:
            self._count("failed")
            raise EndpointError(e.message, url=self.url, status=e.status, attempts=1, kind="http_status") from None
        except Exception as e:  # noqa: BLE001 - reported per item like the HTTP client does
            self._count("failed")
            raise EndpointError(f"{type(e).__name__}: {e}", url=self.url, attempts=1, kind="internal") from None
        self._count("succeeded")
        return Completion(url=self.url, attempts=1, latency_s=time.perf_counter() - start, raw=data, **fields)

    def iter_complete(self, messages_list: Sequence[Sequence[Mapping[str, Any]]], **params: Any
                      ) -> Iterator[tuple[int, Completion | EndpointError]]:
        if not messages_list:
            return
        with concurrent.futures.ThreadPoolExecutor(min(len(messages_list), self.max_concurrency),
                                                   thread_name_prefix="inproc-chat") as pool:
            futures = {pool.submit(self._complete_or_error, m, params): i for i, m in enumerate(messages_list)}
            for f in concurrent.futures.as_completed(futures):
                yield futures[f], f.result()

    def _complete_or_error(self, messages, params) -> Completion | EndpointError:
        try:
            return self.complete(messages, **params)
        except EndpointError as e:
            return e

    def complete_many(self, messages_list: Sequence[Sequence[Mapping[str, Any]]], *, progress: str | None = None,
                      **params: Any) -> list[Completion | EndpointError]:
        """Results in input order; failures are EndpointError items (never raised)."""
        del progress  # the caller's own bar covers it
        out: list[Any] = [None] * len(messages_list)
        for i, r in self.iter_complete(messages_list, **params):
            out[i] = r
        return out

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {**self._counts, "failures_by_kind": {}, "urls": {self.url: dict(self._counts)}}

    def close(self) -> None:
        pass

    def __enter__(self) -> "EngineChatClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
