"""A small OpenAI-compatible chat-completions server for tests, on 127.0.0.1 and a free port.

Why stdlib `http.server`: it starts in milliseconds, needs nothing installed, and speaks real HTTP,
so the client's timeouts, status handling and body parsing are tested over a real socket.

    with FakeOpenAIServer(reply=lambda body: "hello") as server:       # default: echo the last message
        server.push(error(503), error(429), ok("fine"))                # scripted replies, used first
        ... server.base_url ("http://127.0.0.1:PORT/v1"), server.requests, server.max_in_flight

`reply(body)` returns a string (the assistant content) or a `Behaviour`. Behaviours: `ok(content)`,
`error(status)`, `malformed()` (200 with a non-JSON body), `missing_choices()`, `missing_message()`,
`drop()` (close the connection without a reply); any of them with `delay_s` waits first (waits end
at once when the server stops, so no test hangs on a sleeping handler).
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import re
import threading
from typing import Any, Callable

JSON = "application/json"


@dataclasses.dataclass(frozen=True)
class Behaviour:
    kind: str  # ok | status | raw | drop
    content: str = ""
    reasoning_content: str | None = None
    status: int = 200
    body: str | None = None  # raw body for kind "status" / "raw"
    delay_s: float = 0.0
    headers: tuple[tuple[str, str], ...] = ()


def ok(content: str, *, reasoning_content: str | None = None, delay_s: float = 0.0) -> Behaviour:
    return Behaviour("ok", content, reasoning_content, delay_s=delay_s)


def error(status: int, body: str | None = None, *, retry_after: float | None = None, delay_s: float = 0.0
          ) -> Behaviour:
    body = body if body is not None else json.dumps({"error": {"message": f"fake error {status}", "code": status}})
    headers = (("Retry-After", f"{retry_after:g}"),) if retry_after is not None else ()
    return Behaviour("status", status=status, body=body, delay_s=delay_s, headers=headers)


def malformed(delay_s: float = 0.0) -> Behaviour:
    return Behaviour("raw", body='{"id": "x", "choices": [ this is not json', delay_s=delay_s)


def missing_choices(delay_s: float = 0.0) -> Behaviour:
    body = json.dumps({"id": "x", "object": "chat.completion", "model": "fake"})
    return Behaviour("raw", body=body, delay_s=delay_s)


def missing_message(delay_s: float = 0.0) -> Behaviour:
    return Behaviour("raw", body=json.dumps({"id": "x", "choices": [{"index": 0, "finish_reason": "stop"}]}),
                     delay_s=delay_s)


def drop(delay_s: float = 0.0) -> Behaviour:
    return Behaviour("drop", delay_s=delay_s)


def delayed(behaviour: Behaviour | str, delay_s: float) -> Behaviour:
    behaviour = ok(behaviour) if isinstance(behaviour, str) else behaviour
    return dataclasses.replace(behaviour, delay_s=delay_s)


def echo(body: dict[str, Any]) -> str:
    content = body["messages"][-1].get("content")
    return f"echo: {content}"


def grader_reply(body: dict[str, Any]) -> Behaviour | str:
    """A scripted answer grader that reads the project's grading prompt: correct when a reference
    occurs inside the response's last \\boxed{} (so "Barack Obama" matches "Obama", which the EM/F1
    rule does not accept). "[down]" in the prompt -> HTTP 503; "[unparseable]" -> a reply without tags."""
    user = body["messages"][-1]["content"]
    if "[down]" in user:
        return error(503)
    if "[unparseable]" in user:
        return "Looks plausible to me."
    refs = re.search(r"any one is correct\):\n(.*?)\n\nResponse:", user, re.S).group(1)
    refs = [line[2:].strip().lower() for line in refs.splitlines()]
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", user.split("Response:\n", 1)[1])
    answer = boxed[-1] if boxed else None
    correct = answer is not None and any(ref in answer.lower() for ref in refs)
    return (f"<think>compare</think><reasoning>compared {answer!r} with {refs}</reasoning>\n"
            f"<extracted_answer>{answer if answer else 'NONE'}</extracted_answer>\n"
            f"<correct>{'yes' if correct else 'no'}</correct>")


def completion_body(content: str, model: str, reasoning_content: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning_content is not None:
        message["reasoning_content"] = reasoning_content
    return {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


class FakeOpenAIServer:
    """Serves POST .../chat/completions; records every request and the most requests in flight."""

    def __init__(self, reply: Callable[[dict[str, Any]], str | Behaviour] = echo,
                 script: list[Behaviour] = ()) -> None:
        self.reply = reply
        self._script = list(script)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.requests: list[dict[str, Any]] = []  # {"path", "headers" (lower-case names), "body"}
        self.in_flight = 0
        self.max_in_flight = 0
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- control ----------------------------------------------------------------------------------

    def push(self, *behaviours: Behaviour) -> None:
        """Queue behaviours for the next requests (before `reply` is consulted)."""
        with self._lock:
            self._script.extend(behaviours)

    @property
    def base_url(self) -> str:
        assert self._server is not None, "server not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def start(self) -> "FakeOpenAIServer":
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-openai", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes handlers that are still delaying
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "FakeOpenAIServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # --- used by the handler ----------------------------------------------------------------------

    def _next_behaviour(self, body: dict[str, Any]) -> Behaviour:
        with self._lock:
            scripted = self._script.pop(0) if self._script else None
        if scripted is not None:
            return scripted
        out = self.reply(body)
        return ok(out) if isinstance(out, str) else out

    def _enter(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(record)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _leave(self) -> None:
        with self._lock:
            self.in_flight -= 1


class _Handler(http.server.BaseHTTPRequestHandler):
    fake: FakeOpenAIServer

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        pass

    def _send(self, status: int, body: str, content_type: str = JSON, headers: tuple = ()) -> None:
        data = body.encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for key, value in headers:
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout): fine
            pass

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, json.dumps({"error": f"no route {self.path}"}))
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._send(400, json.dumps({"error": "request body is not JSON"}))
            return
        fake = self.fake
        headers = {k.lower(): v for k, v in self.headers.items()}  # HTTP header names are case-insensitive
        fake._enter({"path": self.path, "headers": headers, "body": body})
        left = False
        try:
            behaviour = fake._next_behaviour(body)
            if behaviour.delay_s > 0:
                fake._stopping.wait(behaviour.delay_s)
            fake._leave()  # before replying, so the client never sees a finished request still counted
            left = True
            if behaviour.kind == "drop":
                self.close_connection = True
                return
            if behaviour.kind == "ok":
                out = completion_body(behaviour.content, str(body.get("model")), behaviour.reasoning_content)
                self._send(200, json.dumps(out))
            else:
                self._send(behaviour.status, behaviour.body or "", headers=behaviour.headers)
        finally:
            if not left:
                fake._leave()
