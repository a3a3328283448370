"""Running the app with uvicorn: in the foreground (launch/serve.py) or on a background thread
(tests, benchmarks, notebooks, or an evaluation that serves its own judge).

    with ServerThread(app) as server:          # 127.0.0.1, a free port
        client = openai.OpenAI(base_url=server.base_url, api_key="x")

The socket is bound before uvicorn starts, so the port is known (and taken) when `start` returns.
Binds 127.0.0.1 unless told otherwise: exposing a model server is the caller's explicit choice.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Optional

import uvicorn

DEFAULT_HOST = "127.0.0.1"


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot bind {host}:{port}: {e}") from None
    sock.set_inheritable(True)
    return sock


def _config(app, log_level: str) -> uvicorn.Config:
    # timeout_graceful_shutdown: open streams are cut after this long when stopping.
    return uvicorn.Config(app, log_level=log_level, access_log=False, timeout_keep_alive=30,
                          timeout_graceful_shutdown=5, backlog=4096)


def serve_forever(app, host: str = DEFAULT_HOST, port: int = 8000, log_level: str = "info") -> None:
    """Serves until interrupted (Ctrl-C / SIGTERM)."""
    sock = _bind(host, port)
    uvicorn.Server(_config(app, log_level)).run(sockets=[sock])


class ServerThread:
    """uvicorn on a daemon thread; `stop()` (or leaving the `with` block) shuts it down."""

    def __init__(self, app, host: str = DEFAULT_HOST, port: int = 0, log_level: str = "warning"):
        self.app, self.host, self._port, self.log_level = app, host, port, log_level
        self._server: Optional[uvicorn.Server] = None
        self._thread: Optional[threading.Thread] = None
        self._sock: Optional[socket.socket] = None

    @property
    def port(self) -> int:
        if self._sock is None:
            raise RuntimeError("ServerThread: not started")
        return self._sock.getsockname()[1]

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, e.g. http://127.0.0.1:PORT/v1."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def start(self, timeout_s: float = 30.0) -> "ServerThread":
        self._sock = _bind(self.host, self._port)
        self._server = uvicorn.Server(_config(self.app, self.log_level))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="openai-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("ServerThread: uvicorn exited during start-up (see the log above)")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"ServerThread: not serving after {timeout_s} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._sock is not None:
            self._sock.close()
        self._thread = None

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
