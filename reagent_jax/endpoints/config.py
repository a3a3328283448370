"""Settings of one OpenAI-compatible chat-completions service (one model, one or more replicas).

Why a dataclass of plain values: launch flags, ml_collections configs and tests all build the same
object, and a frozen config can be shared by threads and logged as it is (the API key is hidden).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Sequence

BALANCE_STRATEGIES = ("least_inflight", "round_robin")


def _as_urls(base_urls: str | Sequence[str] | None) -> tuple[str, ...]:
    if base_urls is None:
        return ()
    if isinstance(base_urls, str):
        base_urls = base_urls.split(",")
    return tuple(u.strip().rstrip("/") for u in base_urls if u and u.strip())


@dataclasses.dataclass(frozen=True)
class EndpointConfig:
    """One model served at one or more base URLs (OpenAI style, e.g. "http://host:8000/v1").

    The request goes to `{base_url}/chat/completions` (a URL that already ends in
    "/chat/completions" is used as it is). `api_key` wins over the environment variable named by
    `api_key_env`; with neither, no Authorization header is sent (local vLLM / SGLang servers).
    `timeout_s` bounds each attempt (connect, and each wait for bytes); `max_retries` counts the
    extra attempts after the first. `extra_body` is merged into every request body (e.g.
    {"top_p": 0.95} or vLLM's {"chat_template_kwargs": {"enable_thinking": false}}).
    """

    base_urls: tuple[str, ...] = ()
    model: str | None = None
    api_key: str | None = dataclasses.field(default=None, repr=False)
    api_key_env: str | None = "OPENAI_API_KEY"
    timeout_s: float = 120.0
    max_retries: int = 4
    max_concurrency: int = 16
    temperature: float | None = 0.0
    max_tokens: int | None = None
    extra_body: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    balance: str = "least_inflight"
    backoff_base_s: float = 0.5
    backoff_max_s: float = 20.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_urls", _as_urls(self.base_urls))
        object.__setattr__(self, "extra_body", dict(self.extra_body or {}))
        for url in self.base_urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"EndpointConfig.base_urls: {url!r} is not an http(s) URL")
        if self.balance not in BALANCE_STRATEGIES:
            raise ValueError(f"EndpointConfig.balance must be one of {BALANCE_STRATEGIES}, got {self.balance!r}")
        checks = {"timeout_s": self.timeout_s > 0, "max_retries": self.max_retries >= 0,
                  "max_concurrency": self.max_concurrency >= 1, "backoff_base_s": self.backoff_base_s >= 0,
                  "backoff_max_s": self.backoff_max_s >= 0,
                  "max_tokens": self.max_tokens is None or self.max_tokens >= 1}
        for name, good in checks.items():
            if not good:
                raise ValueError(f"EndpointConfig.{name} is out of range: {getattr(self, name)!r}")

    @property
    def configured(self) -> bool:
        """True when there is somewhere to send requests and a model to name."""
        return bool(self.base_urls and self.model)

    @property
    def base_url(self) -> str | None:
        """The first base URL (for code written against a single-URL config)."""
        return self.base_urls[0] if self.base_urls else None

    def resolved_api_key(self) -> str | None:
        """The key without surrounding whitespace (a key file's trailing newline). A key an HTTP
        header cannot carry is refused here, without showing it: httpx's own error would quote it."""
        source = "EndpointConfig.api_key"
        key = self.api_key
        if not key and self.api_key_env:
            source, key = f"${self.api_key_env}", os.environ.get(self.api_key_env)
        key = (key or "").strip()
        if any(not 32 < ord(ch) < 127 for ch in key):
            raise ValueError(f"the API key from {source} holds whitespace, control or non-ASCII characters, "
                             "which an HTTP header cannot carry (key not shown)")
        return key or None

    def require_configured(self, what: str = "endpoint") -> None:
        if not self.base_urls:
            raise ValueError(f"{what}: no base URL configured (EndpointConfig.base_urls is empty)")
        if not self.model:
            raise ValueError(f"{what}: no model configured (EndpointConfig.model is empty)")

    def describe(self) -> str:
        urls = ", ".join(self.base_urls) or "<no url>"
        return f"{self.model or '<no model>'} at {urls}"

    def replace(self, **changes: Any) -> "EndpointConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, prefix: str, fallback_prefix: str | None = None, default_model: str | None = None,
                 timeout_s: float = 120.0, **fields: Any) -> "EndpointConfig":
        """Reads PREFIX_BASE_URL (comma-separated for replicas), PREFIX_MODEL, PREFIX_API_KEY, then the
        same names under `fallback_prefix`; `fields` set the rest (max_retries, ...). The key comes
        only from these variables unless `api_key_env` is given, so a general OPENAI_API_KEY is not
        sent to a server it was not meant for."""

        def read(name: str) -> str | None:
            for p in (prefix, fallback_prefix):
                if p and os.environ.get(f"{p}_{name}"):
                    return os.environ[f"{p}_{name}"]
            return None

        base_urls = _as_urls(read("BASE_URL"))
        model = read("MODEL") or (default_model if base_urls else None)
        fields.setdefault("api_key_env", None)
        return cls(base_urls=base_urls, model=model, api_key=read("API_KEY"), timeout_s=timeout_s, **fields)

    def openai_client(self):
        """An `openai.OpenAI` client for the first URL, for APIs the chat client does not cover
        (e.g. /audio/transcriptions). No load balancing or retries beyond openai's own."""
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=self.resolved_api_key() or "EMPTY",
                             timeout=self.timeout_s, max_retries=self.max_retries)
