"""The remote backends (browse summariser, image2text vision, audio2text transcription) against a
real OpenAI-compatible HTTP server on loopback that checks what the tools send."""

import base64
import io
import math
import shutil
import socket
import struct
import threading
import time
import wave

import pytest
from fastapi import FastAPI, Request  # module level: FastAPI resolves the handlers' annotations here

from reagent_jax.agent import tools
from reagent_jax.agent.tools.remote_model import RemoteModel


def _completion(content: str) -> dict:
    return {"id": "c1", "object": "chat.completion", "created": 0, "model": "stub",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def _make_app(log: list):
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        log.append(("chat", request.headers.get("authorization"), body))
        content = body["messages"][-1]["content"]
        if isinstance(content, list):  # vision request: decode the image it carries
            from PIL import Image
            url = next(p["image_url"]["url"] for p in content if p["type"] == "image_url")
            assert url.startswith("data:image/png;base64,")
            image = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
            question = next(p["text"] for p in content if p["type"] == "text")
            return _completion(f"saw a {image.width}x{image.height} image; asked: {question}")
        query = content.split("\n", 1)[0]
        return _completion(f"summary for [{query}] from {len(content)} chars")

    @app.post("/v1/audio/transcriptions")
    async def transcribe(request: Request):
        raw = await request.body()
        log.append(("asr", request.headers.get("authorization"), len(raw)))
        start = raw.index(b"RIFF")
        with wave.open(io.BytesIO(raw[start:])) as w:
            seconds = w.getnframes() / w.getframerate()
            rate = w.getframerate()
        return {"text": f"[{seconds:.0f}s@{rate}]"}

    return app


@pytest.fixture(scope="module")
def stub():
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log: list = []
    server = uvicorn.Server(uvicorn.Config(_make_app(log), host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "stub server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1", log
    server.should_exit = True
    thread.join(timeout=10)


def test_browse_summariser(stub, tmp_path):
    base_url, log = stub
    page = tmp_path / "p.html"
    page.write_text("<html><head><title>T</title></head><body><article><p>" + "Danube facts. " * 50 +
                    "</p></article></body></html>")
    endpoint = RemoteModel(base_url=base_url, model="summariser-1", api_key="sk-test")
    out = tools.get("browse", summariser=endpoint).call({"url": str(page), "query": "How long is the Danube?"})
    assert out.ok, out.text
    assert "summary for [Query: How long is the Danube?]" in out.text and "(summariser-1)" in out.text
    kind, auth, body = log[-1]
    assert kind == "chat" and auth == "Bearer sk-test" and body["model"] == "summariser-1"
    assert "Danube facts." in body["messages"][-1]["content"]
    dead = RemoteModel(base_url="http://127.0.0.1:9/v1", model="m", timeout_s=2)
    fallback = tools.get("browse", summariser=dead).call({"url": str(page), "query": "Danube"})
    assert fallback.ok and "failed" in fallback.text and "Danube facts." in fallback.text


def test_image2text_vision_endpoint(stub, tmp_path, monkeypatch):
    base_url, log = stub
    from PIL import Image
    path = tmp_path / "big.png"
    Image.new("RGB", (4000, 1000), "blue").save(path)
    monkeypatch.setenv("REAGENT_VISION_BASE_URL", base_url)
    monkeypatch.setenv("REAGENT_VISION_MODEL", "vl-stub")
    out = tools.get("image2text", max_side=1024).call({"path": str(path), "question": "What colour?"})
    assert out.ok and out.text == "saw a 1024x256 image; asked: What colour?"
    assert log[-1][2]["model"] == "vl-stub"


def test_audio2text_transcribes_30s_segments(stub, tmp_path, monkeypatch):
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg binary missing: apt-get install ffmpeg (listed in .ci/apt-packages.txt)")
    base_url, log = stub
    wav = tmp_path / "talk.wav"
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"".join(struct.pack("<hh", v, v) for v in
                               (int(5000 * math.sin(t / 9)) for t in range(8000 * 70))))
    monkeypatch.setenv("REAGENT_ASR_BASE_URL", base_url)
    monkeypatch.setenv("REAGENT_ASR_API_KEY", "sk-asr")
    monkeypatch.delenv("REAGENT_ASR_MODEL", raising=False)
    out = tools.get("audio2text").call({"path": str(wav)})
    assert out.ok, out.text
    assert out.text.endswith("[30s@16000] [30s@16000] [10s@16000]") and "3 segment(s)" in out.text
    assert [entry[1] for entry in log if entry[0] == "asr"][-3:] == ["Bearer sk-asr"] * 3
