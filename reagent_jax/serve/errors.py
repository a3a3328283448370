"""Errors in OpenAI's format, so every client library shows the server's message.

Body: {"error": {"message": str, "type": str, "param": str | None, "code": str | None}}.
Status codes: 400 bad request (malformed JSON, bad parameters, prompt too long), 401 missing or
wrong API key, 404 unknown model or route, 405 wrong method, 413 body too large, 429 too many
requests in flight, 499 the client left (never delivered), 500 a failure inside one request (the server keeps serving), 504 timeout.
"""
from __future__ import annotations

from typing import Any, Optional

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
          405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
          500: "server_error", 503: "server_error", 504: "server_error"}


class APIError(Exception):
    """An error reply: HTTP status plus the OpenAI error fields."""

    def __init__(self, status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None,
                 type: Optional[str] = None, headers: Optional[dict[str, str]] = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: Optional[str] = None, code: Optional[str] = None) -> APIError:
    return APIError(400, message, param=param, code=code)
