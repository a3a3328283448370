"""The `image2text` tool: a vision model's answer when one is configured, else OCR plus image facts.

Vision endpoint: any OpenAI-compatible chat server that accepts image_url parts
(REAGENT_VISION_BASE_URL, REAGENT_VISION_MODEL, REAGENT_VISION_API_KEY). Offline: tesseract OCR
(pytesseract; Debian package tesseract-ocr), size, mode and dominant colours.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import os

from reagent_jax.agent.tools.base import NOT_FOUND, RUNTIME_ERROR, UNSUPPORTED, Tool, ToolError, resolve_config
from reagent_jax.agent.tools.local_files import resolve_local_path, roots_from_env
from reagent_jax.agent.tools.remote_model import RemoteModel

_NAMED_COLOURS = {
    "black": (0, 0, 0), "white": (255, 255, 255), "grey": (128, 128, 128), "light grey": (200, 200, 200),
    "red": (220, 30, 30), "dark red": (128, 0, 0), "orange": (255, 140, 0), "yellow": (240, 220, 30),
    "green": (40, 170, 40), "dark green": (0, 90, 0), "cyan": (0, 200, 220), "blue": (30, 60, 220),
    "navy": (0, 0, 110), "purple": (130, 40, 160), "pink": (245, 150, 190), "brown": (130, 80, 30),
    "beige": (230, 215, 175),
}
_DEFAULT_QUESTION = "Describe this image in detail, including any text it contains."


def colour_name(rgb: tuple[int, int, int]) -> str:
    return min(_NAMED_COLOURS, key=lambda n: sum((a - b) ** 2 for a, b in zip(_NAMED_COLOURS[n], rgb)))


def dominant_colours(image, k: int = 3) -> list[tuple[str, str, float]]:
    """[(name, '#rrggbb', fraction)] of the k most common colours of a small quantised copy."""
    small = image.convert("RGB")
    small.thumbnail((96, 96))
    quantised = small.quantize(colors=8)
    palette = quantised.getpalette()
    counts = sorted(quantised.getcolors(), reverse=True)[:k]
    total = small.width * small.height
    out = []
    for count, index in counts:
        rgb = tuple(palette[3 * index: 3 * index + 3])
        out.append((colour_name(rgb), "#%02x%02x%02x" % rgb, count / total))
    return out


def ocr_text(image, lang: str = "eng") -> str:
    """Tesseract OCR; ToolError(not_configured-like) text when the binary is missing."""
    import pytesseract

    grey = image.convert("L")
    if min(grey.size) < 300:  # tesseract reads small text better when upscaled
        scale = 300 / min(grey.size)
        grey = grey.resize((int(grey.width * scale), int(grey.height * scale)))
    return pytesseract.image_to_string(grey, lang=lang).strip()


@dataclasses.dataclass(frozen=True)
class Image2TextConfig:
    vision: RemoteModel = RemoteModel()
    ocr: bool = True
    ocr_lang: str = "eng"
    max_side: int = 2048             # images sent to a vision model are downscaled to this
    max_pixels: int = 50_000_000     # refuse decompression bombs
    root: str | None = None          # readable folders (REAGENT_FILES_ROOT); see local_files

    @classmethod
    def from_env(cls, **overrides) -> "Image2TextConfig":
        values = dict(vision=RemoteModel.from_env("REAGENT_VISION"),
                      ocr_lang=os.environ.get("REAGENT_OCR_LANG", "eng"), root=roots_from_env())
        values.update(overrides)
        return cls(**values)


class Image2TextTool(Tool):
    name = "image2text"
    description = ("Look at a local image file and describe it or answer a question about it "
                   "(text in the image is transcribed).")
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Path of the image file.", "maxLength": 4096, "minLength": 1},
            "question": {"type": "string", "description": "What to find out from the image.", "maxLength": 2000,
                         "default": ""},
        },
        "required": ["path"],
        "additionalProperties": False,
    }

    def __init__(self, config: Image2TextConfig | None = None, timeout_s: float = 120.0,
                 max_output_chars: int = 8000, **overrides):
        self.config = resolve_config(Image2TextConfig, config, overrides)
        super().__init__(timeout_s=timeout_s, max_output_chars=max_output_chars)

    def _open(self, path: str):
        from PIL import Image

        if not os.path.isfile(path):
            raise ToolError(NOT_FOUND, f"no such file: {path}")
        Image.MAX_IMAGE_PIXELS = self.config.max_pixels
        try:
            image = Image.open(path)
            image.load()
        except Exception as exc:  # noqa: BLE001 - PIL raises many types for bad files
            raise ToolError(UNSUPPORTED, f"{path} is not a readable image: {type(exc).__name__}: {exc}") from None
        return image

    def run(self, path: str, question: str = "") -> str:
        image = self._open(resolve_local_path(path, self.config.root))
        if self.config.vision.configured:
            return self._ask_vision_model(image, question or _DEFAULT_QUESTION)
        return self._describe_offline(image, path, question)

    def _ask_vision_model(self, image, question: str) -> str:
        copy = image.convert("RGB")
        copy.thumbnail((self.config.max_side, self.config.max_side))
        buffer = io.BytesIO()
        copy.save(buffer, format="PNG")
        data_uri = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
        endpoint = self.config.vision
        try:
            response = endpoint.client().chat.completions.create(
                model=endpoint.model, temperature=0.0, max_tokens=1024,
                messages=[{"role": "user", "content": [{"type": "text", "text": question},
                                                       {"type": "image_url", "image_url": {"url": data_uri}}]}])
        except Exception as exc:  # noqa: BLE001 - network/API errors become a readable tool error
            raise ToolError(RUNTIME_ERROR, f"vision model {endpoint.describe()} failed: {exc}") from None
        return (response.choices[0].message.content or "").strip()

    def _describe_offline(self, image, path: str, question: str) -> str:
        lines = []
        if question:
            lines.append("(No vision model is configured: set REAGENT_VISION_BASE_URL and REAGENT_VISION_MODEL to "
                         "ask questions about images. Offline description follows.)")
        lines.append(f"Image {os.path.basename(path)}: {image.width}x{image.height} pixels, mode {image.mode}, "
                     f"format {image.format or 'unknown'}.")
        colours = ", ".join(f"{name} {hexcode} ({frac:.0%})" for name, hexcode, frac in dominant_colours(image))
        lines.append(f"Dominant colours: {colours}.")
        if self.config.ocr:
            try:
                text = ocr_text(image, self.config.ocr_lang)
                lines.append(f"Text in the image (OCR):\n{text}" if text else "No text was found in the image (OCR).")
            except Exception as exc:  # noqa: BLE001 - missing tesseract binary or language data
                lines.append(f"OCR unavailable ({type(exc).__name__}: {exc}); install the tesseract-ocr package.")
        return "\n".join(lines)
