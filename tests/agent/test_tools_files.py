"""file_reader, browse, image2text and audio2text on real files written by the tests (offline backends)."""

from __future__ import annotations

import json
import math
import shutil
import struct
import wave
import zipfile

import pytest

from reagent_jax.agent import tools
from reagent_jax.agent.tools.audio2text import segment_audio


def _pdf_bytes(lines: list[str]) -> bytes:
    """A minimal valid PDF (Helvetica text, correct xref offsets) with one line of text per page."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", None, "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for line in lines:
        stream = f"BT /F1 18 Tf 72 720 Td ({line}) Tj ET".encode()
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream.decode()}\nendstream")
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {len(objects)} 0 R "
                       f"/Resources << /Font << /F1 3 0 R >> >> >>")
        kids.append(f"{len(objects)} 0 R")
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(kids)} >>"
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{o:010d} 00000 n \n" for o in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def _write_wav(path, seconds: float, rate: int = 8000) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        frames = b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * t / rate)))
                          for t in range(int(seconds * rate)))
        w.writeframes(frames)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("files")
    (d / "notes.txt").write_text("plain text line\nsecond line")
    (d / "readme.md").write_text("# Title\n\nSome *markdown*.")
    (d / "script.py").write_text("def f():\n    return 42\n")
    (d / "data.json").write_text('{"answer": 42, "items": [1, 2]}')
    (d / "rows.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    (d / "table.csv").write_text("name,age\nalice,30\nbob,41\n")
    (d / "doc.xml").write_text("<root><item id='1'>xml value</item></root>")
    import openpyxl
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Budget"
    sheet.append(["item", "cost"])
    sheet.append(["rent", 1200])
    sheet.append(["food", "=SUM(1,2)"])
    book.create_sheet("Empty")
    book.save(d / "sheet.xlsx")
    (d / "paper.pdf").write_bytes(_pdf_bytes(["First page says hello", "Second page has 2025"]))
    import docx
    document = docx.Document()
    document.add_paragraph("A docx paragraph about llamas.")
    table = document.add_table(rows=2, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "k", "v"
    table.cell(1, 0).text, table.cell(1, 1).text = "speed", "fast"
    document.save(d / "report.docx")
    import pptx
    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[1])
    slide.shapes.title.text = "Quarterly results"
    slide.placeholders[1].text = "Revenue grew 12%"
    deck.save(d / "deck.pptx")
    with zipfile.ZipFile(d / "bundle.zip", "w") as zf:
        zf.writestr("inner/table.csv", "city,pop\nOslo,700000\n")
        zf.writestr("readme.txt", "zip member text")
        zf.write(d / "report.docx", "docs/report.docx")
    (d / "blob.bin").write_bytes(b"\x00\x01\x02binary")
    return d


@pytest.fixture(scope="module")
def reader():
    return tools.get("file_reader", root=None)


@pytest.mark.parametrize("name,needles", [
    ("notes.txt", ["plain text line", "second line"]),
    ("readme.md", ["# Title", "*markdown*"]),
    ("script.py", ["return 42"]),
    ("data.json", ['"answer": 42']),
    ("rows.jsonl", ["2 records", '{"a": 2}']),
    ("table.csv", ["3 rows", "alice | 30", "bob | 41"]),
    ("doc.xml", ["<item id='1'>xml value</item>"]),
    ("sheet.xlsx", ["## Sheet: Budget", "item | cost", "rent | 1200", "## Sheet: Empty (0 rows)"]),
    ("paper.pdf", ["2 pages", "## Page 1\nFirst page says hello", "## Page 2\nSecond page has 2025"]),
    ("report.docx", ["A docx paragraph about llamas.", "## Table 1", "speed | fast"]),
    ("deck.pptx", ["## Slide 1", "Quarterly results", "Revenue grew 12%"]),
    ("bundle.zip", ["3 files", "inner/table.csv", "docs/report.docx"]),
    ("bundle.zip/inner/table.csv", ["Oslo | 700000"]),
    ("bundle.zip/docs/report.docx", ["llamas"]),
    ("bundle.zip/inner", ["folder of the archive", "inner/table.csv"]),
])
def test_file_reader_formats(files, reader, name, needles):
    out = reader.call({"path": str(files / name)})
    assert out.ok, out.text
    for needle in needles:
        assert needle in out.text


def test_file_reader_errors(files, reader):
    missing = reader.call({"path": str(files / "nope.txt")})
    assert missing.error_kind == "not_found" and "no such file" in missing.text
    member = reader.call({"path": str(files / "bundle.zip/absent.csv")})
    assert member.error_kind == "not_found" and "readme.txt" in member.text
    binary = reader.call({"path": str(files / "blob.bin")})
    assert binary.error_kind == "unsupported" and "supported:" in binary.text
    (files / "photo.png").write_bytes(b"\x89PNG\r\n")
    image = reader.call({"path": str(files / "photo.png")})
    assert image.error_kind == "unsupported" and "image2text" in image.text
    folder = reader.call({"path": str(files)})
    assert folder.error_kind == "unsupported" and "notes.txt" in folder.text
    (files / "corrupt.pdf").write_bytes(b"%PDF-1.4 garbage")
    corrupt = reader.call({"path": str(files / "corrupt.pdf")})
    assert corrupt.error_kind == "runtime_error" and "could not read" in corrupt.text
    rooted = tools.get("file_reader", root=str(files)).call({"path": "notes.txt"})
    assert rooted.ok and "plain text line" in rooted.text


def test_file_reader_truncates_long_files(files):
    (files / "long.txt").write_text("".join(f"line {i}\n" for i in range(20000)))
    out = tools.get("file_reader", max_output_chars=3000).call({"path": str(files / "long.txt")})
    assert out.ok and len(out.text) <= 3000 and out.text.startswith("line 0") and "line 19999" in out.text
    assert "truncated" in out.text


ARTICLE = """<html><head><title>Rivers of Europe</title></head><body>
<nav>Home | About | Contact</nav>
<article><h1>Rivers of Europe</h1>
<p>The Danube is Europe's second-longest river, flowing through ten countries from Germany to the Black Sea.</p>
<p>The Rhine rises in the Swiss Alps and flows to the North Sea through Germany and the Netherlands.</p>
<p>The Volga is the longest river in Europe, with a length of 3,530 kilometres, draining into the Caspian Sea.</p>
<p>Many European capitals, such as Vienna, Budapest and Belgrade, lie on the banks of the Danube.</p>
</article><footer>Copyright notice</footer></body></html>"""


def test_browse_page_store_and_local_files(tmp_path, monkeypatch):
    for var in ("REAGENT_BROWSE_BASE_URL", "REAGENT_BROWSE_MODEL", "REAGENT_LLM_BASE_URL", "REAGENT_LLM_MODEL"):
        monkeypatch.delenv(var, raising=False)
    store = tmp_path / "pages.jsonl"
    store.write_text(json.dumps({"url": "https://example.org/rivers", "html": ARTICLE}) + "\n")
    browse = tools.get("browse", page_store=str(store), allow_network=False, chunk_chars=120, top_chunks=1)
    out = browse.call({"url": "https://example.org/rivers/#volga", "query": "longest river in Europe length"})
    assert out.ok, out.text
    assert "Title: Rivers of Europe" in out.text and "3,530 kilometres" in out.text
    assert "Rhine" not in out.text  # only the best-matching chunk
    page = tmp_path / "rivers.html"
    page.write_text(ARTICLE)
    by_file = browse.call({"url": page.as_uri(), "query": "Swiss Alps"})
    assert by_file.ok and "Rhine rises in the Swiss Alps" in by_file.text
    by_path = browse.call({"url": str(page)})
    assert by_path.ok and "The start of the page" in by_path.text and "Danube" in by_path.text
    offline = browse.call({"url": "https://example.org/other", "query": "x"})
    assert offline.error_kind == "not_found" and "network access is disabled" in offline.text
    assert browse.call({"url": "gopher://x", "query": "x"}).error_kind == "not_found"
    pdf = tmp_path / "p.pdf"
    pdf.write_bytes(_pdf_bytes(["Danube facts in a PDF"]))
    assert "Danube facts" in browse.call({"url": str(pdf), "query": "Danube"}).text


def test_image2text_ocr_and_facts(tmp_path, monkeypatch):
    if shutil.which("tesseract") is None:
        pytest.skip("tesseract binary missing: apt-get install tesseract-ocr (listed in .ci/apt-packages.txt)")
    monkeypatch.delenv("REAGENT_VISION_BASE_URL", raising=False)
    from PIL import Image, ImageDraw, ImageFont
    image = Image.new("RGB", (640, 160), "white")
    ImageDraw.Draw(image).text((20, 40), "REAGENT 2024", font=ImageFont.load_default(size=56), fill="black")
    path = tmp_path / "sign.png"
    image.save(path)
    out = tools.get("image2text").call({"path": str(path), "question": "What does the sign say?"})
    assert out.ok, out.text
    assert "REAGENT 2024" in out.text and "640x160 pixels" in out.text and "white #ffffff" in out.text
    assert "No vision model is configured" in out.text
    bad = tmp_path / "fake.png"
    bad.write_text("not an image")
    assert tools.get("image2text").call({"path": str(bad)}).error_kind == "unsupported"
    assert tools.get("image2text").call({"path": str(tmp_path / "none.png")}).error_kind == "not_found"


def test_audio2text_not_configured_and_segmentation(tmp_path, monkeypatch):
    monkeypatch.delenv("REAGENT_ASR_BASE_URL", raising=False)
    wav = tmp_path / "talk.wav"
    _write_wav(wav, 65.0)
    out = tools.get("audio2text").call({"path": str(wav)})
    assert not out.ok and out.error_kind == "not_configured" and "REAGENT_ASR_BASE_URL" in out.text
    assert tools.get("audio2text").call({"path": str(tmp_path / "none.wav")}).error_kind == "not_found"
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg binary missing: apt-get install ffmpeg (listed in .ci/apt-packages.txt)")
    segments_dir = tmp_path / "segments"
    segments_dir.mkdir()
    segments = segment_audio(str(wav), str(segments_dir))
    durations = []
    for segment in segments:
        with wave.open(segment) as w:
            assert w.getframerate() == 16000 and w.getnchannels() == 1 and w.getsampwidth() == 2
            durations.append(w.getnframes() / w.getframerate())
    assert len(durations) == 3 and durations[:2] == [30.0, 30.0]
    assert sum(durations) == pytest.approx(65, abs=0.1)
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF0000WAVEjunk")
    with pytest.raises(tools.ToolError, match="ffmpeg could not decode"):
        segment_audio(str(broken), str(segments_dir))
