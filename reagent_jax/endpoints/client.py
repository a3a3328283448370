"""Chat-completions client for any OpenAI-compatible server (vLLM, SGLang, TGI, OpenAI, proxies).

Why our own client rather than `openai.OpenAI`: judging and annotation send tens of thousands of
requests to self-hosted replicas, and one bad reply must not stop a training step. This client
spreads requests over replicas (`EndpointPool`), caps the requests in flight (one semaphore per
client, shared by every thread that uses it), retries what is worth retrying with exponential
backoff and jitter, and reports what finally went wrong as one `EndpointError`.

    client = ChatClient(EndpointConfig(base_urls=("http://a:8000/v1", "http://b:8000/v1"), model="m"))
    c = client.complete([{"role": "user", "content": "hi"}])        # Completion or EndpointError raised
    outs = client.complete_many([msgs0, msgs1, ...])                # [Completion | EndpointError], in order

Retried: timeouts, connection errors, HTTP 429 (honouring Retry-After up to `backoff_max_s`) and
5xx, and 2xx replies whose body is not JSON or lacks `choices[0].message`. Not retried: other 4xx
(a bad request stays bad). Each attempt goes to a replica other than the one that just failed
when there is one. The API key and any password in a URL are never shown in an EndpointError.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import random
import threading
import time
import urllib.parse
from typing import Any, Iterator, Mapping, Sequence

import httpx

from reagent_jax.endpoints.config import EndpointConfig
from reagent_jax.endpoints.pool import EndpointPool

BODY_EXCERPT_CHARS = 500
MIN_SECRET_CHARS = 8  # shorter keys / URL passwords are placeholders ("x", "EMPTY"), not redacted
Messages = Sequence[Mapping[str, Any]]


class EndpointError(Exception):
    """A request that failed for good.

    kind: "timeout", "connection", "http_status", "malformed" (reply not a chat completion) or
    "internal" (an unexpected client-side exception, reported per item by the batch API)."""

    def __init__(self, message: str, *, url: str | None = None, status: int | None = None, body: str = "",
                 attempts: int = 0, kind: str = "unknown", retryable: bool = False) -> None:
        self.url, self.status, self.body, self.attempts = url, status, body[:BODY_EXCERPT_CHARS], attempts
        self.kind, self.retryable, self.detail = kind, retryable, message
        where = f" at {public_url(url)}" if url else ""
        code = f" (HTTP {status})" if status is not None else ""
        excerpt = f"; body: {self.body!r}" if self.body else ""
        super().__init__(f"{kind}{code}{where} after {attempts} attempt(s): {message}{excerpt}")

    def __reduce__(self):  # keyword-only fields: pickle them explicitly (process pools, logging queues)
        return (_rebuild_error, (self.detail, self.url, self.status, self.body, self.attempts, self.kind,
                                 self.retryable))


def public_url(url: str) -> str:
    """The URL as it may be shown: a password in it (http://user:pw@host) becomes ***."""
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.password is None:
            return url
        return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)))
    except ValueError:  # not a URL we can read: show nothing of it that could be a secret
        return "<unparseable url>"


def _redact(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def _rebuild_error(message, url, status, body, attempts, kind, retryable) -> EndpointError:
    return EndpointError(message, url=url, status=status, body=body, attempts=attempts, kind=kind,
                         retryable=retryable)


@dataclasses.dataclass(frozen=True)
class Completion:
    """The first choice's text (plus every choice's text in `texts` when n > 1) and where it came from."""

    text: str
    reasoning_content: str | None
    finish_reason: str | None
    model: str | None
    url: str
    attempts: int
    latency_s: float  # of the successful attempt
    texts: tuple[str, ...] = ()
    tool_calls: tuple[dict[str, Any], ...] = ()
    usage: dict[str, Any] = dataclasses.field(default_factory=dict)
    raw: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)


