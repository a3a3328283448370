"""The `browse` tool: URL -> page -> main text (trafilatura) -> an answer to the query.

Pages come from, in order: a local page store (REAGENT_BROWSE_PAGES: a JSONL file of {"url", "html"}
lines, or a directory of such files), local paths and file:// URLs, then http(s) when a network is
allowed (REAGENT_BROWSE_NETWORK=0 forbids it). The answer is written by an OpenAI-compatible
summariser when one is configured (REAGENT_BROWSE_{BASE_URL,MODEL,API_KEY}, falling back to
REAGENT_LLM_*), otherwise it is extractive: the page chunks that best match the query under BM25.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import json
import os
import re
import urllib.parse

import httpx

from reagent_jax.agent import retrieval
from reagent_jax.agent.tools import file_reader
from reagent_jax.agent.tools.base import NOT_FOUND, RUNTIME_ERROR, Tool, ToolError, resolve_config
from reagent_jax.agent.tools.local_files import resolve_local_path, roots_from_env
from reagent_jax.agent.tools.remote_model import RemoteModel

_HTML_EXTS = {".html", ".htm", ".xhtml"}
_SUMMARY_PROMPT = ("You read one web page for a research agent. Answer the query using only the page. Quote "
                   "exact names, numbers and dates. If the page does not answer it, say so and summarise what "
                   "the page does contain that is relevant.")


@dataclasses.dataclass(frozen=True)
class BrowseConfig:
    page_store: str | None = None
    allow_network: bool = True
    summariser: RemoteModel = RemoteModel()
    fetch_timeout_s: float = 15.0
    max_page_bytes: int = 5_000_000
    chunk_chars: int = 600
    top_chunks: int = 4
    start_chars: int = 3000          # shown from the top when there is no query or nothing matches
    max_summary_input_chars: int = 24_000
    root: str | None = None          # local files it may open (REAGENT_FILES_ROOT); see local_files

    @classmethod
    def from_env(cls, **overrides) -> "BrowseConfig":
        values = dict(page_store=os.environ.get("REAGENT_BROWSE_PAGES") or None, root=roots_from_env(),
                      allow_network=os.environ.get("REAGENT_BROWSE_NETWORK", "1") not in ("0", "false", "no"),
                      summariser=RemoteModel.from_env("REAGENT_BROWSE", fallback_prefix="REAGENT_LLM"))
        values.update(overrides)
        return cls(**values)


def _normalise_url(url: str) -> str:
    return url.split("#", 1)[0].rstrip("/")


@functools.lru_cache(maxsize=4)
def _load_page_store(path: str, mtime: float) -> dict[str, str]:
    del mtime  # cache key only
    files = sorted(glob.glob(os.path.join(path, "*.jsonl"))) if os.path.isdir(path) else [path]
    pages: dict[str, str] = {}
    for name in files:
        with open(name, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    pages[_normalise_url(row["url"])] = row.get("html") or row.get("text") or row.get("content") or ""
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    raise ToolError(RUNTIME_ERROR, f"page store {name}:{line_no} is malformed ({exc!r})") from None
    return pages


def html_to_text(html: str) -> tuple[str, str]:
    """(title, main text) of an HTML page; trafilatura first, all visible text as the fallback."""
    match = re.search(r"<title[^>]*>(.*?)</title>", html, re.IGNORECASE | re.DOTALL)
    title = " ".join(match.group(1).split()) if match else ""
    try:
        import trafilatura  # needs lxml_html_clean with lxml >= 5.2
    except ImportError:
        text = ""
    else:
        text = trafilatura.extract(html, include_tables=True, include_comments=False, favor_recall=True) or ""
    if len(text.strip()) < 40:  # very small pages: trafilatura may keep nothing
        import lxml.html

        try:
            tree = lxml.html.fromstring(html)
            for bad in tree.xpath("//script|//style|//noscript"):
                bad.drop_tree()
            text = "\n".join(line.strip() for line in tree.text_content().splitlines() if line.strip())
        except Exception:  # noqa: BLE001 - unparsable markup: keep what trafilatura gave
            pass
    return title, text


def chunk_text(text: str, chunk_chars: int) -> list[str]:
    """Paragraph-aligned chunks of at most ~chunk_chars characters."""
    chunks: list[str] = []
    current = ""
    for para in (p.strip() for p in re.split(r"\n\s*\n|\n", text)):
        if not para:
            continue
        while len(para) > chunk_chars:  # very long paragraph: cut at a sentence end when possible
            cut = para.rfind(". ", 0, chunk_chars)
            cut = cut + 1 if cut > chunk_chars // 3 else chunk_chars
            chunks.append(para[:cut].strip())
            para = para[cut:].strip()
        if current and len(current) + len(para) + 1 > chunk_chars:
            chunks.append(current)
            current = ""
        current = f"{current}\n{para}" if current else para
    if current:
        chunks.append(current)
    return chunks


class BrowseTool(Tool):
    name = "browse"
    description = ("Open a web page (or a local document) and answer a query about it from the page's main text. "
                   "Give the exact URL and what you want to know.")
    parameters = {
        "type": "object",
        "properties": {
            "url": {"type": "string", "description": "URL (http, https, file) or local path.", "maxLength": 4096,
                    "minLength": 1},
            "query": {"type": "string", "description": "What to look for on the page.", "maxLength": 2000,
                      "default": ""},
        },
        "required": ["url"],
        "additionalProperties": False,
    }

    def __init__(self, config: BrowseConfig | None = None, timeout_s: float = 90.0, max_output_chars: int = 8000,
                 **overrides):
        self.config = resolve_config(BrowseConfig, config, overrides)
        super().__init__(timeout_s=timeout_s, max_output_chars=max_output_chars)

    def run(self, url: str, query: str = "") -> str:
        title, text = self.fetch_text(url.strip())
        if not text.strip():
            return f"Page: {url}\nTitle: {title}\nThe page has no readable text."
        header = f"Page: {url}\nTitle: {title or 'untitled'}\n"
        if self.config.summariser.configured:
            try:
                return header + self._summarise(text, query)
            except Exception as exc:  # noqa: BLE001 - fall back to extractive rather than fail the call
                header += (f"(summariser {self.config.summariser.describe()} failed: {exc}; "
                           f"extractive passages follow)\n")
        return header + self._extract(text, query)

    def fetch_text(self, url: str) -> tuple[str, str]:
        """(title, main text) of the page at `url`."""
        if self.config.page_store:
            store = self.config.page_store
            try:
                pages = _load_page_store(os.path.abspath(store), os.path.getmtime(store))
            except OSError as exc:
                raise ToolError(RUNTIME_ERROR, f"cannot read the page store {store}: {exc}") from None
            if _normalise_url(url) in pages:
                return html_to_text(pages[_normalise_url(url)])
        parsed = urllib.parse.urlparse(url)
        local = None
        if parsed.scheme == "file":
            local = resolve_local_path(urllib.parse.unquote(parsed.path), self.config.root)
        elif parsed.scheme == "" and url.strip():
            candidate = resolve_local_path(url, self.config.root)
            local = candidate if os.path.exists(candidate) else None
        if local is not None:
            path = local
            if not os.path.isfile(path):
                raise ToolError(NOT_FOUND, f"no such file: {path}")
            with open(path, "rb") as f:
                data = f.read(self.config.max_page_bytes + 1)
            return self._convert(data, os.path.splitext(path)[1].lower(), url)
        if parsed.scheme in ("http", "https"):
            if not self.config.allow_network:
                raise ToolError(NOT_FOUND, f"{url} is not in the page store and network access is disabled")
            return self._fetch_http(url)
        raise ToolError(NOT_FOUND, f"cannot open {url!r}: not in the page store, not a local file, not an http(s) URL")

    def _fetch_http(self, url: str) -> tuple[str, str]:
        headers = {"User-Agent": "Mozilla/5.0 (compatible; reagent-jax-browse/0.1)"}
        try:
            with httpx.stream("GET", url, timeout=self.config.fetch_timeout_s, follow_redirects=True,
                              headers=headers) as response:
                if response.status_code >= 400:
                    raise ToolError(NOT_FOUND, f"{url} answered HTTP {response.status_code}")
                data = bytearray()
                for block in response.iter_bytes():
                    data += block
                    if len(data) > self.config.max_page_bytes:
                        break
                content_type = response.headers.get("content-type", "")
        except httpx.HTTPError as exc:
            raise ToolError(NOT_FOUND, f"could not fetch {url}: {exc}") from None
        ext = ".pdf" if "pdf" in content_type else os.path.splitext(urllib.parse.urlparse(url).path)[1].lower()
        if "html" in content_type or "xml" in content_type or ext not in file_reader.CONVERTERS:
            ext = ".html"
        return self._convert(bytes(data), ext, url)

    def _convert(self, data: bytes, ext: str, url: str) -> tuple[str, str]:
        if ext in _HTML_EXTS or (ext not in file_reader.CONVERTERS and data.lstrip()[:1] == b"<"):
            return html_to_text(data.decode("utf-8", "replace"))
        text = file_reader.convert_bytes(data, ext or ".txt", url)
        return os.path.basename(urllib.parse.urlparse(url).path), text

    def _summarise(self, text: str, query: str) -> str:
        endpoint = self.config.summariser
        response = endpoint.client().chat.completions.create(
            model=endpoint.model, temperature=0.0, max_tokens=1024,
            messages=[{"role": "system", "content": _SUMMARY_PROMPT},
                      {"role": "user", "content": f"Query: {query or 'Summarise the page.'}\n\nPage text:\n"
                                                  f"{text[: self.config.max_summary_input_chars]}"}])
        answer = (response.choices[0].message.content or "").strip()
        return f"Answer to {query!r} from the page ({endpoint.model}):\n{answer}"

    def _extract(self, text: str, query: str) -> str:
        chunks = chunk_text(text, self.config.chunk_chars)
        picked: list[int] = []
        if query.strip():
            hits = retrieval.BM25Index.from_texts(chunks).search([query], self.config.top_chunks)[0]
            picked = sorted(int(doc["id"]) for doc, _ in hits)
        if not picked:
            note = "No passage matches the query; the start of the page follows:" if query.strip() else \
                "The start of the page:"
            budget, picked = self.config.start_chars, []
            for i, chunk in enumerate(chunks):
                if picked and budget - len(chunk) < 0:
                    break
                picked.append(i)
                budget -= len(chunk)
        else:
            note = f"Passages most relevant to {query!r} (extractive):"
        body = "\n\n".join(f"[{i + 1}/{len(chunks)}] {chunks[i]}" for i in picked)
        return f"{note}\n\n{body}"
