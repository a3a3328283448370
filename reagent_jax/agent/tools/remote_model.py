"""Settings of an OpenAI-compatible model server for the tools that can call one (browse's
summariser, image2text's vision model, audio2text's transcription model)."""

from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass(frozen=True)
class RemoteModel:
    """base_url + model (+ api_key) of an OpenAI-compatible server; unconfigured when either is missing."""

    base_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    timeout_s: float = 60.0

    @property
    def configured(self) -> bool:
        return bool(self.base_url and self.model)

    @classmethod
    def from_env(cls, prefix: str, fallback_prefix: str | None = None, default_model: str | None = None,
                 timeout_s: float = 60.0) -> "RemoteModel":
        """Read PREFIX_BASE_URL, PREFIX_MODEL, PREFIX_API_KEY (then FALLBACK_PREFIX_*)."""

        def read(field: str) -> str | None:
            for p in (prefix, fallback_prefix):
                if p and os.environ.get(f"{p}_{field}"):
                    return os.environ[f"{p}_{field}"]
            return None

        base_url = read("BASE_URL")
        return cls(base_url=base_url, model=read("MODEL") or (default_model if base_url else None),
                   api_key=read("API_KEY"), timeout_s=timeout_s)

    def client(self):
        """An `openai.OpenAI` client (imported lazily: the offline paths never need it)."""
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=self.api_key or "EMPTY", timeout=self.timeout_s,
                             max_retries=1)

    def describe(self) -> str:
        return f"{self.model} at {self.base_url}"
