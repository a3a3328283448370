"""The `file_reader` tool: text out of local documents (txt, md, code, json, jsonl, csv, xml, xlsx,
pdf, docx, pptx) and zip archives (`archive.zip` lists members; `archive.zip/dir/member.csv` reads one).

Converters take bytes, so archive members and downloaded pages (browse) go through the same code.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import zipfile
from typing import Callable

from reagent_jax.agent.tools.base import (
    NOT_FOUND,
    RUNTIME_ERROR,
    UNSUPPORTED,
    Tool,
    ToolError,
    resolve_config,
)
from reagent_jax.agent.tools.local_files import resolve_local_path, roots_from_env

_TEXT_EXTS = {".txt", ".md", ".markdown", ".py", ".log", ".rst", ".tex", ".yaml", ".yml", ".toml", ".ini",
              ".cfg", ".sh", ".js", ".ts", ".c", ".h", ".cpp", ".java", ".go", ".rs", ".sql", ".html", ".htm",
              ".xml", ".svg", ".r", ".m", ".css", ".srt", ".vtt"}
_OTHER_TOOLS = {".png": "image2text", ".jpg": "image2text", ".jpeg": "image2text", ".gif": "image2text",
                ".bmp": "image2text", ".webp": "image2text", ".tif": "image2text", ".tiff": "image2text",
                ".mp3": "audio2text", ".wav": "audio2text", ".m4a": "audio2text", ".flac": "audio2text",
                ".ogg": "audio2text"}


# byte-order marks, longest first (the UTF-32-LE mark starts with the UTF-16-LE one)
_BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe\x00\x00", "utf-32-le"), (b"\x00\x00\xfe\xff", "utf-32-be"),
         (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))


def _decode(data: bytes, name: str = "the file") -> str:
    """Text of `data`: by its byte-order mark, else UTF-8, else Latin-1 (never fails on text). NUL
    bytes without a UTF-16/32 mark mean a binary file, refused rather than passed on as garbage."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:
                return data[len(bom):].decode(encoding)
            except UnicodeDecodeError:
                break
    if b"\x00" in data[:8192]:
        raise ToolError(UNSUPPORTED, f"{name} looks like a binary file (it contains NUL bytes), not text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _text(data: bytes, name: str) -> str:
    return _decode(data, name)


def _json(data: bytes, name: str) -> str:
    try:
        return json.dumps(json.loads(_decode(data, name)), indent=2, ensure_ascii=False)
    except json.JSONDecodeError as exc:
        raise ToolError(RUNTIME_ERROR, f"{name} is not valid JSON: {exc}") from None


def _jsonl(data: bytes, name: str) -> str:
    lines = []
    for line_no, line in enumerate(_decode(data, name).splitlines(), 1):
        if not line.strip():
            continue
        try:
            lines.append(json.dumps(json.loads(line), ensure_ascii=False))
        except json.JSONDecodeError as exc:
            lines.append(f"(line {line_no} is not valid JSON: {exc}) {line[:200]}")
    return f"{len(lines)} records\n" + "\n".join(lines)


def _rows_to_text(rows) -> str:
    return "\n".join(" | ".join("" if cell is None else str(cell) for cell in row) for row in rows)


def _csv(data: bytes, name: str) -> str:
    text = _decode(data, name)
    try:
        dialect = csv.Sniffer().sniff(text[:4096], delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel_tab if name.endswith(".tsv") else csv.excel
    rows = list(csv.reader(io.StringIO(text), dialect))
    return f"{len(rows)} rows\n" + _rows_to_text(rows)


def _xlsx(data: bytes, name: str) -> str:
    import openpyxl

    book = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    parts = []
    for sheet in book.worksheets:
        rows = [row for row in sheet.iter_rows(values_only=True) if any(c is not None for c in row)]
        parts.append(f"## Sheet: {sheet.title} ({len(rows)} rows)\n{_rows_to_text(rows)}")
    book.close()
    return "\n\n".join(parts)


def _pdf(data: bytes, name: str) -> str:
    import pypdf

    reader = pypdf.PdfReader(io.BytesIO(data))
    if reader.is_encrypted:
        try:
            reader.decrypt("")
        except Exception:  # noqa: BLE001
            raise ToolError(UNSUPPORTED, f"{name} is an encrypted PDF") from None
    pages = [f"## Page {i}\n{(page.extract_text() or '').strip()}" for i, page in enumerate(reader.pages, 1)]
    return f"{len(pages)} pages\n\n" + "\n\n".join(pages)


def _docx(data: bytes, name: str) -> str:
    import docx

    document = docx.Document(io.BytesIO(data))
    parts = [p.text for p in document.paragraphs if p.text.strip()]
    for i, table in enumerate(document.tables, 1):
        rows = [[cell.text for cell in row.cells] for row in table.rows]
        parts.append(f"## Table {i}\n{_rows_to_text(rows)}")
    return "\n".join(parts)


def _pptx(data: bytes, name: str) -> str:
    import pptx

    presentation = pptx.Presentation(io.BytesIO(data))
    slides = []
    for i, slide in enumerate(presentation.slides, 1):
        texts = []
        for shape in slide.shapes:
            if shape.has_text_frame and shape.text_frame.text.strip():
                texts.append(shape.text_frame.text.strip())
            if getattr(shape, "has_table", False) and shape.has_table:
                texts.append(_rows_to_text([[c.text for c in row.cells] for row in shape.table.rows]))
        if slide.has_notes_slide and slide.notes_slide.notes_text_frame.text.strip():
            texts.append("Notes: " + slide.notes_slide.notes_text_frame.text.strip())
        slides.append(f"## Slide {i}\n" + "\n".join(texts))
    return "\n\n".join(slides)


def _zip_listing(data: bytes, name: str) -> str:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        members = [m for m in archive.infolist() if not m.is_dir()]
    lines = [f"{m.filename} ({m.file_size} bytes)" for m in members]
    return (f"{name} is a zip archive with {len(members)} files; read one as {name}/<member>:\n" + "\n".join(lines))


CONVERTERS: dict[str, Callable[[bytes, str], str]] = {
    **{ext: _text for ext in _TEXT_EXTS}, ".json": _json, ".jsonl": _jsonl, ".ndjson": _jsonl, ".csv": _csv,
    ".tsv": _csv, ".xlsx": _xlsx, ".xlsm": _xlsx, ".pdf": _pdf, ".docx": _docx, ".pptx": _pptx, ".zip": _zip_listing,
}


def convert_bytes(data: bytes, ext: str, name: str) -> str:
    """Text of a document given its bytes and extension; ToolError(unsupported) for unknown binaries."""
    ext = ext.lower()
    converter = CONVERTERS.get(ext)
    if converter is None:
        if ext in _OTHER_TOOLS:
            raise ToolError(UNSUPPORTED, f"{name} is a {ext} file: use the {_OTHER_TOOLS[ext]} tool")
        if b"\x00" in data[:8192]:
            raise ToolError(UNSUPPORTED, f"{name}: unsupported binary file type {ext or '(no extension)'}; "
                                         f"supported: {', '.join(sorted(CONVERTERS))}")
        converter = _text  # unknown extension but text content
    try:
        return converter(data, name)
    except ToolError:
        raise
    except Exception as exc:  # noqa: BLE001 - corrupt documents surface as readable errors
        raise ToolError(RUNTIME_ERROR, f"could not read {name} as {ext}: {type(exc).__name__}: {exc}") from None


@dataclasses.dataclass(frozen=True)
class FileReaderConfig:
    root: str | None = None            # readable folders, os.pathsep-joined (REAGENT_FILES_ROOT); see local_files
    max_file_bytes: int = 50_000_000

    @classmethod
    def from_env(cls, **overrides) -> "FileReaderConfig":
        values = dict(root=roots_from_env())
        values.update(overrides)
        return cls(**values)


class FileReaderTool(Tool):
    name = "file_reader"
    description = ("Read a local file and return its text: txt, md, code, json, jsonl, csv, xml, xlsx, pdf, docx, "
                   "pptx. For a zip archive give its path to list members, or archive.zip/member to read one.")
    parameters = {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "Path of the file.", "maxLength": 4096,
                                "minLength": 1}},
        "required": ["path"],
        "additionalProperties": False,
    }

    def __init__(self, config: FileReaderConfig | None = None, timeout_s: float = 60.0, max_output_chars: int = 12000,
                 **overrides):
        self.config = resolve_config(FileReaderConfig, config, overrides)
        super().__init__(timeout_s=timeout_s, max_output_chars=max_output_chars)


    def _read_file(self, path: str) -> bytes:
        size = os.path.getsize(path)
        if size > self.config.max_file_bytes:
            raise ToolError(UNSUPPORTED, f"{path} is too large ({size} bytes; at most {self.config.max_file_bytes})")
        with open(path, "rb") as f:
            return f.read()

    def run(self, path: str) -> str:
        path = resolve_local_path(path, self.config.root)
        if os.path.isdir(path):
            entries = sorted(os.listdir(path))[:200]
            raise ToolError(UNSUPPORTED, f"{path} is a directory; files in it: {', '.join(entries) or '(none)'}")
        if os.path.isfile(path):
            return convert_bytes(self._read_file(path), os.path.splitext(path)[1], path)
        archive, member = self._split_archive_path(path)
        if archive is None:
            raise ToolError(NOT_FOUND, f"no such file: {path}")
        return self._read_member(archive, member)

    @staticmethod
    def _split_archive_path(path: str) -> tuple[str | None, str]:
        """('dir/a.zip', 'x/y.csv') for 'dir/a.zip/x/y.csv' when dir/a.zip is a zip file."""
        parts = path.split("/")
        for i in range(len(parts) - 1, 0, -1):
            head = "/".join(parts[:i])
            if os.path.isfile(head):
                return (head, "/".join(parts[i:])) if zipfile.is_zipfile(head) else (None, "")
        return None, ""

    def _read_member(self, archive: str, member: str) -> str:
        with zipfile.ZipFile(archive) as zf:
            names = [n for n in zf.namelist() if not n.endswith("/")]
            if member not in names:
                inside = [n for n in names if n.startswith(member.rstrip("/") + "/")]
                if inside:
                    return f"{archive}/{member} is a folder of the archive with: " + ", ".join(inside[:200])
                raise ToolError(NOT_FOUND, f"{archive} has no member {member!r}; members: {', '.join(names[:50])}")
            info = zf.getinfo(member)
            if info.file_size > self.config.max_file_bytes:
                raise ToolError(UNSUPPORTED, f"member {member} is too large ({info.file_size} bytes)")
            data = zf.read(member)
        return convert_bytes(data, os.path.splitext(member)[1], f"{archive}/{member}")