class _AttemptFailed(Exception):
    def __init__(self, kind: str, message: str, *, retryable: bool, status: int | None = None, body: str = "",
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.kind, self.message, self.retryable = kind, message, retryable
        self.status, self.body, self.retry_after_s = status, body, retry_after_s


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    raise ValueError(f"message content is a {type(content).__name__}, not a string")


def parse_chat_completion(data: Any) -> dict[str, Any]:
    """Fields of a chat.completion body; ValueError saying what is missing when it is not one."""
    if not isinstance(data, dict):
        raise ValueError(f"response body is a JSON {type(data).__name__}, not an object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        err = data.get("error")
        raise ValueError("response has no 'choices'" + (f" (error: {str(err)[:200]})" if err else ""))
    texts = []
    for k, choice in enumerate(choices):
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            raise ValueError(f"choices[{k}] has no 'message' object")
        texts.append(_content_text(message.get("content")))
    first = choices[0]["message"]
    reasoning = first.get("reasoning_content", first.get("reasoning"))
    calls = first.get("tool_calls") or []
    return {"text": texts[0], "texts": tuple(texts), "finish_reason": choices[0].get("finish_reason"),
            "reasoning_content": reasoning if isinstance(reasoning, str) else None,
            "tool_calls": tuple(c for c in calls if isinstance(c, dict)) if isinstance(calls, list) else (),
            "model": data.get("model"), "usage": data.get("usage") if isinstance(data.get("usage"), dict) else {}}


def _retry_after(headers: httpx.Headers) -> float | None:
    try:
        value = float(headers.get("retry-after", ""))
    except ValueError:
        return None  # absent, or an HTTP date (rare from model servers): use our own backoff
    return value if value >= 0 else None


def validate_messages(messages: Any, where: str = "messages") -> None:
    """Raises ValueError naming the bad message; the server would only say "400"."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ValueError(f"{where} must be a non-empty list of chat messages, got {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise ValueError(f"{where}[{i}] is not a chat message dict with a string 'role': {m!r:.200}")


class ChatClient:
    """Thread-safe; share one per service. Use as a context manager or call `close()`."""

    def __init__(self, config: EndpointConfig, *, seed: int | None = None) -> None:
        config.require_configured("ChatClient")
        self.config = config
        self.pool = EndpointPool(config.base_urls, config.balance)
        self._slots = threading.BoundedSemaphore(config.max_concurrency)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._counts = {"requests": 0, "attempts": 0, "retries": 0, "succeeded": 0, "failed": 0}
        self._failures: dict[str, int] = {}
        headers = {"Content-Type": "application/json", "User-Agent": "reagent-jax"}
        key = config.resolved_api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        passwords = (urllib.parse.urlsplit(u).password for u in config.base_urls)
        # never shown in an EndpointError (placeholder keys such as "x" would garble every message)
        self._secrets = tuple(s for s in (key, *passwords) if s and len(s) >= MIN_SECRET_CHARS)
        limits = httpx.Limits(max_connections=config.max_concurrency, max_keepalive_connections=config.max_concurrency)
        self._http = httpx.Client(headers=headers, limits=limits, timeout=httpx.Timeout(config.timeout_s),
                                  follow_redirects=False)

    # --- public API -------------------------------------------------------------------------------

    def complete(self, messages: Messages, **params: Any) -> Completion:
        """One chat completion; raises EndpointError once retries are used up.

        `params` are body fields for this call (temperature, max_tokens, n, stop, ...); they override
        the config, and a None value removes the field."""
        validate_messages(messages)
        return self._run(self._body(messages, params))

    def iter_complete(self, messages_list: Sequence[Messages], **params: Any
                      ) -> Iterator[tuple[int, Completion | EndpointError]]:
        """(index, result) pairs as requests finish, for callers that save results as they come.

        Closing the iterator early cancels the requests not yet started."""
        for i, messages in enumerate(messages_list):
            validate_messages(messages, f"messages_list[{i}]")
        bodies = [self._body(m, params) for m in messages_list]
        if not bodies:
            return
        pool = concurrent.futures.ThreadPoolExecutor(min(len(bodies), self.config.max_concurrency),
                                                     thread_name_prefix="chat")
        futures = {pool.submit(self._run_or_error, b): i for i, b in enumerate(bodies)}
        try:
            for future in concurrent.futures.as_completed(futures):
                yield futures[future], future.result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def complete_many(self, messages_list: Sequence[Messages], *, progress: str | None = None, **params: Any
                      ) -> list[Completion | EndpointError]:
        """Results in input order; a failed item is its EndpointError, never an exception.

        `progress`: a tqdm description to show a progress bar (None: no bar)."""
        results: list[Completion | EndpointError | None] = [None] * len(messages_list)
        bar = None
        if progress is not None:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(messages_list), desc=progress)
        try:
            for i, result in self.iter_complete(messages_list, **params):
                results[i] = result
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        return results  # type: ignore[return-value]  # every slot is filled

    def stats(self) -> dict[str, Any]:
        """Request/attempt/retry/failure counts (failures by kind) and per-URL attempt counts."""
        with self._lock:
            out: dict[str, Any] = dict(self._counts)
            out["failures_by_kind"] = dict(self._failures)
        out["urls"] = self.pool.stats()
        return out

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "ChatClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- internals --------------------------------------------------------------------------------

    def _body(self, messages: Messages, params: Mapping[str, Any]) -> dict[str, Any]:
        c = self.config
        body: dict[str, Any] = {"model": c.model, "messages": list(messages)}
        if c.temperature is not None:
            body["temperature"] = c.temperature
        if c.max_tokens is not None:
            body["max_tokens"] = c.max_tokens
        body.update(c.extra_body)
        body.update(params)
        return {k: v for k, v in body.items() if v is not None}

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def _run_or_error(self, body: dict[str, Any]) -> Completion | EndpointError:
        try:
            return self._run(body)
        except EndpointError as exc:
            return exc
        except Exception as exc:  # a bug must not sink the whole batch; it still surfaces per item
            return EndpointError(_redact(f"{type(exc).__name__}: {exc}", self._secrets), kind="internal")

    def _backoff_s(self, retry: int, retry_after_s: float | None) -> float:
        c = self.config
        with self._lock:
            jitter = 0.5 + 0.5 * self._rng.random()
        delay = min(c.backoff_max_s, c.backoff_base_s * 2 ** (retry - 1)) * jitter
        if retry_after_s is not None:
            delay = max(delay, min(retry_after_s, c.backoff_max_s))
        return delay

    def _run(self, body: dict[str, Any]) -> Completion:
        self._count("requests")
        failed_url: str | None = None
        last: _AttemptFailed | None = None
        total = self.config.max_retries + 1
        for attempt in range(1, total + 1):
            if last is not None:
                self._count("retries")
                time.sleep(self._backoff_s(attempt - 1, last.retry_after_s))
            with self._slots:
                url = self.pool.acquire(avoid=failed_url)
                self._count("attempts")
                ok = False
                try:
                    start = time.perf_counter()
                    fields, raw = self._post(url, body)
                    latency_s = time.perf_counter() - start
                    ok = True
                except _AttemptFailed as exc:
                    last, failed_url = exc, url
                finally:
                    self.pool.release(url, ok=ok)
            if ok:
                self._count("succeeded")
                return Completion(url=url, attempts=attempt, latency_s=latency_s, raw=raw, **fields)
            assert last is not None
            if not last.retryable:
                break
        assert last is not None and failed_url is not None
        self._count("failed")
        with self._lock:
            self._failures[last.kind] = self._failures.get(last.kind, 0) + 1
        raise EndpointError(_redact(last.message, self._secrets), url=failed_url, status=last.status,
                            body=_redact(last.body, self._secrets), attempts=attempt, kind=last.kind,
                            retryable=last.retryable)

    def _post(self, base_url: str, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        url = base_url if base_url.endswith("/chat/completions") else f"{base_url}/chat/completions"
        try:
            response = self._http.post(url, json=body)
        except httpx.TimeoutException as exc:
            raise _AttemptFailed("timeout", f"no reply within {self.config.timeout_s:g} s ({type(exc).__name__})",
                                 retryable=True) from None
        except httpx.HTTPError as exc:  # connect/read/write/protocol errors, bad content encoding
            raise _AttemptFailed("connection", f"{type(exc).__name__}: {exc}", retryable=True) from None
        status = response.status_code
        text = response.content.decode("utf-8", errors="replace")
        if status == 429 or status >= 500:
            raise _AttemptFailed("http_status", "server busy or failing", retryable=True, status=status, body=text,
                                 retry_after_s=_retry_after(response.headers))
        if not 200 <= status < 300:
            raise _AttemptFailed("http_status", "request rejected", retryable=False, status=status, body=text)
        try:
            data = response.json()
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep to decode
            raise _AttemptFailed("malformed", f"response body is not JSON ({exc})", retryable=True, status=status,
                                 body=text) from None
        try:
            return parse_chat_completion(data), data
        except ValueError as exc:
            raise _AttemptFailed("malformed", str(exc), retryable=True, status=status, body=text) from None
