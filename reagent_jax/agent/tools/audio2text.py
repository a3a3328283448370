"""The `audio2text` tool: transcription through an OpenAI-compatible /audio/transcriptions endpoint.

Audio is cut by ffmpeg (Debian package ffmpeg) into 16 kHz mono WAV segments of at most 30 s, the
input length of Whisper-style models, and the segment transcripts are joined. Configure with
REAGENT_ASR_BASE_URL, REAGENT_ASR_MODEL (default whisper-1) and REAGENT_ASR_API_KEY; without a base
URL every call returns a not_configured error (there is no offline speech recogniser).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
import wave

from reagent_jax.agent.tools.base import NOT_CONFIGURED, NOT_FOUND, RUNTIME_ERROR, Tool, ToolError, resolve_config
from reagent_jax.agent.tools.local_files import resolve_local_path, roots_from_env
from reagent_jax.agent.tools.remote_model import RemoteModel


def segment_audio(path: str, out_dir: str, segment_s: float = 30.0, sample_rate: int = 16000,
                  timeout_s: float = 120.0) -> list[str]:
    """Split `path` into 16-bit mono WAV files of at most `segment_s` seconds; returns them in order.

    ffmpeg decodes any format once to 16 kHz mono PCM; the cut is then exact to the sample
    (ffmpeg's segment muxer cuts at packet boundaries and can overshoot the limit).
    """
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        raise ToolError(NOT_CONFIGURED, "ffmpeg is not installed (Debian/Ubuntu: apt-get install ffmpeg)")
    if not os.path.isfile(path):
        raise ToolError(NOT_FOUND, f"no such file: {path}")
    decoded = os.path.join(out_dir, "decoded.wav")
    command = [ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error", "-y", "-i", path, "-vn", "-ac", "1",
               "-ar", str(sample_rate), "-c:a", "pcm_s16le", "-f", "wav", decoded]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ToolError(RUNTIME_ERROR, f"ffmpeg took longer than {timeout_s:g} s on {path}") from None
    if proc.returncode != 0:
        raise ToolError(RUNTIME_ERROR, f"ffmpeg could not decode {path}: {proc.stderr.strip()[-500:]}")
    segments = []
    with wave.open(decoded, "rb") as source:
        frames_per_segment = max(1, int(segment_s * source.getframerate()))
        while True:
            frames = source.readframes(frames_per_segment)
            if not frames:
                break
            segment = os.path.join(out_dir, f"segment_{len(segments):05d}.wav")
            with wave.open(segment, "wb") as sink:
                sink.setparams(source.getparams())
                sink.writeframes(frames)
            segments.append(segment)
    os.unlink(decoded)
    if not segments:
        raise ToolError(RUNTIME_ERROR, f"{path} contains no audio")
    return segments


@dataclasses.dataclass(frozen=True)
class Audio2TextConfig:
    asr: RemoteModel = RemoteModel()
    segment_s: float = 30.0
    language: str | None = None
    root: str | None = None          # readable folders (REAGENT_FILES_ROOT); see local_files

    @classmethod
    def from_env(cls, **overrides) -> "Audio2TextConfig":
        values = dict(asr=RemoteModel.from_env("REAGENT_ASR", default_model="whisper-1", timeout_s=120.0),
                      language=os.environ.get("REAGENT_ASR_LANGUAGE") or None, root=roots_from_env())
        values.update(overrides)
        return cls(**values)


class Audio2TextTool(Tool):
    name = "audio2text"
    description = "Transcribe speech in a local audio file (mp3, wav, m4a, flac, ogg, or a video's sound track)."
    parameters = {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "Path of the audio file.", "maxLength": 4096,
                                "minLength": 1}},
        "required": ["path"],
        "additionalProperties": False,
    }

    def __init__(self, config: Audio2TextConfig | None = None, timeout_s: float = 600.0,
                 max_output_chars: int = 12000, **overrides):
        self.config = resolve_config(Audio2TextConfig, config, overrides)
        super().__init__(timeout_s=timeout_s, max_output_chars=max_output_chars)

    def run(self, path: str) -> str:
        path = resolve_local_path(path, self.config.root)
        if not os.path.isfile(path):
            raise ToolError(NOT_FOUND, f"no such file: {path}")
        endpoint = self.config.asr
        if not endpoint.configured:
            raise ToolError(NOT_CONFIGURED, "no transcription backend is configured: set REAGENT_ASR_BASE_URL to "
                                            "an OpenAI-compatible server with /audio/transcriptions (and "
                                            "REAGENT_ASR_MODEL, REAGENT_ASR_API_KEY as needed)")
        with tempfile.TemporaryDirectory(prefix="reagent-audio-") as tmp:
            segments = segment_audio(path, tmp, self.config.segment_s)
            client = endpoint.client()
            texts = []
            for segment in segments:
                extra = {"language": self.config.language} if self.config.language else {}
                try:
                    with open(segment, "rb") as f:
                        result = client.audio.transcriptions.create(model=endpoint.model, file=f, **extra)
                except Exception as exc:  # noqa: BLE001 - API/network errors become a readable tool error
                    raise ToolError(RUNTIME_ERROR, f"transcription by {endpoint.describe()} failed: {exc}") from None
                texts.append((getattr(result, "text", None) or str(result)).strip())
        return (f"Transcript of {os.path.basename(path)} ({len(segments)} segment(s) of at most "
                f"{self.config.segment_s:g} s):\n" + " ".join(t for t in texts if t))
