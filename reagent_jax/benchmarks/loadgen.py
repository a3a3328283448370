"""A load generator for the server benchmark: N concurrent clients, each sending requests back to back.

Run in its own process (`run_in_subprocess`), so the clients' Python work does not compete with
the server for one interpreter lock, and speaking HTTP/1.1 over plain asyncio streams (keep-alive,
one connection per client): a general HTTP client library costs more CPU per request than the
server under test (httpx's async pool managed ~100 requests/s at 64 connections here, this ~2,700).
(Its start-up imports the `reagent_jax.serve` package, before any timing starts.)
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
from typing import Any, Optional, Sequence


async def _read_response(reader) -> tuple[int, dict[str, str], Any]:
    """Status, headers and body of one HTTP/1.1 response (Content-Length or chunked; for a
    chunked body an async iterator of its lines)."""
    status = int((await reader.readline()).split()[1])
    headers = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        key, _, value = line.decode("latin-1").partition(":")
        headers[key.strip().lower()] = value.strip()
    if "chunked" not in headers.get("transfer-encoding", ""):
        return status, headers, await reader.readexactly(int(headers.get("content-length", 0)))

    async def chunks():
        pending = b""
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            data = (await reader.readexactly(size + 2))[:-2]  # the chunk and its CRLF
            if size == 0:
                if pending:
                    yield pending
                return
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line
    return status, headers, chunks()


async def _one(conn, path: str, body: dict, stream: bool) -> dict[str, Any]:
    reader, writer = conn
    if stream:
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    data = json.dumps(body).encode()
    t0 = time.perf_counter()
    writer.write(b"POST %s HTTP/1.1\r\nHost: loadgen\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % (path.encode(), len(data)) + data)
    await writer.drain()
    status, headers, payload = await _read_response(reader)
    if not stream or status != 200 or isinstance(payload, bytes):
        t1 = time.perf_counter()
        out = json.loads(payload) if isinstance(payload, bytes) and payload else {}
        tokens = out.get("usage", {}).get("completion_tokens", 0) if status == 200 else 0
        return {"ok": status == 200, "status": status, "latency_s": t1 - t0, "ttft_s": None,
                "completion_tokens": tokens}
    ttft, tokens, failed = None, 0, False
    async for line in payload:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        failed = failed or "error" in chunk  # a stream that fails after it started ends with an error event
        if ttft is None and any(c.get("text") or c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
            ttft = time.perf_counter() - t0
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
    return {"ok": not failed, "status": status, "latency_s": time.perf_counter() - t0, "ttft_s": ttft,
            "completion_tokens": 0 if failed else tokens}


async def _run(base_url: str, bodies: Sequence[dict], clients: int, endpoint: str, stream: bool,
               api_key: Optional[str]) -> dict[str, Any]:
    url = urllib.parse.urlsplit(f"{base_url}/{endpoint}")
    if api_key:
        raise ValueError("the load generator sends no Authorization header; run the benchmark without an API key")
    queue: asyncio.Queue = asyncio.Queue()
    for b in bodies:
        queue.put_nowait(b)
    results: list[dict] = []

    async def worker():
        conn = await asyncio.open_connection(url.hostname, url.port)
        try:
            while not queue.empty():
                results.append(await _one(conn, url.path, queue.get_nowait(), stream))
        finally:
            conn[1].close()
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return {"wall_s": time.perf_counter() - t0, "results": results}


def run_load(base_url: str, bodies: Sequence[dict], clients: int, endpoint: str = "completions",
             stream: bool = False, api_key: Optional[str] = None) -> dict[str, Any]:
    """Sends every body once, `clients` at a time; returns wall time and per-request results."""
    return asyncio.run(_run(base_url, list(bodies), clients, endpoint, stream, api_key))


def run_in_subprocess(base_url: str, bodies: Sequence[dict], clients: int, endpoint: str = "completions",
                      stream: bool = False, api_key: Optional[str] = None, timeout_s: float = 1800.0) -> dict:
    """`run_load` in a fresh Python process (`python -m reagent_jax.benchmarks.loadgen`, JSON in and out)."""
    job = {"base_url": base_url, "bodies": list(bodies), "clients": clients, "endpoint": endpoint, "stream": stream,
           "api_key": api_key}
    with tempfile.TemporaryDirectory() as d:
        job_path, out_path = os.path.join(d, "job.json"), os.path.join(d, "out.json")
        with open(job_path, "w") as f:
            json.dump(job, f)
        proc = subprocess.run([sys.executable, "-m", "reagent_jax.benchmarks.loadgen", job_path, out_path],
                              capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0 or not os.path.exists(out_path):
            raise RuntimeError(f"load generator failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        with open(out_path) as f:
            return json.load(f)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        _job = json.load(f)
    _out = run_load(_job["base_url"], _job["bodies"], _job["clients"], _job["endpoint"], _job["stream"], _job["api_key"])
    with open(sys.argv[2], "w") as f:
        json.dump(_out, f)
