"""The BM25 retrieval server as a real subprocess on loopback, its protocol, and the search tool over it."""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from reagent_jax.agent import retrieval, tools

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (id, title, text, a query whose best match is this document)
DOCS = [
    ("d00", "Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris, completed in 1889.",
     "wrought-iron lattice tower Paris"),
    ("d01", "Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas.",
     "highest mountain Himalayas"),
    ("d02", "Photosynthesis", "Photosynthesis converts light energy into chemical energy stored in glucose.",
     "light energy glucose plants"),
    ("d03", "Amazon River", "The Amazon River in South America is the largest river by discharge volume.",
     "largest river discharge South America"),
    ("d04", "Telephone", "Alexander Graham Bell was awarded the first patent for the telephone in 1876.",
     "first telephone patent inventor"),
    ("d05", "Penicillin", "Alexander Fleming discovered penicillin, the first antibiotic, in 1928.",
     "antibiotic discovered Fleming"),
    ("d06", "Great Wall", "The Great Wall of China is a series of fortifications built across northern China.",
     "fortifications northern China wall"),
    ("d07", "Jupiter", "Jupiter is the fifth planet from the Sun and the largest in the Solar System.",
     "largest planet solar system"),
    ("d08", "Mona Lisa", "The Mona Lisa is a portrait painting by Leonardo da Vinci, kept at the Louvre.",
     "Leonardo portrait Louvre painting"),
    ("d09", "Python language", "Python is a programming language created by Guido van Rossum in 1991.",
     "programming language Guido van Rossum"),
    ("d10", "Moon landing", "Apollo 11 landed the first humans on the Moon in July 1969.",
     "Apollo first humans Moon"),
    ("d11", "DNA", "DNA is a double helix molecule carrying genetic instructions of living organisms.",
     "double helix genetic molecule"),
    ("d12", "Sahara", "The Sahara is the largest hot desert in the world, covering much of North Africa.",
     "hot desert North Africa"),
    ("d13", "Tokyo", "Tokyo is the capital of Japan and one of the most populous metropolitan areas.",
     "capital of Japan"),
    ("d14", "Beethoven", "Ludwig van Beethoven composed nine symphonies, including the Ninth with the Ode to Joy.",
     "composer nine symphonies Ode to Joy"),
    ("d15", "Titanic", "RMS Titanic sank in the North Atlantic in 1912 after striking an iceberg.",
     "ship sank iceberg Atlantic"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def corpus_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("retrieval") / "corpus.jsonl"
    with open(path, "w") as f:
        for doc_id, title, text, _ in DOCS:
            f.write(json.dumps({"id": doc_id, "title": title, "text": text}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def server_url(corpus_path):
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "launch", "retrieval_server.py"),
                             f"--corpus={corpus_path}", f"--port={port}"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"retrieval server exited: {proc.stdout.read()}")
            try:
                if httpx.get(base + "/health", timeout=1).json()["documents"] == len(DOCS):
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("retrieval server did not start within 60 s")
            time.sleep(0.2)
        yield base + "/retrieve"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_protocol_matches_search_r1(server_url):
    body = httpx.post(server_url, json={"queries": ["capital of Japan", "Apollo Moon"], "topk": 3,
                                        "return_scores": True}, timeout=10).json()
    assert set(body) == {"result"} and len(body["result"]) == 2
    first = body["result"][0][0]
    assert set(first) == {"document", "score"} and set(first["document"]) == {"id", "contents"}
    assert first["document"]["id"] == "d13" and first["document"]["contents"].split("\n")[0] == "Tokyo"
    assert isinstance(first["score"], float) and first["score"] > 0
    scores = [hit["score"] for hit in body["result"][0]]
    assert scores == sorted(scores, reverse=True) and len(scores) <= 3
    plain = httpx.post(server_url, json={"queries": ["capital of Japan"], "topk": 1}, timeout=10).json()
    assert plain["result"][0][0]["id"] == "d13"  # return_scores false: bare documents


def test_bad_requests_get_400_in_the_openai_format(server_url):
    for payload, param in (({"queries": "not a list"}, "queries"), ({"queries": ["x"], "topk": 0}, "topk"),
                           ({"topk": 3}, "queries")):
        r = httpx.post(server_url, json=payload, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        assert r.json()["error"]["param"] == param and "invalid request body" in r.json()["error"]["message"]
    r = httpx.post(server_url, content=b"{not json", timeout=10)
    assert r.status_code == 400 and "error" in r.json()


def test_the_documented_curl_example_works(server_url):
    """The module docstring's curl line, run as written (`-d` sends a form content type)."""
    import shutil
    doc = open(os.path.join(REPO, "launch", "retrieval_server.py")).read()
    line = next(ln.strip() for ln in doc.splitlines() if ln.strip().startswith("curl "))
    body = line.split(" -d ", 1)[1].strip().strip("'")
    if shutil.which("curl"):
        out = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", server_url, "-d", body], capture_output=True,
                             text=True, timeout=30).stdout
        payload, status = out.rsplit("\n", 1)
    else:  # the same request as curl sends it
        r = httpx.post(server_url, content=body, headers={"content-type": "application/x-www-form-urlencoded"})
        payload, status = r.text, str(r.status_code)
    assert status == "200" and json.loads(payload)["result"][0]


def test_sixteen_concurrent_clients_get_the_right_document_first(server_url):
    def ask(i: int) -> tuple[str, str]:
        doc_id, _, _, query = DOCS[i % len(DOCS)]
        body = httpx.post(server_url, json={"queries": [query], "topk": 3, "return_scores": True}, timeout=20).json()
        return doc_id, body["result"][0][0]["document"]["id"]

    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(ask, range(64)))
    assert all(expected == got for expected, got in answers), answers


def test_search_tool_over_http_and_local_backends(server_url, corpus_path):
    http_tool = tools.get("search", backend="http", url=server_url)
    out = http_tool.call({"query": "largest planet solar system", "topk": 2})
    assert out.ok
    lines = out.text.splitlines()
    assert lines[0].startswith("Doc 1 (Title: Jupiter) Jupiter is the fifth planet") and lines[1].startswith("Doc 2 ")
    local = tools.get("search", backend="local", corpus=corpus_path).call({"query": "largest planet solar system",
                                                                           "topk": 2})
    assert local.text == out.text
    nothing = http_tool.call({"query": "zzzqqq"})
    assert nothing.ok and nothing.text == "No results found."
    down = tools.get("search", backend="http", url=f"http://127.0.0.1:{_free_port()}/retrieve").call({"query": "x"})
    assert not down.ok and down.error_kind == "runtime_error" and "unreachable" in down.text


def test_benchmark_helper(server_url):
    stats = retrieval.benchmark_queries(server_url, n=40, concurrency=8)
    assert stats["errors"] == 0 and stats["queries_per_s"] > 0 and stats["latency_p95_ms"] >= stats["latency_p50_ms"]


def test_corpus_formats_and_errors(tmp_path):
    wiki = tmp_path / "wiki.jsonl"
    wiki.write_text(json.dumps({"id": "7", "contents": '"Ada Lovelace"\nAda Lovelace wrote the first program.'}) + "\n")
    doc = retrieval.load_corpus(str(wiki))[0]
    assert doc["title"] == "Ada Lovelace" and doc["text"] == "Ada Lovelace wrote the first program."
    titled = tmp_path / "titled.jsonl"  # {"id", "title", "contents"}: the title is kept, served and indexed
    titled.write_text(json.dumps({"id": "8", "title": "Grace Hopper", "contents": "She built a compiler."}) + "\n")
    doc = retrieval.load_corpus(str(titled))[0]
    assert (doc["title"], doc["text"], doc["contents"]) == ("Grace Hopper", "She built a compiler.",
                                                            "Grace Hopper\nShe built a compiler.")
    assert retrieval.BM25Index.from_jsonl(str(titled)).search(["Hopper"], topk=1)[0][0][0]["id"] == "8"
    served = retrieval.normalise_document({"id": "8", "contents": doc["contents"]}, "hit")  # what a client parses
    assert (served["title"], served["text"]) == ("Grace Hopper", "She built a compiler.")
    index = retrieval.BM25Index.from_jsonl(str(wiki))
    assert index.search(["first program"], topk=5)[0][0][0]["id"] == "7"  # topk above corpus size is clipped
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "text": "ok"}\n{"id": 2, "body": "no text field"}\n')
    with pytest.raises(retrieval.RetrievalError, match=r"bad.jsonl:2: a document needs a 'contents' or a 'text'"):
        retrieval.load_corpus(str(bad))
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{not json\n")
    with pytest.raises(retrieval.RetrievalError, match="broken.jsonl:1: invalid JSON"):
        retrieval.load_corpus(str(broken))
